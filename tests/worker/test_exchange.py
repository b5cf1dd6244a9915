"""Striped and asynchronous syncs: exact results, per-stripe atomicity, errors, locks."""

import contextlib
import os
import threading

import numpy as np
import pytest

from platoon import (
    ASGD,
    EASGD,
    Controller,
    LockTimeout,
    ParamSyncRule,
    PlatoonError,
    SyncTimeout,
    Worker,
)
from platoon._centre.shmem import MIN_STRIPE_BYTES, SharedCentre, stripe_ranges
from platoon.protocol import layout_of

# 12 MB of float32 (11 stripes) over three parameters: several stripes, some spanning two
# parameters.
SHAPES = [(1000, 1500), (7,), (1_500_000,)]


def make_params(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(dtype) for s in SHAPES]


def naive(rule, xs, cs, lasts=None):
    for i, (x, c) in enumerate(zip(xs, cs)):
        if isinstance(rule, EASGD):
            d = rule.alpha * (x - c)
            x -= d
            c += d
        else:
            c += x - lasts[i]
            x[...] = c
            lasts[i][...] = c


@pytest.mark.parametrize("layout", [
    layout_of([np.zeros(3)]),
    layout_of([np.zeros((1000, 1500), np.float32), np.zeros(7, np.float32),
               np.zeros(1_500_000, np.float32)]),
    layout_of([np.zeros(300_001, np.float64), np.zeros(0), np.zeros((3, 4, 5), np.float16)]),
    layout_of([np.zeros(40_000_000, np.float32)]),
])
def test_stripes_cover_every_element_once_in_balanced_aligned_ranges(layout):
    stripes = stripe_ranges(layout)
    seen = [np.zeros(int(np.prod(e["shape"])), np.int8) for e in layout]
    sizes = []
    for stripe in stripes:
        nbytes = 0
        for index, start, stop in stripe:
            assert 0 <= start < stop
            seen[index][start:stop] += 1
            nbytes += (stop - start) * np.dtype(layout[index]["dtype"]).itemsize
            assert start % 16 == 0
        sizes.append(nbytes)
    assert all((s == 1).all() for s in seen)
    total = sum(sizes)
    assert len(stripes) == max(1, min(64, total // MIN_STRIPE_BYTES))
    assert max(sizes) - min(sizes) <= 64 * 8 + 0.01 * total


@pytest.fixture
def centre_pair():
    """A centre of SHAPES and a second attachment of it (another worker, as far as locks go)."""
    layout = layout_of(make_params(0))
    centre = SharedCentre.create("xchg%d" % os.getpid() + os.urandom(4).hex(), layout)
    other = SharedCentre.attach(centre.name, layout)
    yield centre, other
    other.close()
    centre.close()
    centre.unlink()


def attach_worker(centre, rule, params, timeout_s=5.0):
    """An Exchange as Worker.init_shared_params builds it, without the control round trips."""
    from platoon._worker.exchange import Exchange
    rule.check(params)
    rule.setup(params)
    return Exchange(rule, params, centre, worker_id=1, timeout_s=timeout_s)


@pytest.mark.parametrize("rule_class", [lambda: EASGD(0.3), ASGD])
def test_striped_sync_is_bit_identical_to_the_formula(centre_pair, rule_class):
    centre, _ = centre_pair
    assert len(centre.stripes) == 11
    for c, v in zip(centre.arrays, make_params(1)):
        c[...] = v
    xs = make_params(1)
    rule = rule_class()
    ex = attach_worker(centre, rule, xs)
    want_x, want_c = make_params(1), make_params(1)
    lasts = make_params(1)
    for r in range(3):
        for x, wx, d in zip(xs, want_x, make_params(10 + r)):
            x += d
            wx += d
        ex.sync()
        naive(rule, want_x, want_c, lasts)
    for got, want in zip(xs + centre.arrays, want_x + want_c):
        np.testing.assert_array_equal(got, want)
    assert ex.stats.syncs == 3 and ex.stats.lock_hold_s > 0


@pytest.mark.parametrize("timeout_s", [20, None])  # None: wait pushes and pulls in one pass
@pytest.mark.parametrize("rule_class", [lambda: EASGD(0.3), ASGD])
def test_async_sync_with_no_local_change_equals_sync_params(centre_pair, rule_class, timeout_s):
    centre, _ = centre_pair
    for c, v in zip(centre.arrays, make_params(2)):
        c[...] = v
    xs_async, xs_sync = make_params(3), make_params(3)
    ex = attach_worker(centre, rule_class(), xs_async)
    handle = ex.start()
    handle.wait(timeout_s=timeout_s)
    handle.wait()  # a second wait does nothing
    got_centre = [c.copy() for c in centre.arrays]
    for c, v in zip(centre.arrays, make_params(2)):
        c[...] = v
    ex_sync = attach_worker(centre, rule_class(), xs_sync)
    ex_sync.sync()
    for got, want in zip(xs_async + got_centre, xs_sync + centre.arrays):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rule_class", [lambda: EASGD(0.5), ASGD])
def test_params_are_untouched_in_flight_and_keep_local_changes_after_wait(centre_pair,
                                                                          rule_class):
    centre, other = centre_pair
    for c in centre.arrays:
        c[...] = 2.0
    xs = [np.zeros(s, np.float32) for s in SHAPES]
    rule = rule_class()
    ex = attach_worker(centre, rule, xs, timeout_s=20)
    for x in xs:
        x[...] = 4.0                     # trained locally since the last sync
    other.lock.acquire()                 # another worker holds the whole centre
    try:
        handle = ex.start()
        with pytest.raises(SyncTimeout, match="still running"):
            handle.wait(timeout_s=0.05)
        assert not handle.done()
        with pytest.raises(PlatoonError, match="in flight"):
            ex.sync()
        with pytest.raises(PlatoonError, match="in flight"):
            ex.start()
        for x in xs:
            np.testing.assert_array_equal(x, 4.0)  # the snapshot is taken; x is ours
            x += 1.0                             # keep training while the sync is in flight
        for c in centre.arrays:
            np.testing.assert_array_equal(c, 2.0)  # nothing pushed yet
    finally:
        other.lock.release()
    handle.wait(timeout_s=20)
    for x, c in zip(xs, centre.arrays):
        if isinstance(rule, EASGD):  # c += 0.5 * (4 - 2); x = 5 - 0.5 * (4 - 2)
            np.testing.assert_array_equal(c, 3.0)
            np.testing.assert_array_equal(x, 4.0)
        else:  # ASGD: c += 4 - 0 (since setup saw zeros); x = c + (5 - 4)
            np.testing.assert_array_equal(c, 6.0)
            np.testing.assert_array_equal(x, 7.0)


@pytest.mark.parametrize("rule_class", [lambda: EASGD(0.5), ASGD])
def test_wait_without_timeout_keeps_local_changes_and_one_sync_thread_serves_every_sync(
        centre_pair, rule_class):
    centre, _ = centre_pair

    def three_syncs(timeout_s):
        """Three start/train/wait rounds from the same start; parameters, centre, threads."""
        for c, v in zip(centre.arrays, make_params(5)):
            c[...] = v
        xs = make_params(4)
        ex = attach_worker(centre, rule_class(), xs, timeout_s=20)
        threads = []
        for r in range(3):
            handle = ex.start()
            for x, d in zip(xs, make_params(20 + r)):
                x += d  # trained while the sync is in flight
            handle.wait(timeout_s=timeout_s)
            threads.append({t for t in threading.enumerate() if t.name == "platoon-sync"
                            and t.is_alive()})
        assert ex.stats.syncs == 3
        ex.close(5.0)
        return xs + [c.copy() for c in centre.arrays], threads

    # With a timeout, the sync thread pushes every stripe and wait() pulls them (as before);
    # without, wait() pushes and pulls in one pass the stripes the thread has not taken.
    want, _ = three_syncs(20)
    got, threads = three_syncs(None)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    assert len(threads[0]) == 1 and threads[0] == threads[1] == threads[2]
    (thread,) = threads[0]
    thread.join(5)  # ended by close()
    assert not thread.is_alive()


def test_sync_thread_runs_every_task_in_order_however_fast_they_come_and_close_ends_it():
    from platoon._worker.exchange import _SyncThread
    thread = _SyncThread()
    ran, last = [], threading.Event()
    for i in range(2000):  # most are queued before the thread wakes up for the one before
        thread.run(lambda i=i: ran.append(i))
    thread.run(last.set)
    assert last.wait(10)
    assert ran == list(range(2000))
    thread.run(lambda: ran.append("after"))  # queued after the thread went idle
    thread.close()
    thread._thread.join(5)
    assert not thread._thread.is_alive() and ran[-1] == "after"


def _all_stripes_free(centre):
    taken = [lock.try_acquire() for lock in centre.stripe_locks]
    for ok, lock in zip(taken, centre.stripe_locks):
        if ok:
            lock.release()
    return all(taken)


def failing_push(rule_class, call, message):
    """A subclass of `rule_class` whose push raises RuntimeError(message) on its call-th call."""

    class Failing(rule_class):
        calls = 0

        def push(self, index, start, snapshot, central):
            Failing.calls += 1
            if Failing.calls == call:
                raise RuntimeError(message)
            super().push(index, start, snapshot, central)

    return Failing


def test_async_errors_surface_at_wait_and_release_the_locks(centre_pair):
    centre, other = centre_pair

    xs = make_params(4)
    ex = attach_worker(centre, failing_push(EASGD, 5, "push failed on stripe call 5")(0.5), xs)
    before = [x.copy() for x in xs]
    centre_before = [c.copy() for c in centre.arrays]
    handle = ex.start()
    with pytest.raises(RuntimeError, match="push failed"):
        handle.wait(timeout_s=20)
    handle.wait()  # the error was reported once; the handle is finished
    # The 4 stripes pushed before the failure moved worker and centre by the same d (x - d,
    # c + d); the others moved neither.
    moved = 0
    for x, b, c, cb in zip(xs, before, centre.arrays, centre_before):
        np.testing.assert_allclose(x + c, b + cb, rtol=1e-5, atol=1e-5)
        moved += int((x != b).sum())
    assert 0 < moved < sum(x.size for x in xs)
    assert _all_stripes_free(other)
    ex.start().wait(timeout_s=20)  # the worker can sync again

    # A stripe held past the worker's timeout: LockTimeout at wait(), locks released.
    ex.timeout_s = 0.1
    other.stripe_locks[3].acquire()
    try:
        handle = ex.start()
        with pytest.raises(LockTimeout, match="stripe 3"):
            handle.wait(timeout_s=20)
    finally:
        other.stripe_locks[3].release()
    assert _all_stripes_free(other)


def test_asgd_push_failing_part_way_loses_no_change(centre_pair):
    """Each change reaches the centre exactly once, even across an async sync that failed."""
    centre, _ = centre_pair

    for c in centre.arrays:
        c[...] = 10.0
    xs = [np.full(c.shape, 10.0, c.dtype) for c in centre.arrays]
    ex = attach_worker(centre, failing_push(ASGD, 3, "push failed once")(), xs)
    for x in xs:
        x += 1.0
    with pytest.raises(RuntimeError, match="push failed once"):
        ex.start().wait(timeout_s=20)
    for c in centre.arrays:
        c += 5.0  # another worker pushes meanwhile
    ex.sync()
    for x, c in zip(xs, centre.arrays):
        np.testing.assert_array_equal(c, 16.0)  # 10, +1 from this worker, +5 from the other
        np.testing.assert_array_equal(x, c)


def test_sync_without_lock_is_refused_while_an_async_sync_is_in_flight(centre_pair):
    centre, other = centre_pair
    xs = make_params(6)
    ex = attach_worker(centre, EASGD(0.5), xs)
    other.stripe_locks[0].acquire()  # keeps the async sync in flight
    try:
        handle = ex.start()
        with pytest.raises(PlatoonError, match="in flight"):
            ex.sync(lock=False)
    finally:
        other.stripe_locks[0].release()
    handle.wait(timeout_s=20)


def test_rules_without_push_cannot_start_async_syncs(centre_pair):
    centre, _ = centre_pair

    class Custom(ParamSyncRule):
        def update(self, index, local, central):
            central[...] = local

    ex = attach_worker(centre, Custom(), make_params(5))
    with pytest.raises(TypeError, match="sync_params"):
        ex.start()
    ex.sync()  # non-elementwise: the whole centre under the whole lock
    for c, x in zip(centre.arrays, make_params(5)):
        np.testing.assert_array_equal(c, x)


class TakeCentre(ParamSyncRule):
    """A user rule: the worker takes the centre; striped, and asynchronous when declared."""

    elementwise = True

    def update(self, index, local, central):
        local[...] = central


class TakeCentreAsync(TakeCentre):
    supports_async = True

    def push(self, index, start, snapshot, central):
        snapshot[...] = central

    def pull(self, index, start, local, snapshot):
        local[...] = snapshot


def test_user_rules_sync_by_stripe_and_start_async_syncs_only_when_declared(centre_pair):
    centre, _ = centre_pair
    for c, v in zip(centre.arrays, make_params(7)):
        c[...] = v
    striped = attach_worker(centre, TakeCentre(), make_params(8))
    with pytest.raises(TypeError, match="supports_async = True"):
        striped.start()
    striped.sync()
    asynchronous = attach_worker(centre, TakeCentreAsync(), make_params(9))
    asynchronous.start().wait(timeout_s=20)
    for ex in (striped, asynchronous):
        assert ex.stats.syncs == 1
        for x, c in zip(ex.local, centre.arrays):
            np.testing.assert_array_equal(x, c)


def test_whole_lock_excludes_stripes_within_one_process(centre_pair):
    centre, other = centre_pair
    centre.lock.acquire()
    try:
        assert not _all_stripes_free(centre)   # same process, other thread/fd: still excluded
        assert not other.stripe_locks[0].try_acquire()
    finally:
        centre.lock.release()
    assert _all_stripes_free(centre)
    other.stripe_locks[5].acquire()
    try:
        with pytest.raises(LockTimeout):
            centre.lock.acquire(timeout=0.05)
    finally:
        other.stripe_locks[5].release()


@pytest.mark.parametrize("mode, rule", [("sync", "asgd"), ("async", "asgd"),
                                        ("async", "easgd")])
def test_three_workers_sync_stripes_concurrently_without_losing_updates(procs, serve, tmp_path,
                                                                        mode, rule):
    n, rounds = 3, 15
    ctl = Controller(control_port=0, num_workers=n)
    serving = serve(ctl, timeout=60)
    out = str(tmp_path / "worker%d.npz")
    workers = [procs("stripe_worker.py", ctl.control_port, rounds, mode, rule, out)
               for _ in range(n)]
    for w in workers:
        assert w.wait(60) == 0, w.output
    centre = [c.copy() for c in ctl.centre]
    serving.join()
    locals_ = [np.load(out % k) for k in range(n)]
    for i, c in enumerate(centre):
        if rule == "asgd":  # every +1 of every worker reaches the centre exactly once
            np.testing.assert_array_equal(c, n * rounds)
        else:  # EASGD moves x and c by opposite amounts: the sum moves by local changes only
            total = c.astype(np.float64) + sum(f["arr_%d" % i] for f in locals_)
            np.testing.assert_allclose(total, n * rounds, rtol=1e-5)


def test_worker_start_sync_end_to_end_and_close_with_a_sync_in_flight(serve):
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as a, Worker(ctl.control_port, timeout_s=10) as b:
        pa, pb = [np.full(5, 2.0)], [np.zeros(5)]
        a.init_shared_params(pa, EASGD(0.5))
        b.init_shared_params(pb, EASGD(0.5))
        pb[0] += 2.0
        handle = b.start_sync()
        pb[0] += 1.0                      # trained while in flight: kept
        handle.wait(timeout_s=10)
        np.testing.assert_array_equal(ctl.centre[0], 3.0)
        np.testing.assert_array_equal(pb[0], 4.0)  # 5 - 0.5 * (4 - 2)
        assert b.sync_stats.syncs == 1
        a.start_sync()                    # never waited for: close() finishes it
    serving.join()
    np.testing.assert_array_equal(pa[0], 2.5)


def test_start_sync_with_torch_tensors_keeps_changes_made_in_flight(serve):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as a, Worker(ctl.control_port, timeout_s=10) as b:
        a.init_shared_params([np.full(4, 2.0, np.float32)], EASGD(0.5))
        t = torch.zeros(4)
        b.init_shared_params([t], EASGD(0.5))
        torch.testing.assert_close(t, torch.full((4,), 2.0))
        t += 2.0
        handle = b.start_sync()
        t += 1.0
        handle.wait(timeout_s=10)
        torch.testing.assert_close(t, torch.full((4,), 4.0))  # 5 - 0.5 * (4 - 2)
        np.testing.assert_array_equal(ctl.centre[0], 3.0)
        assert b.syncs == 1
    serving.join()


def test_a_failed_async_push_is_not_counted_and_both_counters_agree(serve):
    ctl = Controller(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        assert w.syncs == 0 and w.sync_stats is None
        w.init_shared_params(make_params(11), failing_push(EASGD, 2, "second stripe failed")(0.5))
        w.sync_params()
        with pytest.raises(RuntimeError, match="second stripe failed"):  # pushed: overlapped
            w.start_sync(snapshot=True).wait(timeout_s=20)
        assert w.syncs == w.sync_stats.syncs == 1
        w.start_sync(snapshot=True).wait(timeout_s=20)
        assert w.syncs == w.sync_stats.syncs == 2
    serving.join()


# -- start(snapshot=False): the background thread runs sync's own update on the parameters --

def downpour_sgd():
    from platoon import SGD, Downpour
    rule = Downpour(SGD(0.2, 0.9, nesterov=True))
    rule.check(make_params(0))
    rule.state = [np.zeros(s, np.float32) for s in SHAPES]  # what Worker.attach would map
    return rule


@pytest.mark.parametrize("timeout_s", [20, None])  # None: wait takes over pending stripes
@pytest.mark.parametrize("rule_class", [lambda: EASGD(0.3), ASGD, downpour_sgd],
                         ids=["easgd", "asgd", "downpour_sgd"])
def test_sync_without_snapshot_is_bit_identical_to_sync_params(centre_pair, rule_class,
                                                                timeout_s):
    centre, _ = centre_pair

    def three_syncs(live):
        for c, v in zip(centre.arrays, make_params(2)):
            c[...] = v
        xs = make_params(3)
        ex = attach_worker(centre, rule_class(), xs, timeout_s=20)
        for r in range(3):
            for x, d in zip(xs, make_params(30 + r)):
                x += d  # trained before the sync starts
            if live:
                handle = ex.start(snapshot=False)
                assert handle.snapshot is False
                handle.wait(timeout_s=timeout_s)
            else:
                ex.sync()
        assert ex.stats.syncs == 3
        if live:
            assert ex._snapshots is None  # no copy was ever made
        ex.close(5.0)
        return xs + [c.copy() for c in centre.arrays]

    want = three_syncs(False)
    got = three_syncs(True)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


def test_reads_while_a_sync_without_snapshot_runs_see_each_element_before_or_after(
        centre_pair):
    centre, other = centre_pair
    for c, v in zip(centre.arrays, make_params(2)):
        c[...] = v
    xs = make_params(3)
    ex = attach_worker(centre, EASGD(0.5), xs, timeout_s=20)
    before = [x.copy() for x in xs]
    held = centre.stripes[-1]
    other.stripe_locks[len(centre.stripes) - 1].acquire()  # keeps the sync in flight
    try:
        handle = ex.start(snapshot=False)
        seen = [[x.copy() for x in xs] for _ in range(3)]  # read while it runs
        with pytest.raises(SyncTimeout):
            handle.wait(timeout_s=0.05)
        for index, start, stop in held:  # the stripe still locked is not touched
            np.testing.assert_array_equal(xs[index].reshape(-1)[start:stop],
                                          before[index].reshape(-1)[start:stop])
    finally:
        other.stripe_locks[len(centre.stripes) - 1].release()
    handle.wait(timeout_s=20)
    for reading in seen:
        for r, b, a in zip(reading, before, xs):
            assert np.all((r == b) | (r == a))
    assert any(not np.array_equal(b, a) for b, a in zip(before, xs))


def test_parameters_that_are_not_contiguous_are_copied_anyway():
    params = [np.arange(40, dtype=np.float64).reshape(4, 10)[:, ::2]]  # a strided view
    layout = layout_of([np.ascontiguousarray(params[0])])
    centre = SharedCentre.create("xchg%d" % os.getpid() + os.urandom(4).hex(), layout)
    try:
        centre.arrays[0][...] = 1.0
        ex = attach_worker(centre, EASGD(0.5), params)
        want = 0.5 * (np.arange(40.0).reshape(4, 10)[:, ::2] + 1.0)
        handle = ex.start(snapshot=False)
        assert handle.snapshot is True
        handle.wait(timeout_s=20)
        np.testing.assert_array_equal(params[0], want)
        np.testing.assert_array_equal(centre.arrays[0], want)
        ex.close(5.0)
    finally:
        centre.close()
        centre.unlink()


def test_worker_start_sync_without_snapshot_with_torch_tensors(serve):
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as a, Worker(ctl.control_port, timeout_s=10) as b:
        a.init_shared_params([np.full(4, 2.0, np.float32)], EASGD(0.5))
        t = torch.zeros(4)
        b.init_shared_params([t], EASGD(0.5))
        t += 2.0
        handle = b.start_sync(snapshot=False)
        assert handle.snapshot is False
        handle.wait(timeout_s=10)
        torch.testing.assert_close(t, torch.full((4,), 3.0))  # 4 - 0.5 * (4 - 2)
        np.testing.assert_array_equal(ctl.centre[0], 3.0)
        assert b.syncs == 1
        b.start_sync(snapshot=False)      # never waited for: close() finishes it
    serving.join()
    torch.testing.assert_close(t, torch.full((4,), 3.0))


class _Recording(EASGD):
    """EASGD that notes which thread updated each stripe (and can fail on one of them). With
    `await_helper`, the caller's first stripe waits (10 s at most) until a helper thread has
    taken one: on a loaded machine the caller may otherwise do every stripe before a helper
    is scheduled."""

    def __init__(self, alpha, fail_at=None, await_helper=False):
        super().__init__(alpha)
        self.threads, self.fail_at, self._lock = [], fail_at, threading.Lock()
        self.helper_took_one = threading.Event()
        self.await_helper = await_helper

    def update_range(self, index, start, local, central):
        name = threading.current_thread().name
        with self._lock:
            self.threads.append(name)
            if self.fail_at is not None and len(self.threads) == self.fail_at:
                raise RuntimeError("update failed on stripe call %d" % self.fail_at)
        if name == "platoon-sync-helper":
            self.helper_took_one.set()
        elif self.await_helper:
            self.await_helper = False
            self.helper_took_one.wait(10)
        super().update_range(index, start, local, central)


@pytest.mark.parametrize("threads", ["1", "2", "4"])
def test_a_sync_on_several_threads_is_bit_identical_and_uses_them(centre_pair, monkeypatch,
                                                                 threads):
    """PLATOON_SYNC_THREADS: helper threads take stripes beside the caller (the compiled
    kernels release the GIL); every stripe is updated once, to the same bits."""
    monkeypatch.setenv("PLATOON_SYNC_THREADS", threads)
    centre, other = centre_pair
    for c, v in zip(centre.arrays, make_params(1)):
        c[...] = v
    xs, want_x, want_c = make_params(2), make_params(2), make_params(1)
    rule = _Recording(0.3, await_helper=threads != "1")
    ex = attach_worker(centre, rule, xs)
    for _ in range(3):
        ex.sync()
        naive(rule, want_x, want_c)
    for got, want in zip(xs + centre.arrays, want_x + want_c):
        assert got.tobytes() == want.tobytes()
    assert len(rule.threads) == 3 * sum(len(s) for s in centre.stripes)
    helpers = {name for name in rule.threads if name == "platoon-sync-helper"}
    assert bool(helpers) == (threads != "1")
    assert ex.stats.syncs == 3 and _all_stripes_free(other)
    ex.close(5.0)


def test_a_failing_or_blocked_stripe_on_a_helper_thread_fails_the_sync_and_frees_every_lock(
        centre_pair, monkeypatch):
    monkeypatch.setenv("PLATOON_SYNC_THREADS", "2")
    centre, other = centre_pair
    ex = attach_worker(centre, _Recording(0.5, fail_at=4), make_params(4))
    with pytest.raises(RuntimeError, match="stripe call 4"):
        ex.sync()
    assert _all_stripes_free(other) and ex.stats.syncs == 0
    ex.rule.fail_at = None
    ex.timeout_s = 0.2
    other.stripe_locks[5].acquire()
    try:
        with pytest.raises(LockTimeout, match="stripe 5"):
            ex.sync()
    finally:
        other.stripe_locks[5].release()
    assert _all_stripes_free(other)
    ex.sync()  # syncs again
    ex.close(5.0)


def test_bad_sync_thread_settings_say_what_to_give(monkeypatch):
    from platoon._worker.exchange import default_sync_threads
    for bad in ("two", "0"):
        monkeypatch.setenv("PLATOON_SYNC_THREADS", bad)
        with pytest.raises(ValueError, match="PLATOON_SYNC_THREADS"):
            default_sync_threads()
    monkeypatch.delenv("PLATOON_SYNC_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the launcher's share of the cores
    assert default_sync_threads() == 1


def test_the_default_start_sync_takes_the_path_that_cost_the_caller_less():
    """Pure logic of OverlapChoice: at once first (it measures the sync); for syncs of 1 ms
    and more, the cheaper path by the median of each one's last 9, the other tried every
    16th sync, so a change in the compute beside the sync is noticed."""
    from platoon._worker.exchange import OverlapChoice
    choice = OverlapChoice()
    assert choice.choose() == choice.AT_ONCE  # nothing measured: at once
    choice.record(choice.AT_ONCE, 2e-3)
    assert choice.choose() == choice.OVERLAP  # then the other
    choice.record(choice.OVERLAP, 4e-3)
    picks = [choice.choose() for _ in range(32)]
    assert picks.count(choice.OVERLAP) == 2 and picks.count(choice.AT_ONCE) == 30
    for _ in range(5):  # overlapping became cheap (more compute to hide behind)
        choice.record(choice.OVERLAP, 1e-4)
    assert [choice.choose() for _ in range(3)] == [choice.OVERLAP] * 3


def test_one_slow_sync_does_not_turn_the_default_start_sync():
    """A sync at once that lost a time slice to another process (here 1 s where the others
    took 2 ms) is one measurement of 9 in a median. Before: a running mean jumped past the
    overlap's cost and the next 16 syncs or more overlapped."""
    from platoon._worker.exchange import OverlapChoice
    choice = OverlapChoice(probe_every=1000)
    choice.choose()
    for _ in range(9):
        choice.record(choice.AT_ONCE, 2e-3)
        choice.record(choice.OVERLAP, 3e-3)
    choice.record(choice.AT_ONCE, 1.0)
    assert [choice.choose() for _ in range(20)] == [choice.AT_ONCE] * 20


def test_a_sync_under_a_millisecond_is_never_overlapped():
    """Overlapping saves the caller at most the sync's own time and costs it a copy, a pull
    and a hand-off: syncs at once whose median is under 1 ms stay at once, even when an
    overlap once measured cheaper, and no overlap is tried. Before: the first default
    start_sync() overlapped, and every 16th after it."""
    from platoon._worker.exchange import OverlapChoice
    choice = OverlapChoice()
    choice.record(choice.OVERLAP, 1e-5)
    picks = []
    for _ in range(100):
        picks.append(choice.choose())
        choice.record(picks[-1], 1.6e-4)
    assert picks == [choice.AT_ONCE] * 100
    for _ in range(5):  # the syncs grew (a larger model, contention): overlapping is tried
        choice.record(choice.AT_ONCE, 5e-3)
    assert choice.OVERLAP in [choice.choose() for _ in range(16)]


def test_default_start_sync_of_a_short_sync_is_done_when_it_returns(serve):
    """A sync of 1000 floats takes microseconds: the default start_sync() does it before
    returning (no copy, no thread hand-off), and it equals sync_params() bit for bit: two
    jobs from the same values, one syncing with sync_params(), one with start_sync()+wait(),
    end with the same parameters and centre."""
    results = []
    for use_start in (False, True):
        ctl = Controller(control_port=0, num_workers=1)
        serving = serve(ctl)
        with Worker(ctl.control_port, timeout_s=10) as w:
            p = [np.random.default_rng(0).normal(size=1000).astype(np.float32)]
            w.init_shared_params(p, EASGD(0.3))
            for r in range(40):
                p[0] *= np.float32(0.99)  # a step between syncs
                if use_start:
                    handle = w.start_sync()
                    assert handle.at_once and handle.done(), r
                    handle.wait()
                else:
                    w.sync_params()
            results.append((p[0].copy(), ctl.centre[0].copy()))
            assert w.syncs == 40
        serving.join()
    (p_sync, c_sync), (p_start, c_start) = results
    assert p_sync.tobytes() == p_start.tobytes() and c_sync.tobytes() == c_start.tobytes()


def test_default_start_sync_keeps_its_promise_on_either_path(serve):
    """Whichever path the measured default takes, the worker's writes between start_sync
    and wait are kept and the sync's effect lands on top: the same numbers as overlapping.
    (A short sync is always done at once: the chooser here overlaps syncs of any length.)"""
    from platoon._worker.exchange import OverlapChoice
    ctl = Controller(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        p = [np.zeros(1000)]
        w.init_shared_params(p, EASGD(0.5))
        w._exchange.overlap = OverlapChoice(at_once_below_s=0.0)
        paths = set()
        for _r in range(40):
            before, centre = p[0].copy(), ctl.centre[0].copy()
            handle = w.start_sync()
            paths.add(handle.at_once)
            p[0] += 1.0  # written while the sync may be in flight
            handle.wait()
            d = 0.5 * (before - centre)
            np.testing.assert_allclose(p[0], before - d + 1.0)
            np.testing.assert_allclose(ctl.centre[0], centre + d)
        assert paths == {True, False} and w.syncs == 40
    serving.join()


# The registered centre's sync (platoon.adapters.torch_registered) is GPU code; its stripes,
# locks, formulas and its place in the Exchange (sync, start, wait) are checked here on CPU
# tensors, with CUDA's streams and events stood in by no-ops. tests/gpu/test_gpu_registered.py
# checks it on a GPU for real.


class _NoStream:
    def __init__(self, device=None):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class _NoEvent:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


def _device_sync_job(torch, serve, on_device, rule, mode):
    """Parameters and centre after three syncs by `mode` (the other worker's moves of the
    centre stood in by edits of the controller's view), on the host kernels or through a
    RegisteredSync on the same tensors."""
    from platoon.adapters.torch_registered import RegisteredSync
    gen = torch.Generator().manual_seed(27)
    params = [torch.randn(800_003, generator=gen), torch.randn(1001, generator=gen)]
    ctl = Controller(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=20) as w:
        w.init_shared_params(params, rule)
        if on_device:
            exchange = w._exchange  # noqa: SLF001
            exchange.device = RegisteredSync(lambda: params, rule, exchange.centre, 20)
        for step in range(3):
            for p in params:
                p.add_(torch.randn(p.shape, generator=gen))
            for c in ctl.centre:
                c *= np.float32(0.875)
                c += np.float32(0.0625 * (step + 1))
            if mode == "sync_params":
                w.sync_params()
            elif mode == "locked":
                with w.lock(10):
                    w.sync_params()
            elif mode == "live":
                w.start_sync(snapshot=False).wait()
            else:
                handle = w.start_sync(snapshot=True)
                for p in params:
                    p.add_(torch.randn(p.shape, generator=gen))
                handle.wait(20 if mode == "snapshot" else None)
        assert w.syncs == 3
        out = [p.numpy().copy() for p in params] + [c.copy() for c in ctl.centre]
    serving.join()
    return out


class _NamedEASGD(EASGD):
    """A user's subclass that changes no maths: it keeps EASGD's device kernels."""

    def __repr__(self):
        return "NamedEASGD(%r)" % self.alpha


@pytest.mark.parametrize("rule,mode", [(rule, mode) for rule in ("easgd", "asgd") for mode in (
    "sync_params", "locked", "live", "snapshot", "snapshot-take")] + [("subclass", "snapshot")])
def test_the_registered_sync_matches_the_host_kernels_bit_for_bit(serve, monkeypatch, rule, mode):
    torch = pytest.importorskip("torch")
    for name, stand_in in (("Stream", _NoStream), ("Event", _NoEvent),
                           ("current_stream", _NoStream),
                           ("stream", lambda s: contextlib.nullcontext())):
        monkeypatch.setattr(torch.cuda, name, stand_in)
    make = {"easgd": lambda: EASGD(0.3), "asgd": ASGD, "subclass": lambda: _NamedEASGD(0.3)}[rule]
    host = _device_sync_job(torch, serve, False, make(), mode)
    device = _device_sync_job(torch, serve, True, make(), mode)
    assert len(host) == 4
    for i, (a, b) in enumerate(zip(host, device)):
        differ = np.flatnonzero(a.view(np.int32) != b.view(np.int32))
        assert not differ.size, "array %d: %d elements differ" % (i, differ.size)
