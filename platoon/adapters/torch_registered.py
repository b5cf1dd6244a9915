"""The registered centre: EASGD and ASGD syncs of CUDA float32 tensors on the GPU, copying
the centre's stripes straight from and to its shared memory (no host staging).

The worker's mapping of the centre is registered with CUDA once (`cuda_register`); it is
unregistered when the centre is closed. Per stripe, under the stripe's lock: the centre's
stripe is copied in on a copy stream, parameters and centre are updated on the GPU, the
stripe is copied back and an event recorded; the lock is released only once that event
has completed (the copy back has landed). Two copy streams alternate, so one stripe's copy
back overlaps the next one's copy in. The compute stream is never synchronised: the copy
streams wait on an event recorded on it when the sync starts, and every stripe's event has
completed when a sync returns. A thread never waits for a lock while it holds another.

The arithmetic is the rule's own: the device kernels it declares (`ParamSyncRule.device_kernels`;
EASGD's and ASGD's are in `platoon.rules.elastic_torch`, bit-identical to the staging path).
This module asks the rule for them and holds no rule's maths: any rule that declares device
kernels runs here, and a subclass that overrides its maths syncs through staging.
"""

import collections
import logging
import time
from typing import Callable, List, Optional

import torch

from . import cuda_register

log = logging.getLogger(__name__)


def unfit(params, rule) -> Optional[str]:
    """Why `params` synced by `rule` cannot take the registered path, or None."""
    if _device_kernels(rule) is None:
        return ("the registered centre runs rules that declare device kernels (EASGD, ASGD; "
                "a subclass that overrides their maths does not), not %r" % (rule,))
    devices = {p.device for p in params}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return "the parameters are not all on one GPU (%s)" % ", ".join(sorted(map(str, devices)))
    dtypes = {p.dtype for p in params}
    if dtypes != {torch.float32}:
        return "the registered centre runs float32 only (parameters hold %s)" % ", ".join(
            sorted(str(d) for d in dtypes))
    return None


def _device_kernels(rule):
    """`rule`'s device kernels, or None (also for a rule that is no ParamSyncRule)."""
    ask = getattr(rule, "device_kernels", None)
    return ask() if ask is not None else None


def attach(params_of: Callable[[], List[torch.Tensor]], rule, centre, timeout_s
           ) -> Optional["RegisteredSync"]:
    """A RegisteredSync for the tensors `params_of()` returns, synced by `rule` with `centre`
    (a SharedCentre), or None where the staging path must run (why is logged once per
    process). Raises RegistrationRefused instead when PLATOON_REGISTERED_CENTRE=require."""
    mode = cuda_register.setting()
    if mode == cuda_register.OFF:
        return None
    params = params_of()
    why = unfit(params, rule)
    sync = None
    if why is None:
        registration = None
        try:
            registration = register_centre(centre, params[0].device.index)
            sync = RegisteredSync(params_of, rule, centre, timeout_s)
        except cuda_register.RegistrationRefused as exc:
            why = str(exc)
        except Exception as exc:  # out of GPU memory, say: staging still works
            if registration is not None:
                registration.close()
            if mode == cuda_register.REQUIRE:
                raise
            why = "%s: %s" % (type(exc).__name__, exc)
    if why is not None:
        if mode == cuda_register.REQUIRE:
            raise cuda_register.RegistrationRefused(
                "%s=require, but the registered centre cannot run: %s"
                % (cuda_register.SETTING, why))
        cuda_register.tell_fallback(why)
        return None
    log.debug("the centre %s is registered with CUDA; syncs run on %s", centre.name,
              params[0].device)
    return sync


def register_centre(centre, ordinal: int):
    """Register `centre`'s whole mapping with CUDA device `ordinal`, unregistered when the
    centre closes; the Registration. RegistrationRefused saying why."""
    address, nbytes = centre.mapping()
    registration = cuda_register.process_registry().add(address, nbytes, ordinal=ordinal)
    try:
        probe = next((a.reshape(-1)[:1] for a in centre.arrays if a.size), None)
        if probe is not None and not torch.from_numpy(probe).is_pinned():
            raise cuda_register.RegistrationRefused(
                "PyTorch does not see the registered centre as pinned memory")
    except BaseException:
        registration.close()
        raise
    centre.on_close(registration.close)
    return registration


class RegisteredSync:
    """A rule's device kernels between CUDA float32 tensors and a registered centre (see the
    module docstring). `update` is sync_params's update; `snapshot`, `push` and `pull` are
    start_sync's with a snapshot. Stripes go in `order`; `count_hold(got, asked)` is told
    each stripe lock's hold (perf_counter when it was taken and asked for) at its release."""

    def __init__(self, params_of, rule, centre, timeout_s):
        self.kernels = _device_kernels(rule)
        if self.kernels is None:
            raise TypeError("%r declares no device kernels (see platoon.rules.base.SyncKernels)"
                            % (rule,))
        self._params_of = params_of  # the current tensors (torch may swap a parameter's data)
        self.rule = rule
        self.centre = centre
        self.timeout_s = timeout_s
        self.device = params_of()[0].device
        self._central = [torch.from_numpy(a.reshape(-1)) for a in centre.arrays]
        width = max((b - a for ranges in centre.stripes for _, a, b in ranges), default=1)
        self._bufs = [torch.empty(max(width, 1), dtype=torch.float32, device=self.device)
                      for _ in range(2)]
        self._streams = [torch.cuda.Stream(self.device) for _ in range(2)]
        self._snaps: Optional[List[torch.Tensor]] = None  # start_sync's snapshots

    def _flat(self) -> List[torch.Tensor]:
        return [p.detach().view(-1) for p in self._params_of()]

    def begin(self) -> torch.cuda.Event:
        """An event marking the calling thread's current stream (the compute stream) now; a
        sync's copies wait for it, the calling thread does not."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        return ready

    def update(self, order, ready, lock_stripes: bool, count_hold) -> None:
        """sync_params's update of the parameters and the centre, in place (stripe locks
        taken when `lock_stripes`; else the caller holds the centre or locks nothing)."""
        xs, kernels = self._flat(), self.kernels
        kernels.prepare(self.device)

        def update(i, a, b, c):
            kernels.update(i, a, b, xs[i][a:b], c)

        self._stripes(order, update, ready, lock_stripes, count_hold)

    def snapshot(self) -> torch.cuda.Event:
        """Copy the parameters into the snapshot, queued on the compute stream (nothing
        waits); the event the push waits for."""
        xs = self._flat()
        if self._snaps is None:
            self._snaps = [torch.empty_like(x) for x in xs]
        for snap, x in zip(self._snaps, xs):
            snap.copy_(x)
        return self.begin()

    def push(self, order, ready, count_hold, pushed: list) -> None:
        """Push the snapshot to the centre stripe by stripe; each stripe's ranges are appended
        to `pushed` once its copy back has landed (what `pull` may apply)."""
        snaps, kernels, stripes = self._snaps, self.kernels, self.centre.stripes
        assert snaps is not None, "push() before snapshot()"
        kernels.prepare(self.device)

        def push(i, a, b, c):
            kernels.push(i, a, b, snaps[i][a:b], c)

        self._stripes(order, push, ready, True, count_hold,
                      landed=lambda k: pushed.extend(stripes[k]))

    def pull(self, ranges) -> None:
        """Apply pushed `ranges` to the parameters, queued on the calling thread's current
        stream, by the rule's device kernels' `pull`."""
        xs, snaps = self._flat(), self._snaps
        assert snaps is not None, "pull() before snapshot()"
        for i, a, b in ranges:
            self.kernels.pull(i, a, b, xs[i][a:b], snaps[i][a:b])

    def _stripes(self, order, op, ready, lock_stripes, count_hold, landed=None) -> None:
        """For each stripe k of `order`: lock it (when `lock_stripes`), copy the centre's
        ranges in, op(index, start, stop, centre_on_gpu), copy them back, release the lock
        once the copy back has landed, then call landed(k). Returns when every copy has
        landed and every lock taken is released, also when it raises."""
        stripes, locks, central = self.centre.stripes, self.centre.stripe_locks, self._central
        inflight: collections.deque = collections.deque()  # (stripe, event, taken, asked)

        def finish_oldest():
            k, event, got, asked = inflight.popleft()
            try:
                event.synchronize()  # the stripe's copy back has landed
                if landed is not None:
                    landed(k)
            finally:
                if lock_stripes:
                    locks[k].release()
                count_hold(got, asked)

        for stream in self._streams:
            stream.wait_event(ready)
        try:
            for n, k in enumerate(order):
                asked = time.perf_counter()
                if lock_stripes and not locks[k].try_acquire():
                    while inflight:  # never wait for a lock while holding one
                        finish_oldest()
                    locks[k].acquire(self.timeout_s)
                got = time.perf_counter()
                # stream and buffer n % 2 were last used by stripe n - 2, finished above
                stream, buf = self._streams[n % 2], self._bufs[n % 2]
                try:
                    with torch.cuda.stream(stream):
                        for i, a, b in stripes[k]:
                            c = buf[:b - a]
                            c.copy_(central[i][a:b], non_blocking=True)
                            op(i, a, b, c)
                            central[i][a:b].copy_(c, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(stream)
                except BaseException:
                    try:
                        stream.synchronize()  # what was queued lands before the lock goes
                    finally:
                        if lock_stripes:
                            locks[k].release()
                    raise
                inflight.append((k, event, got, asked))
                if len(inflight) > 1:
                    finish_oldest()
            while inflight:
                finish_oldest()
        finally:
            while inflight:  # after an error: the rest land and are released too
                try:
                    finish_oldest()
                except Exception as exc:
                    log.warning("a stripe of a failed GPU sync did not finish cleanly: %s", exc)
