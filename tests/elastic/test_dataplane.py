"""platoon.elastic.dataplane: a quorum's compressed mean as a reduce-scatter then an all-gather,
over real gloo groups (one per member, in threads of this process, on 127.0.0.1); a round or a
group that a member misses broken within its timeout; and real nodes (tests/procs/elastic_node.py)
averaging over their quorum's group, rebuilt after one is killed."""

import threading
import time

import numpy as np
import pytest

from platoon.elastic import Quorum, QuorumGroup, StoreServer
from platoon.elastic.dataplane import chunk_bounds
from platoon.errors import NonFiniteValues, QuorumBroken
from platoon.node.compress import ErrorFeedback, RawCodec, make_codec, mean_of_messages

from elastic_helpers import SLACK_S, TIMEOUT_S

SECRET = b"s" * 32  # the job's (every member here holds it)


def _in_parallel(groups, call):
    """call(rank, group) on every member at once; the results (or exceptions) by rank."""
    results = {}

    def run(rank, group):
        try:
            results[rank] = call(rank, group)
        except Exception as exc:  # noqa: BLE001 (compared by the test)
            results[rank] = exc

    threads = [threading.Thread(target=run, args=item) for item in enumerate(groups)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == len(groups)
    return [results[r] for r in range(len(groups))]


@pytest.fixture
def quorum_of():
    """quorum_of(p): p members' QuorumGroups of one quorum (all closed at teardown)."""
    made = []

    def make(p):
        store = StoreServer("127.0.0.1", secret=SECRET)
        made.append(store)
        names = tuple("m%02d" % i for i in range(p))
        quorum = Quorum(1, names, (store.address,) + ("127.0.0.1:1",) * (p - 1), "n0nce")
        groups = _in_parallel(range(p), lambda rank, _: QuorumGroup(quorum, names[rank], 10.0,
                                                                      secret=SECRET))
        made.extend(groups)
        return groups

    yield make
    for thing in reversed(made):
        thing.close()


def test_chunks_cover_the_array_on_block_boundaries():
    assert chunk_bounds(1000, 3, 256) == [0, 256, 512, 1000]
    assert chunk_bounds(10, 4, 256) == [0, 0, 0, 0, 10]
    bounds = chunk_bounds(100_000, 7, 256)
    assert bounds[0] == 0 and bounds[-1] == 100_000
    assert all(b % 256 == 0 for b in bounds[:-1]) and bounds == sorted(bounds)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_the_mean_is_the_same_bits_everywhere_for_about_two_messages_sent(quorum_of, p):
    """int8 with error feedback: every member gets the same bits, close to the true mean;
    each sends about 2 (p - 1) / p of one message, not (p - 1) messages; over rounds the sum
    of the means tracks the sum of the true means (the errors do not pile up)."""
    groups = quorum_of(p)
    n = 20_000
    codec = make_codec("int8")
    feedback = [ErrorFeedback(n) for _ in range(p)]
    rng = np.random.default_rng(0)
    drift = np.zeros(n)
    for _ in range(5):
        arrays = [rng.normal(size=n).astype(np.float32) for _ in range(p)]
        results = _in_parallel(groups, lambda rank, g, arrays=arrays: g.compressed_mean(
            arrays[rank], codec, feedback[rank]))
        means = [mean for mean, _ in results]
        assert all(np.array_equal(means[0], m) for m in means[1:])
        truth = np.mean(arrays, axis=0)
        assert np.abs(means[0] - truth).max() < 0.1
        drift += means[0] - truth
        sent = [s for _, s in results]
        message = codec.encoded_size(n)
        # 2 (p - 1) / p messages, give or take a block per chunk and the refusal flags
        assert max(sent) <= 2.0 * message * (p - 1) / p + (p - 1) * (p + 2 * 260), sent
    assert np.abs(drift).max() < 0.1  # error feedback: five rounds' error stays one round's


def test_a_lossless_mean_is_exactly_the_all_gathers(quorum_of):
    """With the centres' own dtype (the first and final rounds), the reduce-scatter's mean is
    bit for bit what adding every whole message in rank order gives."""
    groups = quorum_of(3)
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=5000).astype(np.float32) for _ in range(3)]
    codec = RawCodec(np.float32)
    results = _in_parallel(groups, lambda rank, g: g.compressed_mean(arrays[rank], codec))
    messages = np.stack([codec.encode(a) for a in arrays])
    expected = mean_of_messages(messages, [0, 1, 2], 0, 3, codec, arrays[0],
                                arrays[0].reshape(-1), None)
    for mean, _ in results:
        assert np.array_equal(mean, expected)


def test_nan_on_one_member_is_refused_on_every_member_naming_it(quorum_of):
    groups = quorum_of(3)
    arrays = [np.ones(3000, np.float32) for _ in range(3)]
    arrays[2][2999] = np.nan  # in the last member's own chunk, and in no other's
    feedback = [ErrorFeedback(3000) for _ in range(3)]
    results = _in_parallel(groups, lambda rank, g: g.compressed_mean(
        arrays[rank], make_codec("int4"), feedback[rank]))
    for result in results:
        assert isinstance(result, NonFiniteValues) and result.ranks == [2]
    assert not any(f.residual.any() for f in feedback)  # nothing averaged, nothing dropped


def test_only_the_members_named_make_the_mean(quorum_of):
    groups = quorum_of(3)
    arrays = [np.full(4000, v, np.float32) for v in (1.0, 3.0, 1000.0)]
    results = _in_parallel(groups, lambda rank, g: g.compressed_mean(
        arrays[rank], make_codec("float32"), among=[0, 1]))
    assert all(np.array_equal(mean, np.full(4000, 2.0, np.float32)) for mean, _ in results)
    assert results[2][1] > 0  # it passes the others' chunks on, sending none of its own


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
    with StoreServer("127.0.0.1", secret=SECRET) as store:
        quorum = Quorum(3, ("a", "b"), (store.address, "127.0.0.1:1"))
        groups = {}
        formed = [threading.Thread(target=lambda n=n: groups.__setitem__(
            n, QuorumGroup(quorum, n, timeout_s=1.0, secret=SECRET))) for n in ("a", "b")]
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
    with StoreServer("127.0.0.1", secret=SECRET) as store:
        quorum = Quorum(5, ("a", "ghost"), (store.address, "127.0.0.1:1"))
        started = time.monotonic()
        with pytest.raises(QuorumBroken, match=r"node a \(rank 0 of quorum 5: a, ghost\): "
                                               r"forming the group failed within 1 s"):
            QuorumGroup(quorum, "a", timeout_s=1.0, secret=SECRET)
        assert time.monotonic() - started < 1.0 + SLACK_S


def test_a_group_forming_is_given_up_once_its_abandon_gives_a_reason():
    """A group whose member never comes, with a 30 s timeout: `abandon`, asked while it
    waits (every ABANDON_POLL_S), gives a reason the second time (a newer quorum came): the
    group is given up then, saying why, not after its timeout."""
    from platoon.elastic import QuorumGroup, StoreServer
    from platoon.elastic.dataplane import ABANDON_POLL_S, load_torch
    load_torch()  # (before the clock starts)
    with StoreServer("127.0.0.1", secret=SECRET) as store:
        quorum = Quorum(5, ("a", "ghost"), (store.address, "127.0.0.1:1"))
        asked = []

        def abandon():
            asked.append(time.monotonic())
            return "quorum 6 came" if len(asked) == 2 else None

        started = time.monotonic()
        with pytest.raises(QuorumBroken, match=r"forming the group failed within 30 s \("
                                               r"KeysNotSet: gave the group up: quorum 6 came"):
            QuorumGroup(quorum, "a", timeout_s=30.0, secret=SECRET, abandon=abandon)
        assert len(asked) == 2 and time.monotonic() - started < 2 * ABANDON_POLL_S + SLACK_S


def test_a_member_dead_before_its_group_forms_is_out_within_seconds(job, tmp_path):
    """c (a process heartbeating, its data plane never up) is in quorum (a, c), then killed
    -9 before a forms that quorum's group, under 30 s heartbeat and round timeouts: a,
    waiting for c, tries its data plane after a second, reports it gone, the lighthouse
    counts it out once silent, and a gives the group up for the newer quorum of itself
    alone, within seconds."""
    from platoon.elastic import LighthouseClient, StoreServer, load_secret
    from platoon.elastic.tie import ElasticMembership
    lighthouse = job.lighthouse(min_nodes=1, heartbeat_timeout_s=30)
    c = job.node("c")
    secret = load_secret(str(tmp_path / "secret"))
    with StoreServer("127.0.0.1", secret=secret) as store:
        membership = ElasticMembership(
            lambda: LighthouseClient(job.address, "a", store.address, secret=secret), "a",
            timeout_s=30.0)
        membership.connect()
        try:
            both = membership.client.wait_for_quorum(timeout_s=5 + SLACK_S)
            while both.members != ("a", "c"):
                both = membership.client.wait_for_quorum(timeout_s=5 + SLACK_S,
                                                         newer_than=both.id)
            c.kill()  # -9: silent from now on
            started = time.monotonic()
            group = None
            while group is None and time.monotonic() - started < 8 + SLACK_S:
                group = membership.next_group(threading.Event())
            assert group is not None and group.quorum.members == ("a",), lighthouse.output
            assert time.monotonic() - started < 8 + SLACK_S
            group.close()
        finally:
            membership.close()


@pytest.mark.parametrize("n", [20_000, 10], ids=["reduce-scatter", "one-all-gather"])
def test_a_move_altered_on_its_way_breaks_the_round_before_anything_is_averaged(quorum_of, n):
    """Every message of a mean is signed with the job's secret for its receiver and this mean:
    a byte of rank 1's messages changed on the wire (the path stands in here for a process
    between the nodes) makes every member refuse the round, naming rank 1, with its error
    feedback untouched; the next mean, unaltered, is the same bits everywhere again. (Moves
    were not signed: an altered one was averaged into every anchor.)"""
    groups = quorum_of(3)
    honest = groups[1]._signed

    def altered(seq, receiver, message):
        signed = honest(seq, receiver, message).copy()
        signed[0] ^= 1
        return signed

    groups[1]._signed = altered
    codec = make_codec("int8")
    feedback = [ErrorFeedback(n) for _ in groups]
    arrays = [np.random.default_rng(r).normal(size=n).astype(np.float32) for r in range(3)]
    results = _in_parallel(groups, lambda r, g: g.compressed_mean(arrays[r], codec,
                                                                  feedback[r]))
    for result in results:
        assert isinstance(result, QuorumBroken), results
        assert "the message of rank 1 (m01)" in str(result) and "not signed with the job's " \
            "secret" in str(result), result
    assert all((f.residual == 0).all() for f in feedback)
    groups[1]._signed = honest
    means = _in_parallel(groups, lambda r, g: g.compressed_mean(arrays[r], codec, feedback[r]))
    assert all(m[0].tobytes() == means[0][0].tobytes() for m in means), means
