"""platoon.elastic: the lighthouse's quorums, its secret, and the gloo data plane per quorum.

Real processes on 127.0.0.1: a lighthouse (python -m platoon.elastic.lighthouse) and nodes
(tests/procs/elastic_node.py), killed with -9, stopped and continued; a 1 s heartbeat timeout.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from platoon.elastic import MembershipSettings, Quorum, generate_secret, load_secret, wire
from platoon.elastic.lighthouse import Lighthouse
from platoon.elastic.quorum import Membership
from platoon.errors import NonFiniteValues, PlatoonError, QuorumBroken, QuorumTimeout

from helpers import PROCS, Proc, platoon_segments, wait_until

NODE = os.path.join(PROCS, "elastic_node.py")
WORKER = os.path.join(PROCS, "elastic_worker.py")
TIMEOUT_S = 1.0  # the lighthouse's heartbeat timeout in these tests
GRACE_S = 0.3
SLACK_S = 3.0  # scheduling on a loaded machine: python startup, 100 ms heartbeats, ticks
QUORUM = r"lighthouse: quorum (\d+): (.*)$"
# what srun or mpiexec gives a node started one per host
MPI_RANK_VARIABLES = {"PMI_RANK": "1", "PMI_SIZE": "3", "OMPI_COMM_WORLD_SIZE": "3",
                      "RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1"}


# --- pure logic ---------------------------------------------------------------------------
def test_membership_issues_after_grace_and_drops_the_silent():
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=1.0, join_grace_s=0.5))
    m.heartbeat("b", "h:2", 0, now=0.0)
    assert m.tick(0.1) is None  # one node: fewer than min_nodes
    m.heartbeat("a", "h:1", 0, now=0.2)
    assert m.tick(0.3) is None  # the grace window for joiners
    q = m.tick(0.8)
    assert q == Quorum(1, ("a", "b"), ("h:1", "h:2")) and q.rank_of("b") == 1
    assert m.tick(0.9) is None  # nothing changed
    m.heartbeat("a", "h:1", 0, now=1.5)
    assert m.tick(1.6) is None  # b silent 1.6 s, but 1 node < min_nodes: quorum 1 stays
    m.heartbeat("c", "h:3", 7, now=1.7)  # c saw quorum 7 (a lighthouse before a restart)
    assert m.tick(1.8) is None
    assert m.tick(2.4) == Quorum(8, ("a", "c"), ("h:1", "h:3"))
    m.leave("c")
    assert m.tick(2.45) is None  # a alone
    with pytest.raises(ValueError, match="node 'z' is not in quorum 8"):
        m.quorum.rank_of("z")


def test_a_member_whose_group_broke_gets_a_new_id_for_the_same_members():
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=5.0, join_grace_s=0.1))
    m.heartbeat("a", "h:1", 0, now=0.0)
    m.heartbeat("b", "h:2", 0, now=0.0)
    assert m.tick(0.05) is None
    first = m.tick(0.2)
    m.heartbeat("a", "h:1", first.id, now=0.3, broken=first.id - 1)  # an old quorum: ignored
    assert m.tick(0.5) is None
    m.heartbeat("a", "h:1", first.id, now=0.6, broken=first.id)
    assert m.tick(0.65) is None  # the grace window
    assert m.tick(0.8) == Quorum(first.id + 1, ("a", "b"), ("h:1", "h:2"))
    m.heartbeat("a", "h:1", first.id, now=0.9, broken=first.id)  # stale: no third id
    assert m.tick(1.2) is None


def test_a_member_the_others_cannot_reach_is_out_of_the_quorums_until_it_moves():
    """c's data plane is unreachable from a and b (its --host an address only it sees): once
    either reports it, c is out of the next quorum (and told why); a reporter that names
    every other member is not counted; c back from another address, or after
    UNREACHABLE_FOR_S, is in again."""
    from platoon.elastic.quorum import UNREACHABLE_FOR_S
    m = Membership(MembershipSettings(min_nodes=2, heartbeat_timeout_s=1e9, join_grace_s=0.1))
    for name in "abc":
        m.heartbeat(name, "10.0.0.%s:1" % name, 0, now=0.0, incarnation=name)
    m.tick(0.0)
    first = m.tick(0.2)
    assert first.members == ("a", "b", "c")
    m.heartbeat("c", "10.0.0.c:1", 1, now=0.3, incarnation="c", unreachable=["a", "b"])
    assert m.tick(0.4) is None and m.tick(0.6) is None  # c names everyone: not counted
    m.heartbeat("a", "10.0.0.a:1", 1, now=0.7, incarnation="a", unreachable=["c", "zz"])
    assert m.tick(0.75) is None  # the grace window
    second = m.tick(0.9)
    assert second.members == ("a", "b")
    assert "data plane at 10.0.0.c:1 was unreachable from a: give its --host an address the " \
           "other nodes reach" in m.excluded(1.0)["c"]
    assert m.tick(5.0) is None  # c stays out
    m.heartbeat("c", "10.0.0.9:1", 1, now=5.1, incarnation="c")  # another address
    m.tick(5.1)
    assert m.tick(5.3).members == ("a", "b", "c")
    m.heartbeat("b", "10.0.0.b:1", 3, now=6.0, incarnation="b", unreachable=["c"])
    m.tick(6.0)
    assert m.tick(6.2).members == ("a", "b")
    m.tick(6.2 + UNREACHABLE_FOR_S)
    assert m.tick(6.4 + UNREACHABLE_FOR_S).members == ("a", "b", "c")  # tried again


def test_a_client_reporting_its_group_broken_gets_both_members_a_new_quorum():
    import threading

    from platoon.elastic import LighthouseClient
    secret, stopping = b"s" * 32, threading.Event()
    settings = MembershipSettings(min_nodes=2, heartbeat_timeout_s=5.0, join_grace_s=0.05)
    with Lighthouse(settings, "127.0.0.1:0", secret) as lighthouse:
        serving = threading.Thread(target=lighthouse.serve, args=(stopping.is_set,))
        serving.start()
        try:
            with LighthouseClient(lighthouse.address, "a", "h:1", secret=secret) as a, \
                    LighthouseClient(lighthouse.address, "b", "h:2", secret=secret) as b:
                first = a.wait_for_quorum(timeout_s=10)
                a.report_broken(first.id)
                second = b.wait_for_quorum(timeout_s=10, newer_than=first.id)
                assert second.members == first.members == ("a", "b")
                assert a.wait_for_quorum(timeout_s=10, newer_than=first.id) == second
        finally:
            stopping.set()
            serving.join(10)


def test_a_registered_node_outlives_a_false_lighthouse_on_its_port():
    """Once registered, a node takes a reply that fails its check (here another process bound
    the lighthouse's port while it is down and answers refusals) for an unreachable
    lighthouse: it keeps its quorum, and raises ElasticAuthError only once such replies have
    lasted refused_for_s."""
    import threading

    import zmq

    from platoon.elastic import LighthouseClient
    from platoon.errors import ElasticAuthError
    secret, stopping = b"s" * 32, threading.Event()
    settings = MembershipSettings(min_nodes=1, heartbeat_timeout_s=5.0, join_grace_s=0.05)
    with Lighthouse(settings, "127.0.0.1:0", secret) as lighthouse:
        serving = threading.Thread(target=lighthouse.serve, args=(stopping.is_set,))
        serving.start()
        client = LighthouseClient(lighthouse.address, "a", "h:1", secret=secret,
                                  heartbeat_interval_s=0.05, request_timeout_s=0.2,
                                  refused_for_s=2.0)
        try:
            first = client.wait_for_quorum(timeout_s=10)
        finally:
            stopping.set()
            serving.join(10)
    context = zmq.Context()
    false = context.socket(zmq.REP)
    false.linger = 0
    try:
        false.bind("tcp://" + lighthouse.address)
        answered = 0
        while answered < 2:  # at least one after a new connection
            assert false.poll(5000), "the node sent nothing to the false lighthouse"
            false.recv_multipart()
            false.send_multipart(list(wire.refusal("x")))
            answered += 1
        assert client.current_quorum() == first and not client.reachable
        with pytest.raises(ElasticAuthError, match="the lighthouse at .* refused it: x"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if false.poll(100):
                    false.recv_multipart()
                    false.send_multipart(list(wire.refusal("x")))
                client.current_quorum()
    finally:
        client.close()
        false.close(linger=0)
        context.term()


def test_a_second_process_under_a_live_nodes_name_waits_until_the_first_is_gone():
    """Two processes heartbeat as node c (two nodes given one --name): the second is refused
    while the first is live (no quorum flapping between their addresses), and taken in once
    the first leaves or times out (a node restarted under its name)."""
    m = Membership(MembershipSettings(min_nodes=1, heartbeat_timeout_s=1.0, join_grace_s=0.0))
    assert m.heartbeat("c", "h:1", 0, now=0.0, incarnation="first")
    first = m.tick(0.1)
    assert not m.heartbeat("c", "h:2", 0, now=0.2, incarnation="second")
    m.leave("c", incarnation="second")  # not its name to give up
    assert m.tick(0.3) is None and m.quorum.addresses == ("h:1",)
    assert m.heartbeat("c", "h:2", 0, now=1.5, incarnation="second")  # the first timed out
    assert m.tick(1.6) == Quorum(first.id + 1, ("c",), ("h:2",))
    import threading

    from platoon.elastic import LighthouseClient
    secret, stopping = b"s" * 32, threading.Event()
    settings = MembershipSettings(min_nodes=1, heartbeat_timeout_s=5.0, join_grace_s=0.05)
    with Lighthouse(settings, "127.0.0.1:0", secret) as lighthouse:
        serving = threading.Thread(target=lighthouse.serve, args=(stopping.is_set,))
        serving.start()
        try:
            with LighthouseClient(lighthouse.address, "c", "h:1", secret=secret) as one:
                assert one.wait_for_quorum(timeout_s=10).addresses == ("h:1",)
                with LighthouseClient(lighthouse.address, "c", "h:2", secret=secret) as two:
                    deadline = time.monotonic() + 10
                    while not two.name_taken:
                        assert time.monotonic() < deadline
                        time.sleep(0.01)
                    assert two.current_quorum() is None  # it is told of no quorum
                    one.close()  # leaves: the name is free
                    assert two.wait_for_quorum(timeout_s=10).addresses == ("h:2",)
                    assert not two.name_taken
        finally:
            stopping.set()
            serving.join(10)


def test_membership_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="min_nodes must be an integer >= 1"):
        MembershipSettings(min_nodes=0)
    with pytest.raises(ValueError, match="heartbeat_timeout_s must be > 0"):
        MembershipSettings(heartbeat_timeout_s=0)


def test_secret_file_must_exist_be_private_and_long(tmp_path, monkeypatch):
    monkeypatch.delenv("PLATOON_ELASTIC_SECRET_FILE", raising=False)
    with pytest.raises(PlatoonError, match="needs its secret: give --secret-file"):
        load_secret()
    path = generate_secret(str(tmp_path / "secret"))
    assert len(load_secret(path)) == 64
    os.chmod(path, 0o644)
    with pytest.raises(PlatoonError, match="readable by other users; run chmod 600"):
        load_secret(path)
    short = tmp_path / "short"
    short.write_text("abc")
    os.chmod(short, 0o600)
    with pytest.raises(PlatoonError, match="holds 3 characters; use at least 16, random"):
        load_secret(str(short))


def test_a_replayed_or_forged_request_changes_nothing():
    secret, other = b"s" * 32, b"o" * 32
    with Lighthouse(MembershipSettings(), "127.0.0.1:0", secret) as lighthouse:
        def send(peer, challenge, key=secret, op="heartbeat", node="a"):
            body, mac = wire.request(key, op, node, "h:1", 0, challenge)
            return wire.read_reply(key, mac, *lighthouse.handle(peer, body, mac, 1.0)), body, mac

        first, _, _ = send(b"p1", "")
        assert not first["done"] and first["challenge"]  # a new connection gets a challenge
        answer, body, mac = send(b"p1", first["challenge"])
        assert answer["done"] and answer["error"] is None
        assert lighthouse.membership.live(1.0) == ["a"]
        lighthouse.membership.leave("a")
        for peer in (b"p1", b"p2"):  # replayed on its own connection, or on another
            replayed = wire.read_reply(secret, mac, *lighthouse.handle(peer, body, mac, 1.0))
            assert not replayed["done"]
        forged, _, _ = send(b"p3", "", key=other)
        assert "signature does not match the lighthouse's secret" in forged["error"]
        long_body = b"x" * (wire.MAX_BODY + 1)  # said as too long, not as a bad signature
        assert wire.read_request(secret, long_body, wire.request(secret, "leave", "a", "h:1", 0,
                                                                  "")[1]) \
            == (None, "request of 4097 bytes, over the limit of 4096")
        assert lighthouse.membership.live(1.0) == []


def test_the_lighthouse_and_the_client_load_no_torch():
    import subprocess
    import sys
    code = ("import sys, platoon.elastic, platoon.elastic.lighthouse; "
            "print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30).stdout.strip() == "[]"


# --- the elastic tie's decisions, in-process (a stand-in centre, group and lighthouse) -------
class _Lock:
    """The centre's lock; `after_release()` runs once, at the next release (a worker's sync
    that was waiting for the lock lands then)."""

    def __init__(self):
        self.after_release = None

    def acquire(self, timeout_s=None):
        return True

    def release(self):
        hook, self.after_release = self.after_release, None
        if hook is not None:
            hook()


class _Centre:
    def __init__(self, values):
        self.arrays = [np.array(values, np.float32)]
        self.layout = [{"dtype": "float32", "shape": [len(values)]}]
        self.lock = _Lock()


class _Controller:
    def __init__(self, values):
        self.shared_centre, self.centre_ready = _Centre(values), True


class _Group:
    """A quorum's group as this member sees it: `mean(move, among)` makes each round's mean,
    `raises` (if set) is what every collective raises."""

    def __init__(self, rank, size, mean=None, raises=None, payload=None, rows=None):
        names = tuple("abcdefgh"[:size])
        self.quorum = Quorum(7, names, tuple("h:%d" % i for i in range(size)), "n0nce")
        self.rank, self.size, self.mean, self.raises = rank, size, mean, raises
        self.payload, self.rows = payload, rows  # rows(own message): what the all-gather gives

    def all_gather_bytes(self, message):
        return self.rows(np.array(message, np.uint8))

    def compressed_mean(self, array, codec, feedback=None, out=None, among=None):
        if self.raises is not None:
            raise self.raises
        return self.mean(np.array(array, np.float32), among), 0

    def broadcast_bytes(self, message, root):
        return message if self.rank == root else self.payload

    def close(self):
        pass


class _NoLighthouse:
    """A lighthouse client that never hears of a quorum (it signs as the real one, with the
    secret b"s" * 32)."""

    secret = b"s" * 32

    def sign_header(self, quorum, rank, header):
        from platoon.elastic.secret import sign_header
        return sign_header(self.secret, quorum.id, quorum.nonce, rank, header)

    def header_signed(self, quorum, rank, header, mac):
        return self.sign_header(quorum, rank, header) == mac

    def wait_for_quorum(self, timeout_s=None, newer_than=0):
        time.sleep(min(timeout_s or 0.05, 0.05))
        raise QuorumTimeout("no quorum (test)")

    def current_quorum(self):
        return None

    def report_broken(self, quorum_id):
        pass

    def close(self):
        pass


def _tie(values, anchor, *, running=False, **settings):
    """An ElasticTie (float32 moves, DiLoCo lr 0.7, momentum 0.9) over a stand-in centre
    holding `values`, its anchor `anchor` (round 3); its thread ended at once unless
    `running` (then its lighthouse never forms a quorum)."""
    from platoon.elastic.tie import ElasticTie
    from platoon.node.compress import ErrorFeedback
    from platoon.node.tie import CentreTie
    ctl = _Controller(values)
    if not running:
        ctl.shared_centre = None  # the thread waits for it: halted, it ends at once
    failures = []
    tie = ElasticTie(CentreTie(0.05, outer="diloco", compress="float32"), _NoLighthouse, "a",
                     ctl, 1.0, failures.append, **settings)
    if not running:
        assert tie.halt(5)
        tie._halt.clear(), tie._done.clear()
        ctl.shared_centre = _Centre(values)
        tie.client = _NoLighthouse()
    tie.anchor = [np.array(anchor, np.float32)]
    tie.velocity = [np.zeros(len(anchor), np.float32)]
    tie._feedback = [ErrorFeedback(len(anchor), np.dtype(np.float32))]
    tie.round_no = 3
    return tie, ctl.shared_centre, failures


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


def test_each_quorum_meets_under_its_own_random_prefix():
    """The lighthouse gives each quorum a random nonce (signed in its reply), and its group
    meets under a store prefix holding it: unguessable without the secret, and two quorums of
    one id (a lighthouse restarted before any node reported) never share a group."""
    from platoon.elastic.dataplane import store_prefix
    quorums = []
    for _ in range(2):  # a lighthouse, then another started afresh
        m = Membership(MembershipSettings(min_nodes=1, join_grace_s=0.0))
        m.heartbeat("a", "h:1", 0, now=0.0)
        quorums.append(m.tick(0.1))
    first, again = quorums
    assert first.id == again.id == 1 and len(first.nonce) == 32
    assert store_prefix(first) != store_prefix(again)
    assert store_prefix(first) == "platoon/quorum/1/%s/" % first.nonce
    assert Quorum.from_wire(first.to_wire()).nonce == first.nonce


def test_nan_on_one_member_ends_that_member_and_breaks_the_round_for_the_others():
    """A round whose mean is refused for NaN or Inf on rank 1: rank 1 fails (its tie ends its
    node); the others drop the round as broken (they go on without it) and keep their
    error-feedback residuals."""
    refusal = NonFiniteValues("rank(s) [1] of 2 hold NaN or Inf", [1])
    healthy, _, _ = _tie([1.0, 1.0], [0.0, 0.0])
    healthy._feedback[0].residual[...] = 0.25
    with pytest.raises(QuorumBroken, match=r"the centre of node\(s\) b \(rank\(s\) 1 of "
                                           r"quorum 7: a, b\) holds NaN or Inf"):
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
    with pytest.raises(QuorumBroken, match=r"the centre of node\(s\) b \(rank\(s\) 1 of "
                                           r"quorum 7: a, b\) holds NaN or Inf"):
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
    tie, centre, _ = _tie([1.0, 3.0], [0.0, 0.0])
    tie.tie.outer, tie.tie.beta = "easgd", 0.5

    def sync():
        centre.arrays[0] += 10.0

    centre.lock.after_release = sync  # lands just after the snapshot
    tie._outer_round(_Group(0, 2, mean=lambda move, among: move + 1.0), [0, 1])
    np.testing.assert_allclose(tie.anchor[0], [2.0, 4.0])  # the mean move from 0: 1+1, 3+1
    np.testing.assert_allclose(centre.arrays[0], [1.0 + 0.5 + 10.0, 3.0 + 0.5 + 10.0])
    assert (tie.velocity[0] == 0.0).all() and tie.round_no == 4
    done, centre, _ = _tie([1.0, 3.0], [0.0, 0.0])
    done.tie.outer = "easgd"
    done._done.set()
    done._outer_round(_Group(0, 2, mean=lambda move, among: move + 1.0), [0, 1])
    np.testing.assert_allclose(centre.arrays[0], [1.0, 3.0])
    assert done._handed_over


def _others_header(settings=None, values=2, round_no=3):
    """The packed, signed header (with _NoLighthouse's secret) of rank 1 of _Group's quorum,
    with the job's settings unless `settings`, a centre of `values` float32 and `round_no`."""
    import hashlib

    from platoon.elastic.decision import RoundHeader, door_settings, layout_summary
    from platoon.mpi import CentreTie
    layout = [{"dtype": "float32", "shape": [values]}]
    header = RoundHeader(2, False, False, round_no, 7, b"\1" * 32,
                         hashlib.sha256(repr(layout).encode()).digest(),
                         settings or door_settings(CentreTie(0.05, outer="diloco",
                                                             compress="float32")),
                         layout_summary(layout)).pack()
    quorum = _Group(1, 2).quorum
    return np.frombuffer(header + _NoLighthouse().sign_header(quorum, 1, header), np.uint8)


def test_a_member_whose_codec_differs_is_refused_alone_and_the_others_drop_the_round():
    """Rank 1 of a quorum of two holds another codec (the job's anchor at round 9): rank 0,
    whose settings differ, is refused (NodeRefused naming --tie-compress and both values)
    before any payload travels; seen from a member holding the job's settings, the round is
    dropped (QuorumBroken naming the refused node), its anchor untouched."""
    from platoon.elastic.decision import door_settings
    from platoon.errors import NodeRefused
    from platoon.mpi import CentreTie
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


def test_an_elastic_workers_final_evaluation_waits_past_its_timeout_for_the_final_round(
        serve):
    """An elastic node's last worker waits for the final round, which comes once the other
    nodes are done (here 1 s after this one), however short its own timeout."""
    from platoon import EASGD, Controller, Worker
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie

    class SlowFinal(ElasticLink):  # the other nodes finish 1 s after this one
        done_at = None

        def start(self, controller):
            pass

        def trained(self):
            self.done_at = time.monotonic()
            return True

        def final_centre(self):
            return None if time.monotonic() < self.done_at + 1.0 else True

        def finish(self):
            pass

    link = SlowFinal(1, None, "a", CentreTie(1.0, outer="diloco"), 5.0, print)
    ctl = Controller(control_port=0, num_workers=1, node_link=link)
    serve(ctl)
    with Worker(ctl.control_port, timeout_s=0.3) as w:
        assert w.elastic_node == "a"
        w.init_shared_params([np.zeros(3, np.float32)], EASGD(0.5))
        assert w.final_evaluation(lambda: {"loss": 1.5}) == {"loss": 1.5}


def test_a_done_node_whose_group_makes_no_round_gives_up_the_final_round_in_time():
    """Node a is done (handed over), and then no quorum comes (its peer died, too few nodes
    for --min-nodes): after final_timeout_s without a round it ends, keeping its centre (the
    last anchor), and does not evaluate it as the agreed one."""
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    tie, centre, failures = _tie([2.0, 2.0], [2.0, 2.0], running=True, final_timeout_s=0.3)
    tie._handed_over = True
    link = ElasticLink(1, None, "a", CentreTie(1.0, outer="diloco"), 1.0, print)
    link._tie_thread = tie
    started = time.monotonic()
    link.finish()  # returns: the node saves its centre and ends
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_S
    assert tie.gave_up and tie.final.is_set() and not failures
    assert link.final_centre() is False  # not the agreed centre: no one evaluates it
    np.testing.assert_array_equal(centre.arrays[0], [2.0, 2.0])
    assert "no final round within 0.3 s: it kept its own centre" in tie.summary()


def test_a_node_serves_on_while_its_tie_decides_where_the_centre_starts(serve):
    """A node's first init_shared_params waits for its tie to decide whether a live peer
    gives the centre's first values (here none comes: no quorum, 1 s): meanwhile its
    controller serves (another worker registers within its 0.3 s timeout), and the waiting
    worker, however short its own timeout, is answered once the tie has decided."""
    import threading

    from platoon import EASGD, Controller, Worker
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    failures, outcome = [], {}
    link = ElasticLink(2, _NoLighthouse, "a", CentreTie(0.05, outer="diloco",
                                                        compress="float32"),
                       0.5, failures.append, final_timeout_s=0.3)
    ctl = Controller(control_port=0, num_workers=2, node_link=link)
    serve(ctl)

    def first_worker():
        try:
            with Worker(ctl.control_port, timeout_s=0.3) as w:
                started = time.monotonic()
                w.init_shared_params([np.full(3, 7.0, np.float32)], EASGD(0.5))
                outcome["first"] = (w.is_first, time.monotonic() - started)
        except Exception as exc:
            outcome["error"] = exc

    waiting = threading.Thread(target=first_worker)
    waiting.start()
    try:
        deadline = time.monotonic() + 10
        while link.tie_thread is None or not link.tie_thread._awaiting.is_set():
            assert time.monotonic() < deadline and waiting.is_alive(), outcome
            time.sleep(0.01)
        with Worker(ctl.control_port, timeout_s=0.3) as other:  # registered meanwhile
            waiting.join(10)
            assert "error" not in outcome, outcome["error"]
            is_first, took = outcome["first"]
            assert is_first and took >= 0.9  # its workers write the first values
            params = [np.zeros(3, np.float32)]
            other.init_shared_params(params, EASGD(0.5))
            assert not other.is_first and (params[0] == 7.0).all()
    finally:
        waiting.join(10)
    assert not failures


# --- real processes ---------------------------------------------------------------------------
def _in_netns(netns):
    """Proc arguments that run the rest of the command in network namespace `netns` (the same
    pid: python execs `ip netns exec`, which execs python)."""
    if netns is None:
        return []
    return ["-c", "import os, sys; os.execvp('ip', ['ip', 'netns', 'exec', %r, sys.executable]"
                  " + sys.argv[1:])" % netns]


@pytest.fixture
def job(tmp_path):
    """Starts a lighthouse and nodes sharing one secret; kills them all at teardown."""
    started = []
    env = {"PLATOON_ELASTIC_SECRET_FILE": generate_secret(str(tmp_path / "secret"))}

    class Job:
        address = None

        def lighthouse(self, min_nodes, port=0, host="127.0.0.1", netns=None):
            proc = Proc(_in_netns(netns) + [
                "-m", "platoon.elastic.lighthouse", "--min-nodes", str(min_nodes),
                "--heartbeat-timeout-s", str(TIMEOUT_S), "--join-grace-s", str(GRACE_S),
                "--bind", "%s:%d" % (host, port)], env=env)
            started.append(proc)
            match, _ = proc.wait_for_match(r"lighthouse: serving on tcp://(\S+) ")
            self.address = match.group(1)
            return proc

        def node(self, name, *args, secret_file=None):
            node_env = dict(env, PLATOON_ELASTIC_SECRET_FILE=secret_file) if secret_file \
                else env
            proc = Proc([NODE, self.address, name] + [str(a) for a in args], env=node_env)
            started.append(proc)
            return proc

        def runner(self, name, *worker_args, checkpoint=None, host="127.0.0.1", netns=None,
                   node_args=()):
            """python -m platoon.elastic.node with one worker of elastic_worker.py (in network
            namespace `netns`, on its address `host`, if given; `node_args`: more options of
            the node), started as if by srun or mpiexec (MPI's and torchrun's rank variables
            set: its workers must not see them)."""
            node_env = dict(env, **MPI_RANK_VARIABLES)
            if checkpoint:
                node_env["PLATOON_CHECKPOINT_PATH"] = str(checkpoint)
            proc = Proc(_in_netns(netns) + [
                "-m", "platoon.elastic.node", "--join", self.address, "--name", name,
                "--host", host, "--tie-every-s", "0.2", "--tie-timeout-s", "3"]
                + [str(a) for a in node_args] + ["--", WORKER]
                + [str(a) for a in worker_args], env=node_env)
            started.append(proc)
            return proc

    yield Job()
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped process dies only once continued
        except ProcessLookupError:
            pass
        proc.kill()


def quorum_of(proc, members, start=0, timeout=10.0):
    """(id, line index) of the lighthouse's first quorum of exactly `members` from `start`."""
    deadline = time.monotonic() + timeout
    while True:
        match, index = proc.wait_for_match(QUORUM, max(0.01, deadline - time.monotonic()),
                                           start)
        if match.group(2) == ", ".join(members):
            return int(match.group(1)), index
        start = index + 1


def test_first_quorum_holds_all_three(job):
    lighthouse = job.lighthouse(min_nodes=3)
    nodes = [job.node(name) for name in ("a", "b", "c")]
    assert quorum_of(lighthouse, ["a", "b", "c"])[0] == 1
    for node in nodes:
        node.wait_for_line("quorum 1: a b c", timeout=5)


def test_a_killed_node_is_out_within_the_timeout(job):
    lighthouse = job.lighthouse(min_nodes=2)
    nodes = {name: job.node(name) for name in ("a", "b", "c")}
    first, index = quorum_of(lighthouse, ["a", "b", "c"])
    killed_at = time.monotonic()
    nodes["b"].kill()
    second, _ = quorum_of(lighthouse, ["a", "c"], index + 1, timeout=3 * (TIMEOUT_S + SLACK_S))
    took = time.monotonic() - killed_at  # waited past the bound: the assertion says by how much
    assert second > first and took < TIMEOUT_S + GRACE_S + SLACK_S, took
    nodes["a"].wait_for_line("quorum %d: a c" % second, timeout=5)


def test_a_stopped_node_is_dropped_and_rejoins_when_continued(job):
    lighthouse = job.lighthouse(min_nodes=2)
    nodes = {name: job.node(name) for name in ("a", "b", "c")}
    first, index = quorum_of(lighthouse, ["a", "b", "c"])
    os.killpg(nodes["c"].pid, signal.SIGSTOP)
    second, index = quorum_of(lighthouse, ["a", "b"], index + 1, timeout=TIMEOUT_S + SLACK_S)
    os.killpg(nodes["c"].pid, signal.SIGCONT)
    third, _ = quorum_of(lighthouse, ["a", "b", "c"], index + 1, timeout=SLACK_S)
    assert first < second < third
    nodes["c"].wait_for_line("quorum %d: a b c" % third, timeout=5)


def test_nodes_rejoin_a_restarted_lighthouse_with_higher_ids(job):
    lighthouse = job.lighthouse(min_nodes=3)
    nodes = [job.node(name) for name in ("a", "b", "c")]
    first, _ = quorum_of(lighthouse, ["a", "b", "c"])
    for node in nodes:
        node.wait_for_line("quorum %d: a b c" % first, timeout=5)
    lighthouse.kill()  # -9: no state kept; the nodes keep their quorum and retry
    port = int(job.address.rpartition(":")[2])
    again = job.lighthouse(min_nodes=3, port=port)
    second, _ = quorum_of(again, ["a", "b", "c"], timeout=5 + SLACK_S)
    assert second > first  # numbered above the ids the nodes report
    for node in nodes:
        node.wait_for_line("quorum %d: a b c" % second, timeout=5)


def test_a_node_without_the_secret_is_refused_and_changes_nothing(job, tmp_path):
    lighthouse = job.lighthouse(min_nodes=2)
    job.node("a"), job.node("b")
    first, index = quorum_of(lighthouse, ["a", "b"])
    intruder = job.node("x", secret_file=generate_secret(str(tmp_path / "wrong")))
    line = intruder.wait_for_line("refused:", timeout=10)
    assert "signature does not match the lighthouse's secret" in line
    assert intruder.wait(timeout=5) == 3
    lighthouse.wait_for_line("lighthouse: refused a request", timeout=5)
    job.node("c")  # no quorum holds x (a starved heartbeat may add one of a, b meanwhile)
    second, last = quorum_of(lighthouse, ["a", "b", "c"], index + 1)
    assert second > first
    between = [line for line in lighthouse.lines[index + 1:last + 1]
               if line and re.search(QUORUM, line)]
    assert between and not [line for line in between
                            if "x" in re.search(QUORUM, line).group(2).split(", ")], between


def test_gloo_data_plane_averages_int8_and_rebuilds_after_a_kill(job):
    job.lighthouse(min_nodes=2)
    nodes = {name: job.node(name, "--value", value)
             for name, value in (("a", 1.0), ("b", 2.0), ("c", 4.0))}
    found = {name: node.wait_for_match(r"round (\d+) size 3 mean (\S+) digest (\w+)", 30)
             for name, node in nodes.items()}
    rounds = {name: match for name, (match, _) in found.items()}
    assert len({m.group(1) for m in rounds.values()}) == 1  # one quorum
    assert len({m.group(3) for m in rounds.values()}) == 1  # the same bits on every node
    assert float(rounds["a"].group(2)) == pytest.approx(7 / 3, rel=1e-2)
    first = int(rounds["a"].group(1))
    nodes["a"].kill()  # rank 0, whose store the group met at: the next meets at b's
    # (a round of two before c came, if any, is not after the kill: looked for after it)
    after = {name: nodes[name].wait_for_match(r"round (\d+) size 2 mean (\S+) digest (\w+)",
                                              TIMEOUT_S + 5 + SLACK_S, found[name][1] + 1)[0]
             for name in ("b", "c")}
    assert len({m.group(1) for m in after.values()}) == 1
    assert int(after["b"].group(1)) > first
    assert len({m.group(3) for m in after.values()}) == 1
    assert float(after["b"].group(2)) == pytest.approx(3.0, rel=1e-2)


def test_a_round_a_member_does_not_join_is_broken_within_its_timeout():
    import threading

    from platoon.elastic import QuorumGroup, StoreServer
    from platoon.node.compress import ErrorFeedback, make_codec
    with StoreServer("127.0.0.1") as store:
        quorum = Quorum(3, ("a", "b"), (store.address, "127.0.0.1:1"))
        groups = {}
        formed = [threading.Thread(target=lambda n=n: groups.__setitem__(
            n, QuorumGroup(quorum, n, timeout_s=1.0))) for n in ("a", "b")]
        for thread in formed:
            thread.start()
        for thread in formed:
            thread.join(10)
        assert sorted(groups) == ["a", "b"]
        feedback = ErrorFeedback(300)
        started = time.monotonic()
        with pytest.raises(QuorumBroken, match=r"node a \(rank 0 of quorum 3: a, b\): the "
                                               r"all-gather failed within 1 s"):
            groups["a"].compressed_mean(np.ones(300, np.float32), make_codec("int8"), feedback)
        assert time.monotonic() - started < 1.0 + SLACK_S
        assert not feedback.residual.any()  # nothing averaged: nothing dropped
        for group in groups.values():
            group.close()


def test_a_group_whose_member_never_comes_is_broken_within_its_timeout():
    from platoon.elastic import QuorumGroup, StoreServer
    with StoreServer("127.0.0.1") as store:
        quorum = Quorum(5, ("a", "ghost"), (store.address, "127.0.0.1:1"))
        started = time.monotonic()
        with pytest.raises(QuorumBroken, match=r"node a \(rank 0 of quorum 5: a, ghost\): "
                                               r"forming the group failed within 1 s"):
            QuorumGroup(quorum, "a", timeout_s=1.0)
        assert time.monotonic() - started < 1.0 + SLACK_S


# --- python -m platoon.elastic.node ---------------------------------------------------------
def _alive(pid):
    """Whether process `pid` exists and is no zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _mentioning(text):
    """Pids of the live processes whose command line holds `text`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if text.encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def _stop(launcher, tmp_path):
    """Stop `launcher` as Ctrl-C would (SIGTERM: it stops its nodes, whose mpiexec runs them
    in sessions of their own), then kill what is left: the launcher, and any process whose
    command line holds `tmp_path` (only this test's job does)."""
    if launcher.popen.poll() is None:
        launcher.popen.send_signal(signal.SIGTERM)
        try:
            launcher.popen.wait(15)
        except subprocess.TimeoutExpired:
            pass
    launcher.kill()
    for pid in _mentioning(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("rule", [
    ["--tie-outer-lr", "1", "--tie-outer-momentum", "0"],
    ["--tie-outer", "easgd", "--tie-beta", "0.5"]], ids=["diloco", "easgd"])
def test_launcher_elastic_job_survives_a_kill_restarts_the_node_healed_ends_on_one_centre(
        tmp_path, rule):
    """platoon-launcher --hosts (three nodes on this machine, one worker each) --elastic: a
    lighthouse with a new secret, and one node runner per host under an mpiexec of its own.
    Their centres are tied every 0.2 s over int8 by DiLoCo's outer step at lr 1 without
    momentum (plain averaging), or by EASGD. Node 3's controller is killed -9
    after its first round (its worker dies with it, the reaper frees its shared memory): its
    mpiexec alone ends, nodes 1 and 2 go on in the next quorum, and the launcher (--restart 1)
    starts node 3 again under its name: it is healed from a peer (it takes their anchor) and
    contributes. Then every node ends, all three save the same finite centre, as good as
    their workers, and the launcher exits 0 leaving no process and no shared memory."""
    from platoon import load_centre
    stop, logs = tmp_path / "stop", tmp_path / "logs"
    a, b, c = names = ["127.0.0.1-%d" % i for i in (1, 2, 3)]
    n = {name: re.escape(name) for name in names}
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts"] + ["127.0.0.1"] * 3 + [
        "--elastic", "-n", "1", "--min-nodes", "2", "--heartbeat-timeout-s", str(TIMEOUT_S),
        "--tie-every-s", "0.2"] + rule + [
        "--restart", "1", "--log-dir", str(logs), "--", "60", str(stop)])
    try:
        match, _ = launcher.wait_for_match(r"\[node-%s\] platoon.elastic: node \S+, controller "
                                           r"pid (\d+), job (\S+)," % n[c], 30)
        pid, c_job = int(match.group(1)), match.group(2)
        launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: first contributing round"
                                % (n[c], n[c]), 30)
        everyone = r"\[lighthouse\] .*lighthouse: quorum (\d+): %s$" % ", ".join(
            n[x] for x in names)
        _, index = launcher.wait_for_match(everyone, 10)
        os.kill(pid, signal.SIGKILL)
        launcher.wait_for_match(r"platoon-launcher: node %s failed \(.*\); starting it again \(0 "
                                r"restart\(s\) left\)" % n[c], 10, index)
        # 1 and 2 go on in a newer quorum: of the two of them, or of all three again when the
        # restarted node 3 heartbeats before the killed one's timeout (it then takes its name)
        went_on = [launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: outer rounds go on "
                                           r"in quorum (\d+) \(%s, %s(, %s)?\), (\S+) s after a "
                                           r"round broke" % (n[x], n[x], n[a], n[b], n[c]),
                                           TIMEOUT_S + GRACE_S + SLACK_S, index)[0]
                   for x in (a, b)]
        assert int(went_on[0].group(1)) > int(re.search(everyone, launcher.lines[index]).group(1))
        healed, _ = launcher.wait_for_match(
            r"\[node-%s.restart1\] .* WARNING: node %s: healed from (\S+) in quorum \d+ \(outer "
            r"round (\d+)\), (\S+) s after its start" % (n[c], n[c]), 30, index)
        assert healed.group(1) in (a, b)
        first, _ = launcher.wait_for_match(r"\[node-%s.restart1\] .* WARNING: node %s: first "
                                           r"contributing round (\S+) s" % (n[c], n[c]), 10,
                                           index)
        stop.write_text("")
        assert launcher.wait(30) == 0, launcher.output
        summary = launcher.output[launcher.output.index("job summary"):]
        assert "node-%s on 127.0.0.1: failed (exit code 9)" % c in summary, summary
        assert "node-%s.restart1 on 127.0.0.1: finished" % c in summary, summary
        assert "the nodes alive at the end saved the same agreed centre" in summary, summary
        centres = [load_centre(str(logs / ("centre-%s.npz" % x)))["param_0"] for x in names]
        assert all(np.array_equal(centres[0], other) for other in centres[1:])
        assert np.isfinite(centres[0]).all()
        true_w = np.arange(256) / 256
        dists = [float(line.split()[2]) for line in launcher.lines
                 if line and re.match(r"\[node-\S+\] DIST ", line)]
        # Trained: from about 16 at the start (N(0, 1) weights) to the workers' own distance.
        # An outer step of lr 1 without momentum is plain averaging: the agreed centre is where
        # the workers are, however few rounds the run made (with the defaults, lr 0.7 and
        # momentum 0.9, it lags them by the outer steps it did not make: 0.17 to 1.2 with 5
        # rounds, the workers at 0.006 to 0.17)
        distance = float(np.linalg.norm(centres[0] - true_w))
        assert len(dists) == 3 and distance < min(4.0, 2 * max(dists) + 0.01), (distance, dists)
        # no worker took itself for an MPI rank (mpiexec started each node)
        assert sum(line.endswith("] DISTRIBUTED none") for line in launcher.lines if line) == 4
        # each host's node its own slot, its own part of the data, the same after its restart
        shards = {}
        for line in launcher.lines:
            match = re.match(r"\[node-(\S+?)/worker0\] SHARD ([\d ]+)$", line or "")
            if match:
                shards.setdefault(match.group(1), set()).add(match.group(2))
        assert sorted(shards) == sorted(names) and all(len(s) == 1 for s in shards.values())
        parts = [set(s.pop().split()) for s in shards.values()]
        assert set.union(*parts) == set(map(str, range(12))) and sum(map(len, parts)) == 12
        assert os.stat(logs / "elastic.secret").st_mode & 0o777 == 0o600
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
        assert not [s for s in platoon_segments() if c_job.rpartition("-" + c)[0] in s]
    finally:
        _stop(launcher, tmp_path)
    print("nodes 1 and 2 back to outer rounds %s s after theirs broke; node 3 started again by "
          "the launcher healed %s s and first contributing %s s after its start; the centre "
          "%.4f from the true weights, the workers %s"
          % ("/".join(m.group(3) for m in went_on), healed.group(3), first.group(1), distance,
             dists))


def test_launcher_elastic_restarts_its_lighthouse_and_sigint_leaves_nothing(tmp_path):
    """The lighthouse that platoon-launcher --elastic --restart 1 started is killed -9: the
    launcher starts it again on its port, and the node, training on, joins its new quorum.
    Then Ctrl-C (SIGINT): the launcher stops the node (through its mpiexec) and the
    lighthouse, exits 130 with a summary that says the centre saved is the node's own, and
    leaves no process and no shared memory."""
    logs = tmp_path / "logs"
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "--elastic",
                     "-n", "1", "--restart", "1", "--log-dir", str(logs), "--", "60"])
    try:
        match, _ = launcher.wait_for_match(r"\[node-127.0.0.1\] platoon.elastic: node \S+, "
                                           r"controller pid \d+, job (\S+),", 30)
        first, index = launcher.wait_for_match(r"\[lighthouse\] .*lighthouse: quorum (\d+): "
                                               r"127.0.0.1$", 30)
        # the node has that quorum (else a lighthouse killed first, knowing nothing of it,
        # comes back numbering from the id the node reports: the same one)
        launcher.wait_for_match(r"\[node-127.0.0.1\] .*: rank \d+ of quorum %s " % first.group(1),
                                30)
        (lighthouse,) = [pid for pid in _mentioning(str(tmp_path))
                         if "platoon.elastic.lighthouse" in _cmdline(pid)]
        os.kill(lighthouse, signal.SIGKILL)
        launcher.wait_for_match(r"platoon-launcher: the lighthouse failed \(killed by SIGKILL\); "
                                r"starting it again on port \d+ \(0 restart\(s\) left\)", 10,
                                index)
        again, _ = launcher.wait_for_match(r"\[lighthouse.restart1\] .*lighthouse: quorum "
                                           r"(\d+): 127.0.0.1$", 5 + SLACK_S, index)
        assert int(again.group(1)) > int(first.group(1))
        launcher.wait_for_line("[node-127.0.0.1/worker0] DISTRIBUTED none", 30)  # it runs
        launcher.popen.send_signal(signal.SIGINT)
        assert launcher.wait(30) == 128 + signal.SIGINT, launcher.output
        summary = launcher.output[launcher.output.index("job summary"):]
        assert "node-127.0.0.1 on 127.0.0.1: stopped" in summary, summary
        assert "the job ended before its final round" in summary, summary
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
        job_id = match.group(1).rpartition("-127.0.0.1")[0]
        assert not [s for s in platoon_segments() if job_id in s]
    finally:
        _stop(launcher, tmp_path)


def test_launcher_elastic_job_whose_every_node_fails_fails_and_leaves_nothing(tmp_path):
    """Both nodes' workers fail at once (a bad argument): each node ends, the launcher, with
    no restart left, reports each, says that every node failed, exits 1, and stops the
    lighthouse, leaving no process."""
    logs = tmp_path / "logs"
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "127.0.0.1",
                     "--elastic", "-n", "1", "--log-dir", str(logs), "--", "not-seconds"])
    try:
        assert launcher.wait(60) == 1, launcher.output
        for name in ("127.0.0.1-1", "127.0.0.1-2"):
            assert re.search(r"platoon-launcher: node %s failed \(exit code \d+\); (the other "
                             r"nodes go on without it|no other node runs) \(no restart left"
                             % re.escape(name), launcher.output), launcher.output
        assert "platoon-launcher: job failed: every node failed" in launcher.output
        assert "no centre saved here (the job ended before its final round)" in launcher.output
        assert "could not convert string to float: 'not-seconds'" in launcher.output
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
    finally:
        _stop(launcher, tmp_path)


def test_an_elastic_node_refuses_cross_node_collectives_and_a_tie_paced_in_syncs():
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    link = ElasticLink(2, connect=None, name="a", tie=CentreTie(1.0, outer="diloco"),
                       timeout_s=5.0, on_failure=print)
    with pytest.raises(PlatoonError, match="all_reduce across nodes does not exist in an "
                                           "elastic job"):
        link.all_reduce(np.zeros(3, np.float32), "sum")
    with pytest.raises(PlatoonError, match="a barrier across nodes does not exist"):
        link.barrier()
    assert link.topology(1) == {"global_rank": 1, "global_size": 2, "elastic_node": "a",
                                "placed_in_job": False}
    with pytest.raises(PlatoonError, match="rounds come every so many seconds"):
        ElasticLink(1, None, "a", CentreTie(None, every_syncs=4, outer="easgd"), 5.0, print)


def test_a_stopped_node_is_dropped_the_others_go_on_and_it_rejoins_repaired(job, tmp_path):
    """Node c (controller and worker) is stopped past the heartbeat timeout: a and b go on in
    a quorum of two once their round has timed out (--tie-timeout-s 3); continued, c rejoins,
    its stale anchor is repaired from a peer, and the three end on one saved centre."""
    lighthouse = job.lighthouse(min_nodes=2)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"))
             for name in ("a", "b", "c")}
    _c_is_dropped_and_rejoins_repaired(
        lighthouse, nodes, stop, tmp_path, lambda: os.killpg(nodes["c"].pid, signal.SIGSTOP),
        lambda: os.killpg(nodes["c"].pid, signal.SIGCONT))


def test_joiners_with_another_codec_or_model_are_refused_alone_and_the_others_end_on_one_centre(
        job, tmp_path):
    """Nodes a and b train (int8, DiLoCo); c joins with --tie-compress int4 and d with another
    model (512 features where the job has 256). Each is refused at the door of its first round,
    before any payload travels (no gloo abort: the others' processes live on): it ends alone
    (exit 3, naming the setting); a and b drop that round, go on between themselves, and end on
    one saved, finite centre. Given their slots (0 and 1 of 2), a's and b's workers each shard
    the data their own part; c's, started without one, are refused a shard, saying why."""
    from platoon import load_centre
    lighthouse = job.lighthouse(min_nodes=2)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              node_args=["--slot", slot, "--slots", 2])
             for slot, name in enumerate(("a", "b"))}
    shards = [set(nodes[n].wait_for_match(r".* SHARD ([\d ]+)$", 30)[0].group(1).split())
              for n in "ab"]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(map(str, range(12)))
    nodes["a"].wait_for_match(r".* WARNING: node a: first contributing round", 30)
    _, index = quorum_of(lighthouse, ["a", "b"])
    codec = job.runner("c", 60, stop, node_args=["--tie-compress", "int4"])
    model = job.runner("d", 60, stop, 512)
    codec.wait_for_match(r".* SHARD refused: shard\(items, w\): worker 0 is on elastic node c, "
                         r"started without --slot I --slots N", 30)
    assert codec.wait(30) == 3, codec.output  # EXIT_REFUSED: the launcher does not restart it
    assert "node c is refused by the job's other nodes" in codec.output
    assert re.search(r"its --tie-compress int4 where a, b(, d)? have int8", codec.output)
    assert model.wait(30) == 3, model.output
    assert re.search(r"node d is refused by the job's other nodes \(quorum \d+: a, b(, c)?, d\): "
                     r"its model differs from the job's: its centre holds 1 array\(s\): 512 "
                     r"float32, where a, b(, c)? hold 1 array\(s\): 256 float32", model.output)
    for n in ("a", "b"):
        nodes[n].wait_for_match(r".* refused at the door", 10)
        nodes[n].wait_for_match(r".* WARNING: node %s: outer rounds go on in quorum \d+ "
                                r"\(a, b\)" % n, 10 + SLACK_S)
    stop.write_text("")
    for node in nodes.values():
        assert node.wait(30) == 0, node.output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "ab"]
    assert np.array_equal(centres[0], centres[1]) and np.isfinite(centres[0]).all()


def _c_is_dropped_and_rejoins_repaired(lighthouse, nodes, stop, tmp_path, drop, restore):
    """Once c has contributed, `drop` it: a and b go on in a quorum of two once their round
    has timed out; `restore` it: c rejoins, its stale anchor is repaired from a peer, and the
    three end on one saved, finite centre."""
    from platoon import load_centre
    nodes["c"].wait_for_match(r".* WARNING: node c: first contributing round", 30)
    _, index = quorum_of(lighthouse, ["a", "b", "c"])
    drop()
    _, index = quorum_of(lighthouse, ["a", "b"], index + 1, timeout=TIMEOUT_S + SLACK_S)
    for n in ("a", "b"):
        nodes[n].wait_for_match(r".* WARNING: node %s: outer rounds go on in quorum \d+ "
                                r"\(a, b\)" % n, 3 + 5 + SLACK_S)
    restore()
    quorum_of(lighthouse, ["a", "b", "c"], index + 1, timeout=5 + SLACK_S)
    nodes["c"].wait_for_match(r".* WARNING: node c: its anchor repaired from [ab] in quorum", 15)
    stop.write_text("")
    for node in nodes.values():
        assert node.wait(30) == 0, node.output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "abc"]
    assert all(np.array_equal(centres[0], c) for c in centres[1:])
    assert np.isfinite(centres[0]).all()


def test_nodes_train_on_while_the_lighthouse_is_down_and_rejoin_it_restarted(job, tmp_path):
    """Two nodes started by platoon-launcher --hosts ... --elastic --join (the lighthouse is
    the job's own, started apart): the lighthouse is killed -9 mid-run: the nodes' outer
    rounds go on in the group they have (it needs no lighthouse); restarted on its port, it
    numbers a quorum above theirs, the nodes move to its group, and they end on one saved
    centre; the launcher exits 0 and starts no lighthouse of its own."""
    from platoon import load_centre
    lighthouse = job.lighthouse(min_nodes=2)
    stop, logs = tmp_path / "stop", tmp_path / "logs"
    names = ["127.0.0.1-1", "127.0.0.1-2"]
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "127.0.0.1",
                     "--elastic", "-n", "1", "--join", job.address, "--secret-file",
                     str(tmp_path / "secret"), "--tie-every-s", "0.2", "--log-dir", str(logs),
                     "--", "60", str(stop)])
    try:
        for name in names:
            launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: first contributing round"
                                    % (re.escape(name), re.escape(name)), 30)
        first, _ = quorum_of(lighthouse, names)
        lighthouse.kill()
        again = job.lighthouse(min_nodes=2, port=int(job.address.rpartition(":")[2]))
        second, _ = quorum_of(again, names, timeout=5 + SLACK_S)
        assert second > first
        stop.write_text("")
        assert launcher.wait(30) == 0, launcher.output
        for name in names:
            summary = [line for line in launcher.lines if line and line.startswith(
                "[node-%s] " % name) and "the elastic tie made" in line]
            made = [int(q) for q in re.search(r"in quorum\(s\) ([\d,]+),", summary[0])
                    .group(1).split(",")]  # a starved heartbeat may add a quorum between or after
            assert first in made and second in made and made.index(first) < made.index(second), \
                launcher.output
        assert "lighthouse" not in " ".join(os.listdir(logs))  # joined, not started
        centres = [load_centre(str(logs / ("centre-%s.npz" % n)))["param_0"] for n in names]
        assert np.array_equal(*centres) and np.isfinite(centres[0]).all()
    finally:
        _stop(launcher, tmp_path)


SWITCH_IP = "10.219.7.254"


@pytest.fixture
def switch():
    """Three "hosts" (network namespaces, 10.219.7.1-3) each joined by a veth pair to a
    bridge in a fourth (the switch, 10.219.7.254, where the lighthouse runs); returns
    (namespaces by host name, the switch's namespace, cut(host, up=False)). Every process left
    in them is killed and they are deleted at teardown."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and ip")
    tag = "pel%d" % os.getpid()
    sw, hosts = tag + "s", {n: "%s%s" % (tag, n) for n in "abc"}
    made = []

    def ip(*args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=10)

    def cut(host, up=False):  # the host's port on the switch
        ip("-n", sw, "link", "set", "p" + host, "up" if up else "down")

    try:
        for ns in [sw] + list(hosts.values()):
            ip("netns", "add", ns)
            made.append(ns)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "addr", "add", SWITCH_IP + "/24", "dev", "br0")
        for index, (host, ns) in enumerate(sorted(hosts.items()), 1):
            ip("link", "add", "p" + tag + host, "type", "veth", "peer", "name", "e" + tag + host)
            ip("link", "set", "p" + tag + host, "netns", sw)
            ip("-n", sw, "link", "set", "p" + tag + host, "name", "p" + host)
            ip("-n", sw, "link", "set", "p" + host, "master", "br0")
            ip("-n", sw, "link", "set", "p" + host, "up")
            ip("link", "set", "e" + tag + host, "netns", ns)
            ip("-n", ns, "link", "set", "e" + tag + host, "name", "eth0")
            ip("-n", ns, "addr", "add", "10.219.7.%d/24" % index, "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        for ns in (sw,):
            ip("-n", ns, "link", "set", "br0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts, sw, cut
    except subprocess.CalledProcessError as exc:
        pytest.skip("cannot make network namespaces here: %s" % exc.stderr.decode().strip())
    finally:
        for ns in made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                  timeout=10).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def test_a_node_whose_link_is_cut_is_dropped_and_rejoins_when_it_is_back(job, switch,
                                                                          tmp_path):
    """Three hosts on a switch (network namespaces), the lighthouse on the switch. Host c's
    link is cut (its port down) after its first round: a and b go on in a quorum of two once
    their round has timed out; the link back, c rejoins, its stale anchor repaired, and the
    three end on one saved centre."""
    hosts, sw, cut = switch
    lighthouse = job.lighthouse(min_nodes=2, host=SWITCH_IP, netns=sw)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              host="10.219.7.%d" % index, netns=hosts[name])
             for index, name in enumerate("abc", 1)}
    _c_is_dropped_and_rejoins_repaired(lighthouse, nodes, stop, tmp_path, lambda: cut("c"),
                                       lambda: cut("c", up=True))


def test_a_node_whose_data_plane_the_others_cannot_reach_is_left_out_and_told_why(
        job, switch, tmp_path):
    """Three hosts on a switch; a gives --host 127.0.0.1 (the node's default, an address only
    it sees), yet reaches the lighthouse. As rank 0 it hosts its quorum's store, so the group
    cannot form; b and c, whose probes of a's data plane are refused, report it, and the
    lighthouse leaves a out of the next quorum and tells it why: b and c make their rounds
    between themselves and end on one centre (before, every group failed to form for as long
    as a stayed)."""
    from platoon import load_centre
    hosts, sw, _ = switch
    lighthouse = job.lighthouse(min_nodes=2, host=SWITCH_IP, netns=sw)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              host="10.219.7.%d" % index if name != "a" else "127.0.0.1",
                              netns=hosts[name],
                              node_args=["--final-timeout-s", 4] if name == "a" else [])
             for index, name in enumerate("abc", 1)}
    _, index = quorum_of(lighthouse, ["a", "b", "c"], timeout=30)
    lighthouse.wait_for_match(r"lighthouse: node a is out of the quorums: its data plane at "
                              r"127\.0\.0\.1:\d+ was unreachable from (b|c|b, c):", 3 + 10, index)
    quorum_of(lighthouse, ["b", "c"], index + 1, timeout=5)
    for n in ("b", "c"):
        nodes[n].wait_for_match(r".* WARNING: node %s: the data plane of a \(quorum \d+\) is "
                                r"unreachable from here" % n, 5)
        nodes[n].wait_for_match(r".* WARNING: node %s: first contributing round" % n, 15)
    nodes["a"].wait_for_match(r".*node a: the lighthouse \S+ keeps this node out of the "
                              r"quorums: its data plane at 127\.0\.0\.1", 10)
    stop.write_text("")
    for n in "abc":  # a, left out, gives the final round up and keeps its own centre
        assert nodes[n].wait(30) == 0, nodes[n].output
    assert "no final round within 4 s: it kept its own centre" in nodes["a"].output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "bc"]
    assert np.array_equal(centres[0], centres[1]) and np.isfinite(centres[0]).all()
