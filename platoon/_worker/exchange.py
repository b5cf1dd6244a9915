"""The sync path: a worker's parameters meet the centre, one locked stripe at a time.

`Exchange.sync` updates the worker's parameters and the centre in place.
`Exchange.start` snapshots the parameters and pushes the snapshot to the
centre in a background thread; `SyncHandle.wait` then pulls the result into
the parameters, keeping whatever the worker changed in the meantime. With
``snapshot=False`` the background thread runs `sync`'s own in-place update on
the parameters instead (no copy, no pull; the worker must not write them
until `wait`).

Only the centre's own reads and writes happen under a lock, and only under the
lock of the stripe being updated. Each stripe's update is atomic with respect
to other workers; a whole sync is not (another worker may sync stripe 2 between
this worker's stripes 1 and 3), exactly as independent syncs of smaller models.

Where the adapter offers a device sync (`device`: the registered centre, for CUDA float32
tensors under EASGD or ASGD, see `platoon.adapters.torch_registered`), `sync` and `start`
run on the GPU against the centre's registered memory instead of the host arrays, with the
same stripes, locks and results; the background thread then waits on CUDA events only.
"""

import collections
import contextlib
import logging
import os
import statistics
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, cast

import numpy as np

from .. import protocol
from .._centre.shmem import SharedCentre
from .._deprecation import renamed_keywords
from ..errors import LayoutMismatch, LockTimeout, PlatoonError, RemoteError, SyncTimeout
from ..rules import ParamSyncRule

log = logging.getLogger(__name__)

_STRIPE_PAUSE_S = (5e-6, 200e-6)  # back-off while every wanted stripe is busy


@dataclass
class SyncStats:
    """Counters of a worker's syncs (times in seconds, from `time.perf_counter`)."""

    syncs: int = 0           # completed syncs, synchronous or not
    lock_hold_s: float = 0.0  # total time a lock of the centre was held
    lock_wait_s: float = 0.0  # total time spent waiting for busy stripes
    max_hold_s: float = 0.0   # longest single hold

    @property
    def mean_hold_s(self) -> float:
        """Mean time a lock was held per sync."""
        return self.lock_hold_s / self.syncs if self.syncs else 0.0


def _take_free(pending: List[int], locks) -> Optional[int]:
    """Lock the first stripe of `pending` whose lock is free and remove it from the list;
    None (nothing taken) when every pending stripe is busy."""
    for pos, k in enumerate(pending):
        if locks[k].try_acquire():
            del pending[pos]
            return k
    return None


class _AllBusy:
    """The back-off of a sync while every stripe it still needs is locked by others: sleeps
    growing from _STRIPE_PAUSE_S[0] to [1], until `timeout_s` has passed since it began."""

    def __init__(self, timeout_s: Optional[float]):
        self.timeout_s = timeout_s
        self.give_up = None if timeout_s is None else time.monotonic() + timeout_s
        self.pause = _STRIPE_PAUSE_S[0]
        self.since: Optional[float] = None  # perf_counter() when this wait began

    def wait(self, locks, pending: List[int]) -> None:
        """Sleep a while; once the sync's timeout has passed, raises the LockTimeout of the
        first pending stripe's lock instead."""
        if self.since is None:
            self.since = time.perf_counter()
        if self.give_up is not None and time.monotonic() >= self.give_up:
            raise locks[pending[0]].timeout_error(self.timeout_s)
        time.sleep(self.pause)
        self.pause = min(2 * self.pause, _STRIPE_PAUSE_S[1])

    def took(self, got: float) -> float:
        """A stripe was taken at `got` (perf_counter): the seconds waited for it (0.0 when
        it was free at once); the back-off starts over."""
        waited = 0.0 if self.since is None else got - self.since
        self.since, self.pause = None, _STRIPE_PAUSE_S[0]
        return waited


class _SyncThread:
    """The persistent thread that runs an Exchange's background work, one task at a time
    (starting a thread per sync cost about as much as syncing 1M floats)."""

    def __init__(self, name: str = "platoon-sync"):
        # Woken by releasing `_wake` (a lock held while there is nothing to do): one futex
        # wake-up, where a Condition's notify and wait cost the GIL several Python calls in
        # both threads (a sync of 1M floats lasts about 0.1 ms).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._tasks: collections.deque = collections.deque()  # appends and pops are atomic
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def run(self, task: Callable[[], None]) -> None:
        """Run `task` (which must not raise) in the thread, after the tasks before it."""
        self._tasks.append(task)
        self._signal()

    def _signal(self):
        try:
            self._wake.release()
        except RuntimeError:  # already released: the thread has yet to wake up and look
            pass

    def _loop(self):
        wake, tasks = self._wake, self._tasks
        while True:
            wake.acquire()  # returns at once if run() or close() released it since the last look
            while tasks:
                tasks.popleft()()
            if self._closed:
                return

    @property
    def alive(self) -> bool:
        """False after `close`, or in a process forked from the one that started it."""
        return self._thread.is_alive() and not self._closed

    def close(self) -> None:
        """Let the thread end once its tasks are done. Idempotent."""
        self._closed = True
        self._signal()


def default_sync_threads() -> int:
    """Threads one sync's host update may use: ``PLATOON_SYNC_THREADS`` if set, else the cores
    this process may run on, at most ``OMP_NUM_THREADS`` (the launcher's share of the cores
    for each worker) and at most 8 (memory bandwidth, not cores, bounds the update)."""
    text = os.environ.get("PLATOON_SYNC_THREADS", "").strip()
    if text:
        try:
            threads = int(text)
        except ValueError:
            raise ValueError("PLATOON_SYNC_THREADS=%r is not an integer; give the number of "
                             "threads a sync may use (1: the calling thread only)" % text) from None
        if threads < 1:
            raise ValueError("PLATOON_SYNC_THREADS=%d: give at least 1" % threads)
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    try:
        cores = min(cores, int(os.environ.get("OMP_NUM_THREADS", "") or cores))
    except ValueError:
        pass
    return max(1, min(cores, 8))


class _StripePool:
    """Helper threads that take stripes of a sync beside the calling thread (the compiled
    kernels release the GIL, so stripes update on several cores at once)."""

    MIN_STRIPES_PER_THREAD = 2  # fewer, and the hand-off costs more than it saves

    def __init__(self, threads: int):
        self.threads = threads
        self._helpers: List[_SyncThread] = []

    def helpers_for(self, stripes: int) -> int:
        """How many helper threads a sync of `stripes` stripes should use."""
        return max(0, min(self.threads, stripes // self.MIN_STRIPES_PER_THREAD) - 1)

    def run(self, task: Callable[[], None], helpers: int) -> None:
        """Run `task` (which must not raise) in `helpers` helper threads and in the calling
        thread; return when every copy has returned."""
        self._helpers = [h for h in self._helpers if h.alive]  # none in a forked child
        while len(self._helpers) < helpers:
            self._helpers.append(_SyncThread("platoon-sync-helper"))
        latches = []
        for helper in self._helpers[:helpers]:
            done = threading.Lock()
            done.acquire()

            def part(done=done):
                task()
                done.release()

            helper.run(part)
            latches.append(done)
        task()
        for done in latches:
            done.acquire()  # each helper's task ends (its loop is bounded by the sync's timeout)

    def close(self) -> None:
        for helper in self._helpers:
            helper.close()
        self._helpers = []


class OverlapChoice:
    """Chooses the path of a default `start_sync()`: the sync at once, or overlap (a snapshot
    pushed by the sync thread), whichever cost the calling thread less by the median of each
    path's last KEPT syncs (a time slice lost to another process in one sync barely moves a
    median), trying the other every `probe_every` syncs. It starts at once, and stays there
    while the median sync at once takes under `at_once_below_s`: an overlap saves the caller
    at most the sync's own time, and costs it a copy, a pull (together more memory traffic
    than the sync) and a hand-off to the sync thread, so a short sync only loses by it."""

    OVERLAP, AT_ONCE = "overlap", "at once"
    KEPT = 9  # measurements per path the median is taken over

    def __init__(self, probe_every: int = 16, at_once_below_s: float = 1e-3):
        self.probe_every = probe_every
        self.at_once_below_s = at_once_below_s
        self.cost: Dict[str, Optional[float]] = {self.OVERLAP: None, self.AT_ONCE: None}
        self._kept: Dict[str, Deque[float]] = {path: collections.deque(maxlen=self.KEPT)
                                               for path in self.cost}
        self._count = 0

    def choose(self) -> str:
        self._count += 1
        overlap, at_once = self.cost[self.OVERLAP], self.cost[self.AT_ONCE]
        if at_once is None or at_once < self.at_once_below_s:
            return self.AT_ONCE
        if overlap is None:
            return self.OVERLAP
        best, other = (self.OVERLAP, self.AT_ONCE) if overlap <= at_once \
            else (self.AT_ONCE, self.OVERLAP)
        return other if self._count % self.probe_every == 0 else best

    def record(self, path: str, seconds: float) -> None:
        """The calling thread spent `seconds` on a sync that took `path`."""
        kept = self._kept[path]
        kept.append(seconds)
        self.cost[path] = statistics.median(kept)


_NO_BACKGROUND = threading.Event()  # the background part of every sync done at once (none)
_NO_BACKGROUND.set()  # never cleared: a handle's event is only ever set


class SyncHandle:
    """An asynchronous sync started by `Worker.start_sync`; call `wait` to finish it.

    `snapshot` is True when the parameters were copied first, False when the sync
    updates them in place (``start_sync(snapshot=False)`` on C-contiguous parameters) or
    was done before `start_sync` returned (`at_once` True: `wait` has nothing to do).
    """

    def __init__(self, exchange: "Exchange", snapshot: bool = True, generation: int = 0,
                 choice: Optional["OverlapChoice"] = None, at_once: bool = False) -> None:
        self._exchange = exchange
        self._generation = generation  # which of the exchange's syncs this is
        self.snapshot = snapshot  # True: the parameters were copied; False: synced in place
        self.at_once = at_once  # True: synced before start_sync returned (see `finished`)
        self._choice = choice  # told what the sync cost the caller, when it chose the path
        self._caller_s = 0.0  # the calling thread's seconds on this sync so far
        self._errors: list = []
        self._finished = at_once
        # set when the push in the thread ends (a sync done at once has none: set already)
        self._background_done = _NO_BACKGROUND if at_once else threading.Event()

    @classmethod
    def finished(cls, exchange: "Exchange") -> "SyncHandle":
        """The handle of a sync that `start_sync` did at once: done, `wait` does nothing."""
        return cls(exchange, snapshot=False, at_once=True)

    def add_caller_time(self, seconds: float) -> None:
        """The calling thread spent `seconds` more on this sync (in `start_sync`)."""
        self._caller_s += seconds

    def start(self) -> None:
        """Run the push in the background (`Exchange.start` calls it)."""
        self._exchange.in_background(self._push)

    def _push(self):
        """The background part (in the sync thread)."""
        try:
            self._exchange.push_background(self._generation)
        except BaseException as exc:  # raised again by wait()
            self._errors.append(exc)
        finally:
            self._background_done.set()

    def done(self) -> bool:
        """True once the background part has finished (`wait` will not block)."""
        return self._background_done.is_set()

    @renamed_keywords(timeout="timeout_s")
    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Finish the sync: apply its result to the worker's parameters (a sync without
        snapshot has already updated them in place: `wait` only finishes its stripes).

        `timeout_s` in float seconds (None: forever); raises SyncTimeout if the
        background part is still running then (the sync stays in flight; call
        `wait` again). Raises the background part's error, if any (LockTimeout
        when a stripe stayed locked past the worker's timeout_s), after applying
        the stripes it did push (their effect on the centre is not lost); every
        lock is released. Without a timeout, the calling thread does what the
        background part has not started yet (with rules declaring
        ``concurrent_stripes``), in one pass per stripe.
        Calling `wait` again after it returned or raised does nothing.
        """
        if self._finished:
            return
        began = time.perf_counter()
        try:
            self._finish(timeout_s)
        finally:
            self._caller_s += time.perf_counter() - began
            if self._finished and self._choice is not None:
                self._choice.record(OverlapChoice.OVERLAP, self._caller_s)

    def _finish(self, timeout_s: Optional[float]) -> None:
        if timeout_s is None and not self._background_done.is_set():
            try:
                self._exchange.take_over()
            except BaseException as exc:  # as the background part's own errors
                self._errors.append(exc)
            if self._exchange.background_idle():  # no need to wait for the thread to wake up
                self._background_done.set()
        if not self._background_done.wait(timeout_s):
            raise SyncTimeout("the sync started by start_sync() is still running after %.3g s; "
                              "call wait() again, or wait longer" % (timeout_s or 0.0))
        self._finished = True
        errors, self._errors = self._errors, []
        # Even when the push failed part-way, the stripes it finished moved the centre (and
        # the rule's state): their effect reaches the parameters before the error does.
        self._exchange.finish_async(complete=not errors)
        if errors:
            raise errors[0]


class Exchange:
    """Syncs one worker's parameters with the centre under a rule (see module docstring)."""

    def __init__(self, rule: ParamSyncRule, local: List[np.ndarray], centre: SharedCentre,
                 worker_id: int = 0, timeout_s: Optional[float] = None, *, first: bool = False,
                 before_pull: Optional[Callable[[], None]] = None,
                 after_pull: Optional[Callable[[], None]] = None, device: Any = None):
        """`first`: this worker's values initialised the centre. `before_pull` and
        `after_pull`: called by SyncHandle.wait before and after it applies a sync (the
        worker copies device parameters to host and back). `device`: a device sync, or
        None (see the module docstring)."""
        self.rule = rule
        self.local = local
        self.centre = centre
        self.timeout_s = timeout_s
        self.stats = SyncStats()
        self.first = first
        self._inflight: Optional[SyncHandle] = None
        self._snapshots: Optional[List[np.ndarray]] = None
        self._live = False  # the sync in flight updates the parameters in place (no snapshot)
        # The sync in flight: stripes not yet taken, ranges (index, start, stop) pushed, and
        # whether a push failed; shared by the sync thread and `wait`'s, under `_claim`.
        self._pending: List[int] = []
        self._pushed: List[tuple] = []
        self._failed = False
        self._host_ready = False
        self._taken_over = False
        self._claim = threading.Lock()
        self._generation = 0  # counts `start`s: a task of an earlier sync takes no stripe
        self._active = False  # the sync thread is in `_push_pending` (and has not failed)
        self._thread: Optional[_SyncThread] = None  # started by the first `start`
        self._pool = _StripePool(default_sync_threads())  # helper threads of `sync`
        self._pool_closer = weakref.finalize(self, self._pool.close)
        self.overlap = OverlapChoice()  # the path of a default start_sync() (Worker)
        self.before_pull = before_pull
        self.after_pull = after_pull
        self.device: Any = device
        self._device_ready: Optional[Any] = None  # the CUDA event the sync in flight waits on
        self._central = [c.reshape(-1) for c in centre.arrays]
        self.rebind()
        # This worker's sync counter in the centre's header, read by the controller's status
        # (ids past the header's slots count only in `stats`).
        counted = 0 <= worker_id < len(centre.sync_counts)
        self._counter = centre.sync_counts[worker_id:worker_id + 1] if counted \
            else np.zeros(1, np.int64)
        # Workers start on different stripes, so two of them rarely want the same one.
        count = len(centre.stripes)
        start = (worker_id * (count // 2 + 1)) % count if count else 0
        self._order = list(range(start, count)) + list(range(start))

    def rebind(self) -> None:
        """Re-derive the flat views of `local` after some of its arrays were replaced (the
        adapter re-bound tensors that torch moved in memory)."""
        local = self.local
        self._contiguous = all(p.flags.c_contiguous for p in local)
        self._striped = self.rule.elementwise and self._contiguous
        self._flat_local: List[np.ndarray] = [p.reshape(-1) for p in local] \
            if self._contiguous else []  # used by the striped paths only, which need it

    # -- synchronous --

    def sync(self, lock: bool = True) -> None:
        """Apply the rule in place to the worker's parameters and the centre (with
        lock=False, without taking any lock: the caller holds the centre's)."""
        if self._inflight is not None:
            raise PlatoonError("a sync started by start_sync() is in flight; call its wait() "
                               "before syncing again")
        if self.device is not None:  # on the GPU; stripe locks unless the caller locks
            self.device.update(self._order, self.device.begin(),
                               lock and not self.centre.lock.held, self._count_hold)
        elif not lock:
            self.rule.update_params(self.local, self.centre.arrays)
        elif not self._striped or self.centre.lock.held:
            self._whole(lambda: self.rule.update_params(self.local, self.centre.arrays))
        else:
            local, central, rule = self._flat_local, self._central, self.rule
            self._each_stripe(lambda i, a, b: rule.update_range(i, a, local[i][a:b],
                                                                central[i][a:b]))
        self.stats.syncs += 1
        self._counter[0] += 1

    def _whole(self, update):
        lock = self.centre.lock
        if lock.held:  # the caller holds the whole centre (Worker.lock)
            update()
            return
        start = time.perf_counter()
        lock.acquire(self.timeout_s)
        got = time.perf_counter()
        try:
            update()
        finally:
            lock.release()
            self._count_hold(got, start)

    def _count_hold(self, got, asked):
        held = time.perf_counter() - got
        stats = self.stats
        stats.lock_hold_s += held
        stats.lock_wait_s += got - asked
        stats.max_hold_s = max(stats.max_hold_s, held)

    def _each_stripe(self, update):
        """Call update(index, start, stop) for every range, each stripe under its lock.

        Takes whichever pending stripe is free; waits (with back-off, up to the
        timeout_s) only when all pending stripes are busy. Rules declaring
        ``concurrent_stripes`` have helper threads take stripes too (`_StripePool`).
        """
        pending = list(self._order)
        helpers = self._pool.helpers_for(len(pending)) if self.rule.concurrent_stripes else 0
        if not helpers:
            self._take_stripes(pending, update, contextlib.nullcontext(), [])
            return
        claim, errors = threading.Lock(), cast(List[BaseException], [])
        self._pool.run(lambda: self._take_stripes(pending, update, claim, errors), helpers)
        if errors:
            raise errors[0]

    def _take_stripes(self, pending, update, claim, errors):
        """One thread's part of `_each_stripe`: stripes from `pending` (shared, under
        `claim`) until none is left or a thread failed; its error is appended to `errors`
        (raised at once when `errors` is not shared)."""
        stripes, locks = self.centre.stripes, self.centre.stripe_locks
        busy = _AllBusy(self.timeout_s)
        while True:
            with claim:
                if not pending or errors:
                    return
                k = _take_free(pending, locks)
                waiting_for = pending[:1]
            try:
                if k is None:
                    busy.wait(locks, waiting_for)
                    continue
                got = time.perf_counter()
                waited = busy.took(got)
                try:
                    for index, start, stop in stripes[k]:
                        update(index, start, stop)
                finally:
                    locks[k].release()
                    with claim:
                        self.stats.lock_wait_s += waited
                        self._count_hold(got, got)
            except BaseException as exc:
                if isinstance(claim, contextlib.nullcontext):
                    raise
                with claim:
                    errors.append(exc)
                return

    # -- asynchronous --

    def start(self, snapshot: bool = True, choice: Optional[OverlapChoice] = None,
              began: Optional[float] = None) -> SyncHandle:
        """Start a sync in the background thread; returns a SyncHandle.

        snapshot=True: copy the parameters and push the copy (`wait` pulls the result
        on top of what the worker wrote meanwhile). snapshot=False: update the
        parameters and the centre in place, stripe by stripe, with the rule's
        `update_range`, as `sync` does (the caller must not write the parameters
        until `wait`); parameters that are not all C-contiguous take a snapshot anyway.
        `choice` (with `began`, the caller's perf_counter() when it started) is told what
        the sync cost the calling thread once it is finished.
        """
        self.check_async()
        live = not snapshot and self._contiguous
        if self.device is not None:  # the snapshot (if any) is queued on the compute stream
            self._device_ready = self.device.begin() if live else self.device.snapshot()
        elif not live:
            if self._snapshots is None:
                self._snapshots = [np.empty(p.size, p.dtype) for p in self.local]
            for snap, p in zip(self._snapshots, self.local):
                snap.reshape(p.shape)[...] = p
        self._generation += 1
        handle = SyncHandle(self, snapshot=not live, generation=self._generation, choice=choice)
        self._live = live
        self._pending = list(self._order)
        self._pushed = []
        self._failed = False
        # before_pull done (by `take_over`); never again while a live sync updates the host
        # arrays: copying the device's parameters over them would undo the stripes done.
        self._host_ready = live
        self._taken_over = False
        self._inflight = handle
        handle.start()
        if began is not None:
            handle.add_caller_time(time.perf_counter() - began)
        return handle

    def check_async(self) -> None:
        """Raise unless a `start` may begin now (nothing in flight, a rule with push and
        pull, the centre's whole lock not held by this thread)."""
        if self._inflight is not None:
            raise PlatoonError("a sync started by start_sync() is already in flight; call its "
                               "wait() before starting another")
        rule = self.rule
        if not (rule.supports_async and rule.elementwise):
            raise TypeError("%r does not support start_sync(): it needs a rule declaring "
                            "supports_async = True and elementwise = True, with push() and "
                            "pull() (EASGD and ASGD have them); call sync_params() instead"
                            % (rule,))
        if self.centre.lock.held:
            raise PlatoonError("start_sync() called while this thread holds the centre's lock "
                               "(Worker.lock); unlock() first, or call sync_params()")

    def in_background(self, task: Callable[[], None]) -> None:
        """Run `task` (which must not raise) in this exchange's sync thread."""
        if self._thread is None or not self._thread.alive:
            self._thread = _SyncThread()
            self._thread_closer = weakref.finalize(self, self._thread.close)
        self._thread.run(task)

    # -- what a SyncHandle calls: the push in the sync thread (and in `wait`), then the pull --

    def push_background(self, generation: int) -> None:
        """Push the snapshot `start` took to the centre (or, for a live sync, update the
        parameters and the centre in place), stripe by stripe (the sync thread), until
        `take_over`; nothing when sync number `generation` is no longer the one in flight."""
        if self.device is not None:
            self._push_on_device(generation)
            return
        self._push_pending(fuse=False, generation=generation)

    def _push_on_device(self, generation: int) -> None:
        """The device sync's background part: every stripe (no `take_over`), waiting on CUDA
        events only; a snapshot sync's finished ranges go to `_pushed` for `_pull`."""
        device = self.device
        with self._claim:
            if generation != self._generation:
                return
            self._active = True
        try:
            if self._live:
                device.update(self._order, self._device_ready, True, self._count_hold)
            else:
                device.push(self._order, self._device_ready, self._count_hold, self._pushed)
        finally:
            with self._claim:
                self._active = False

    def background_idle(self) -> bool:
        """True when the sync thread will take no more stripes of the sync in flight and is
        not in the middle of one (it has not started, or has returned without an error), so
        `wait` need not wait for it (after `take_over`)."""
        if self.device is not None:  # `wait` waits for the sync thread, which does it all
            return False
        with self._claim:
            return not self._active and (self._taken_over or self._failed or not self._pending)

    def take_over(self) -> None:
        """Push and pull, in one pass per stripe (`push_pull`), the stripes that the sync
        thread has not taken yet; the sync thread stops taking more (`SyncHandle.wait`
        calls this when it may wait as long as it takes, with rules that allow it: two
        threads taking turns at the GIL on a busy machine were slower than one)."""
        if not self.rule.concurrent_stripes or self.device is not None:
            return
        if self.before_pull is not None and not self._host_ready:
            self.before_pull()  # may re-bind the parameters
        self._host_ready = True
        if not self._contiguous:
            return
        self._taken_over = True
        self._push_pending(fuse=True)

    def _push_pending(self, fuse, generation=None):
        """Take free stripes from the shared pending list and push them (and pull them, when
        `fuse`; else only until `take_over`), until the list is empty or a push has failed;
        waits with back-off (up to the worker's timeout_s, then LockTimeout) while every
        pending stripe is busy."""
        stripes, locks, stats = self.centre.stripes, self.centre.stripe_locks, self.stats
        # the snapshots exist whenever a push reads them (start_sync made them; not when live)
        snaps = cast(List[np.ndarray], self._snapshots)
        central, rule, local = self._central, self.rule, self._flat_local
        pending, pushed, claim, live = self._pending, self._pushed, self._claim, self._live
        busy = _AllBusy(self.timeout_s)
        while True:
            with claim:
                if not pending or self._failed or (self._taken_over and not fuse) \
                        or (generation is not None and generation != self._generation):
                    if not fuse:
                        self._active = False
                    return
                if not fuse:
                    self._active = True  # stays True if this raises: `wait` waits for the error
                k = _take_free(pending, locks)
            if k is None:
                try:
                    busy.wait(locks, pending)
                except LockTimeout:
                    self._failed = True
                    raise
                continue
            got = time.perf_counter()
            waited = busy.took(got)
            try:
                for index, start, stop in stripes[k]:
                    if live:  # sync's own update, on the parameters: nothing to pull
                        rule.update_range(index, start, local[index][start:stop],
                                          central[index][start:stop])
                        continue
                    if fuse:  # pulled as well: not for `_pull`
                        rule.push_pull(index, start, local[index][start:stop],
                                       snaps[index][start:stop], central[index][start:stop])
                        continue
                    rule.push(index, start, snaps[index][start:stop], central[index][start:stop])
                    with claim:
                        pushed.append((index, start, stop))
            except BaseException:
                self._failed = True
                raise
            finally:
                locks[k].release()
                with claim:
                    stats.lock_wait_s += waited
                    self._count_hold(got, got)

    def finish_async(self, complete: bool) -> None:
        """End the sync in flight: pull what its push did into the parameters (and count
        the sync when `complete`)."""
        self._inflight = None
        self._pull(complete)

    def _pull(self, complete):
        """Apply the pushed ranges to the parameters (all of them when `complete`)."""
        if self.device is not None:  # queued on the calling thread's stream; nothing staged
            if self._pushed:
                self.device.pull(self._pushed)
            self._device_ready = None
            if complete:
                self.stats.syncs += 1
                self._counter[0] += 1
            return
        if self.before_pull is not None and not self._host_ready:
            self.before_pull()
        if self._pushed:  # none for a live sync: its stripes are already in the parameters
            self._pull_ranges(self._pushed)
        if complete:
            self.stats.syncs += 1
            self._counter[0] += 1
        if self.after_pull is not None:
            self.after_pull()

    def _pull_ranges(self, ranges):
        rule, snaps = self.rule, self._snapshots
        assert snaps is not None  # a pull follows the push of a snapshot
        for index, (p, snap) in enumerate(zip(self.local, snaps)):
            mine = [(a, b) for i, a, b in ranges if i == index]
            if not mine:
                continue
            flat = p.reshape(-1)  # a view, or a copy written back below
            for a, b in mine:
                rule.pull(index, a, flat[a:b], snap[a:b])
            if not p.flags.c_contiguous:
                p[...] = flat.reshape(p.shape)

    def close(self, timeout_s: Optional[float]) -> None:
        """Finish a sync in flight (waiting at most `timeout_s`), logging its error, if any;
        then end the sync thread (unless the sync is still in flight)."""
        handle = self._inflight
        if handle is not None:
            try:
                handle.wait(timeout_s)
            except PlatoonError as exc:
                log.warning("a sync in flight at close() failed: %s", exc)
            except Exception as exc:
                log.warning("a sync in flight at close() raised %s: %s", type(exc).__name__,
                            exc)
        if self._thread is not None and self._inflight is None:
            self._thread_closer()
            self._thread = None
        self._pool_closer()


def share(request: Callable, adapter, rule: ParamSyncRule, res, worker_id: int = 0,
          timeout_s: Optional[float] = None, names: Optional[Sequence[str]] = None) -> Exchange:
    """Share `adapter`'s arrays through the job's centre; an Exchange syncing them by `rule`.

    The first worker to ask initialises the centre with its values (the
    Exchange's `first` is True); every later worker's arrays are overwritten
    with the centre. `request(req, info)` sends a control request; the centre
    is kept in `res` (a Resources), which releases it. Raises LayoutMismatch
    when the arrays differ from the centre's in number, dtype or shape (the
    centre is left untouched), TypeError for arrays `rule` cannot sync. `names` (optional)
    name the arrays in the centre's checkpoints (see `protocol.check_names`).
    """
    params = adapter.arrays
    if names is not None:
        names = protocol.check_names(names, len(params))
    for i, p in enumerate(params):
        if not p.flags.writeable:
            raise TypeError("parameter %d is read-only; sync_params updates parameters in "
                            "place, so pass writable arrays" % i)
    rule.check(params)
    layout = protocol.layout_of(params)
    try:
        info = {"layout": layout, "rule": repr(rule)}
        if names is not None:
            info["names"] = names
        reply = request(protocol.INIT_PARAMS, info)
    except RemoteError as exc:
        if exc.remote_type == LayoutMismatch.__name__:
            raise LayoutMismatch(str(exc)) from exc
        raise
    centre = res.centre = SharedCentre.attach(reply["segment"], layout)
    first = bool(reply["initialise"])
    if first:
        adapter.pull()
    centre.lock.acquire(timeout_s)
    try:
        for c, p in zip(centre.arrays, params):
            if first:
                c[...] = p
            else:
                p[...] = c
    finally:
        centre.lock.release()
    if first:
        request(protocol.PARAMS_READY)
    else:
        adapter.push()
    exchange = Exchange(rule, params, centre, worker_id, timeout_s, first=first,
                        before_pull=adapter.pull, after_pull=adapter.push,
                        device=adapter.device_sync(rule, centre, timeout_s))
    adapter.on_rebind = exchange.rebind  # the adapter was made first: it learns its exchange
    return exchange
