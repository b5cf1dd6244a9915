"""platoon.elastic.tie: the elastic tie's rounds, in-process (a stand-in centre, group and
lighthouse): what a round keeps and sends, healing an anchor, refusals at the door, NaN."""


import numpy as np
import pytest

from platoon.errors import NonFiniteValues, QuorumBroken

from elastic_helpers import _Group, _NoLighthouse, _tie


def _sha256(arrays):
    from platoon.elastic.tie import _sha256
    return _sha256(arrays)


def _stepped(anchor, mean):
    """The anchor after DiLoCo's outer step (lr 0.7, momentum 0.9, fresh momentum)."""
    from platoon.node.tie import outer_step
    anchor = np.array(anchor, np.float32)
    outer_step(anchor, np.zeros_like(anchor), np.array(mean, np.float32), 0.7, 0.9)
    return anchor


def test_a_last_sync_landing_during_a_round_is_kept_and_handed_over_in_the_next():
    """The workers' last sync lands just after the round's snapshot, and the node is done
    before the round ends: that sync is neither erased nor taken for handed over; the next
    round sends it."""
    tie, centre, _ = _tie([1.0, 1.0], [0.0, 0.0])
    group = _Group(0, 1, mean=lambda move, among: move)

    def last_sync():
        centre.arrays[0] += 2.0
        tie.node_done()

    centre.lock.after_release = last_sync  # right after the snapshot
    tie._outer_round(group, [0])
    first = _stepped([0.0, 0.0], [1.0, 1.0])
    np.testing.assert_allclose(tie.anchor[0], first)
    np.testing.assert_allclose(centre.arrays[0], first + 2.0)  # the last sync kept
    assert not tie._handed_over  # its last move is not in any mean yet
    tie._outer_round(group, [0])
    assert tie._handed_over
    np.testing.assert_allclose(centre.arrays[0], tie.anchor[0])  # done: the centre is the anchor
    assert not np.allclose(tie.anchor[0], first)  # the last sync moved it


def test_a_rounds_moves_travel_as_one_message_per_dtype():
    """The moves of every centre array of one dtype go in one compressed mean (one all-gather
    a round, not one per array); each array's anchor steps by its own part of the mean."""
    from platoon.elastic.tie import _feedback_for
    tie, centre, _ = _tie([1.0, 1.0], [0.0, 0.0])
    centre.arrays = [np.full(2, 1.0, np.float32), np.full((2, 3), 2.0, np.float32),
                     np.full(4, 3.0, np.float32)]
    tie.anchor = [np.zeros_like(a) for a in centre.arrays]
    tie.velocity = [np.zeros_like(a) for a in centre.arrays]
    tie._feedback = _feedback_for(tie.anchor)
    calls = []

    def mean(move, among):
        calls.append(move.size)
        return move

    tie._outer_round(_Group(0, 1, mean=mean), [0])
    assert calls == [2 + 6 + 4]
    for anchor, value in zip(tie.anchor, (1.0, 2.0, 3.0)):
        np.testing.assert_allclose(anchor, _stepped(np.zeros(anchor.shape), value))


def test_repairing_an_anchor_keeps_a_sync_landing_during_the_repair():
    """A member whose anchor differs is repaired: its centre becomes the new anchor plus its
    workers' work since the old one, including a sync landing during the repair."""
    tie, centre, _ = _tie([1.0, 1.0], [0.0, 0.0])  # its workers moved it by 1
    new_anchor, new_velocity = np.array([5.0, 5.0], np.float32), np.zeros(2, np.float32)
    payload = np.frombuffer(new_anchor.tobytes() + new_velocity.tobytes(), np.uint8)
    group = _Group(1, 2, payload=payload)

    def sync():
        centre.arrays[0] += 2.0

    centre.lock.after_release = sync
    tie._heal(group, 0, 4, [1], _sha256([new_anchor, new_velocity]))
    np.testing.assert_allclose(tie.anchor[0], new_anchor)
    np.testing.assert_allclose(centre.arrays[0], new_anchor + 1.0 + 2.0)


def test_a_header_not_signed_with_the_jobs_secret_breaks_the_round_before_anything_applies():
    """Rank 1's header is signed with another secret (a process in a member's place in the
    group, which it found under the quorum's prefix): the round breaks on rank 0 before any
    decision, its anchor untouched; and an anchor received in a heal that does not match the
    source's signed sha256 is refused likewise."""
    from platoon.elastic.secret import sign_header
    tie, centre, _ = _tie([1.0, 1.0], [0.0, 0.0])

    def forged(own):  # rank 1 claims a far newer anchor, signed with the wrong secret
        body = own[:-32].copy()
        body[24:32] = np.frombuffer(np.int64(10 ** 6).tobytes(), np.uint8)  # round_no
        mac = sign_header(b"o" * 32, 7, "n0nce", 1, body.tobytes())
        return np.stack([own, np.concatenate([body, np.frombuffer(mac, np.uint8)])])

    with pytest.raises(QuorumBroken, match=r"node a \(rank 0 of quorum 7: a, b\): the round "
                                           r"header of rank 1 \(b\) is not signed with the "
                                           r"job's secret"):
        tie._group = _Group(0, 2, rows=forged)
        tie._round()
    assert tie.round_no == 3 and (tie.anchor[0] == 0.0).all()
    assert (centre.arrays[0] == 1.0).all()
    bad = np.frombuffer(np.full(2, 9.0, np.float32).tobytes() + bytes(8), np.uint8)
    with pytest.raises(QuorumBroken, match=r"the anchor received from rank 0 \(a\) does not "
                                           r"match the sha256 in its signed header"):
        tie._heal(_Group(1, 2, payload=bad), 0, 4, [1],
                  _sha256([np.full(2, 5.0, np.float32), np.zeros(2, np.float32)]))
    assert tie.round_no == 3 and (tie.anchor[0] == 0.0).all()


def test_nan_on_one_member_ends_that_member_and_breaks_the_round_for_the_others():
    """A round whose mean is refused for NaN or Inf on rank 1: rank 1 fails (its tie ends its
    node); the others drop the round as broken (they go on without it) and keep their
    error-feedback residuals."""
    refusal = NonFiniteValues("rank(s) [1] of 2 hold NaN or Inf", [1])
    healthy, _, _ = _tie([1.0, 1.0], [0.0, 0.0])
    healthy._feedback[0].residual[...] = 0.25
    with pytest.raises(QuorumBroken, match=r"node\(s\) b's centre holds NaN or Inf \(rank\(s\) "
                                           r"1 of quorum 7: a, b; training diverged there"):
        healthy._outer_round(_Group(0, 2, raises=refusal), [0, 1])
    assert (healthy._feedback[0].residual == 0.25).all() and healthy.round_no == 3
    diverged, _, _ = _tie([np.nan, 1.0], [0.0, 0.0])
    with pytest.raises(NonFiniteValues):
        diverged._outer_round(_Group(1, 2, raises=refusal), [0, 1])


def test_nan_at_the_first_round_ends_that_member_only():
    """The job's first round (the one that makes the anchor, sent losslessly) refused for NaN
    on rank 1: rank 1 fails (NonFiniteValues: its node ends); rank 0 drops the round
    (QuorumBroken naming b) and still has no anchor: it makes the first one without b."""
    refusal = NonFiniteValues("rank(s) [1] of 2 hold NaN or Inf", [1])
    healthy, _, _ = _tie([1.0, 1.0], [0.0, 0.0])
    healthy.anchor, healthy.round_no = None, -1
    with pytest.raises(QuorumBroken, match=r"node\(s\) b's centre holds NaN or Inf \(rank\(s\) "
                                           r"1 of quorum 7: a, b; training diverged there"):
        healthy._first_anchor(_Group(0, 2, raises=refusal))
    assert healthy.anchor is None and healthy.round_no == -1
    diverged, _, _ = _tie([np.nan, 1.0], [0.0, 0.0])
    diverged.anchor, diverged.round_no = None, -1
    with pytest.raises(NonFiniteValues):
        diverged._first_anchor(_Group(1, 2, raises=refusal))


def test_an_easgd_round_makes_the_anchor_the_mean_and_moves_each_centre_by_beta():
    """EASGD across nodes: the anchor becomes the members' mean centre (no outer momentum), and
    the centre moves toward it by beta from its snapshot, keeping a sync that lands during the
    round; a done member's centre stays where it is."""
    from platoon.node.tie import EASGDOuter
    tie, centre, _ = _tie([1.0, 3.0], [0.0, 0.0], outer=EASGDOuter(0.5))
    tie.tie.outer, tie.tie.beta = "easgd", 0.5

    def sync():
        centre.arrays[0] += 10.0

    centre.lock.after_release = sync  # lands just after the snapshot
    tie._outer_round(_Group(0, 2, mean=lambda move, among: move + 1.0), [0, 1])
    np.testing.assert_allclose(tie.anchor[0], [2.0, 4.0])  # the mean move from 0: 1+1, 3+1
    np.testing.assert_allclose(centre.arrays[0], [1.0 + 0.5 + 10.0, 3.0 + 0.5 + 10.0])
    assert (tie.velocity[0] == 0.0).all() and tie.round_no == 4
    done, centre, _ = _tie([1.0, 3.0], [0.0, 0.0], outer=EASGDOuter(0.5))
    done.tie.outer = "easgd"
    done._done.set()
    done._outer_round(_Group(0, 2, mean=lambda move, among: move + 1.0), [0, 1])
    np.testing.assert_allclose(centre.arrays[0], [1.0, 3.0])
    assert done._handed_over


def _others_header(settings=None, values=2, round_no=3, rank=1, anchor_digest=b"\1" * 32,
                   ready=2):
    """The packed, signed header (with _NoLighthouse's secret) of `rank` of _Group's quorum,
    with the job's settings unless `settings`, a centre of `values` float32 (`ready`: 2 it
    holds values, 1 awaits them), `round_no` and the sha256 of its anchor and momentum
    `anchor_digest`."""
    import hashlib

    from platoon.mpi import CentreTie
    from platoon.node.decision import RoundHeader, door_settings, layout_summary
    layout = [{"dtype": "float32", "shape": [values]}]
    header = RoundHeader(ready, False, False, round_no, 7, anchor_digest,
                         hashlib.sha256(repr(layout).encode()).digest(),
                         settings or door_settings(CentreTie(0.05, outer="diloco",
                                                             compress="float32")),
                         layout_summary(layout)).pack()
    quorum = _Group(rank, 2).quorum
    return np.frombuffer(header + _NoLighthouse().sign_header(quorum, rank, header), np.uint8)


def test_a_member_whose_codec_differs_is_refused_alone_and_the_others_drop_the_round():
    """Rank 1 of a quorum of two holds another codec (the job's anchor at round 9): rank 0,
    whose settings differ, is refused (NodeRefused naming --tie-compress and both values)
    before any payload travels; seen from a member holding the job's settings, the round is
    dropped (QuorumBroken naming the refused node), its anchor untouched."""
    from platoon.errors import NodeRefused
    from platoon.mpi import CentreTie
    from platoon.node.decision import door_settings
    tie, centre, _ = _tie([1.0, 1.0], [0.0, 0.0])
    job = _others_header(round_no=9, settings=door_settings(
        CentreTie(1.0, outer="diloco", compress="int8")))
    tie._group = _Group(0, 2, rows=lambda own: np.stack([own, job]))
    with pytest.raises(NodeRefused, match=r"node a is refused by the job's other nodes "
                                          r"\(quorum 7: a, b\): its --tie-compress float32 "
                                          r"where b has int8"):
        tie._round()
    assert tie.round_no == 3 and (centre.arrays[0] == 1.0).all()
    odd = _others_header(values=3, round_no=-1)  # b's model is another: refused, not a
    tie._group = _Group(0, 2, rows=lambda own: np.stack([own, odd]))
    with pytest.raises(QuorumBroken, match=r"node\(s\) b refused at the door \(quorum 7: a, "
                                           r"b\): b: its model differs from the job's: its "
                                           r"centre holds 1 array\(s\): 3 float32, where a "
                                           r"holds 1 array\(s\): 2 float32"):
        tie._round()
    assert tie.round_no == 3 and (tie.anchor[0] == 0.0).all()


def test_a_joiner_is_healed_and_takes_the_outer_step_in_the_same_round():
    """Rank 1 joins a quorum of two: its centre created (its workers await its values), no
    anchor. In its group's first round it takes rank 0's anchor and momentum (round 5) and,
    in the same round, the outer step from rank 0's move alone (its own is nothing yet: in
    the mean it would shrink the step by a half), so it trains from the new anchor at once;
    its first move goes in the next round's mean."""
    tie, centre, _ = _tie([9.0, 9.0], [0.0, 0.0])
    tie.anchor = tie.velocity = tie._feedback = None
    tie.round_no, tie.ctl.centre_ready = -1, False
    tie._awaiting.set()  # (`initial_centre` asked: its workers wait for the decision)
    anchor, velocity = np.array([5.0, 5.0], np.float32), np.zeros(2, np.float32)
    source = _others_header(round_no=5, rank=0, anchor_digest=_sha256([anchor, velocity]))
    payload = np.frombuffer(anchor.tobytes() + velocity.tobytes(), np.uint8)
    means = []

    def mean(move, among):
        means.append((move.copy(), list(among)))
        return np.ones_like(move)  # rank 0's move: 1.0 each

    tie._group = _Group(1, 2, rows=lambda own: np.stack([source, own]), payload=payload,
                        mean=mean)
    assert not tie._round()
    assert tie.heals == 1 and tie.healed_from == "a" and tie._decided.is_set()
    assert len(means) == 1 and means[0][1] == [0]  # rank 0's move alone
    assert tie.round_no == 6 and tie.sent_rounds == 0 and tie.first_contribution_s is None
    expected = _stepped(anchor, [1.0, 1.0])
    np.testing.assert_allclose(tie.anchor[0], expected)
    np.testing.assert_allclose(centre.arrays[0], expected)


def _healed_a_joiner(tie, rank, source, payload):
    """`tie`, rank `rank` of a quorum of two with rank 1 a joiner (no anchor), makes the round
    that heals it from `source` (rank 0's header) with rank 0's move in its outer round; its
    pace is then 1000 s."""
    import time

    from platoon.node.tie import CentreTie
    tie._group = _Group(rank, 2, payload=payload, mean=lambda move, among: np.ones_like(move),
                        rows=lambda own: np.stack([source, own] if rank else [own, joiner]))
    joiner = _others_header(round_no=-1, rank=1, ready=1, anchor_digest=bytes(32))
    assert not tie._round()
    tie.tie = CentreTie(1000.0, outer="diloco", compress="float32")
    tie._last_start = time.monotonic()


def test_after_a_joiners_heal_the_next_round_comes_once_its_workers_synced_not_at_the_pace():
    """The round that heals a joiner is followed by the joiner's first contributing round as
    soon as its workers synced once from the anchor: the joiner waits for that sync (not its
    1000 s pace), the other members start that round at once (and wait in it for the
    joiner)."""
    import threading

    anchor, velocity = np.array([5.0, 5.0], np.float32), np.zeros(2, np.float32)
    source = _others_header(round_no=5, rank=0, anchor_digest=_sha256([anchor, velocity]))
    payload = np.frombuffer(anchor.tobytes() + velocity.tobytes(), np.uint8)
    joiner, centre, _ = _tie([9.0, 9.0], [0.0, 0.0])
    joiner.anchor = joiner.velocity = joiner._feedback = None
    joiner.round_no, joiner.ctl.centre_ready = -1, False
    joiner._awaiting.set()
    _healed_a_joiner(joiner, 1, source, payload)
    assert joiner.heals == 1 and joiner.first_contribution_s is None
    waiting = threading.Thread(target=joiner._wait_for_round, daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # no sync yet: it waits
    joiner.ctl.progress["syncs"] += 1  # its workers' first sync from the anchor
    waiting.join(10)
    assert not waiting.is_alive()

    member, _, _ = _tie([1.0, 1.0], [0.0, 0.0])
    member.round_no = 5
    member.anchor, member.velocity = [anchor.copy()], [velocity.copy()]
    _healed_a_joiner(member, 0, None, payload)
    assert member.round_no == 6
    waiting = threading.Thread(target=member._wait_for_round, daemon=True)
    waiting.start()
    waiting.join(10)
    assert not waiting.is_alive()  # at once
    waiting = threading.Thread(target=member._wait_for_round, daemon=True)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # the round after: its pace again
    member.halt(5)
    waiting.join(10)


def test_a_member_waiting_for_its_pace_leaves_at_once_when_it_hears_of_a_newer_quorum():
    """A member whose next round is 1000 s away (its pace) hears of a quorum newer than its
    group's (a joiner's): its wait for the round ends at once (in that round every member
    leaves for the newer quorum), not at its pace."""
    import threading
    import time

    from platoon.elastic import Quorum
    from platoon.node.tie import CentreTie

    class Heard(_NoLighthouse):
        newest = None

        def current_quorum(self):
            return self.newest

    tie, _, _ = _tie([1.0, 1.0], [0.0, 0.0])
    tie.tie = CentreTie(1000.0, outer="diloco", compress="float32")
    tie.client = client = Heard()
    tie._group, tie._group_rounds, tie._last_start = _Group(0, 2), 1, time.monotonic()
    waiting = threading.Thread(target=tie._wait_for_round, daemon=True)
    waiting.start()
    client.newest = Quorum(8, ("a", "b", "c"), ("h:0", "h:1", "h:2"))
    waiting.join(10)
    assert not waiting.is_alive()
