"""The controller's checkpoints: periodic ones on a thread, the final one, and resuming.

The file format is `platoon._centre.checkpoint`'s; this module decides when to write
and what to do when writing fails (log it and retry a period later: never fatal).
"""

import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import protocol
from .._centre.checkpoint import load, load_states, names_in, save
from ..errors import LayoutMismatch, PlatoonError
from .config import ControllerConfig
from .services import ControllerServices

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class Checkpointer:
    """Writes `ctl`'s centre (and `collectives`' shared states) to the checkpoint path.

    `ctl` provides `job_id`, `shared_centre` and `param_names`; `settings()` gives the
    controller's one `ControllerConfig`, read at each use: `checkpoint_path`,
    `checkpoint_every_s` (None: never; the period of the checkpoints `tick` starts on a
    thread) and `checkpoint_lock_timeout_s`. `resumed_job_id`: the job that wrote the
    checkpoint this one resumed from; `dir_fd`: the directory of the path configured now,
    opened by the launcher, that checkpoints to that path are written in whatever the
    path leads to later.
    """

    def __init__(self, ctl: ControllerServices, collectives,
                 settings: Callable[[], ControllerConfig],
                 resumed_job_id: Optional[str] = None, dir_fd: Optional[int] = None):
        self._ctl = ctl
        self._settings = settings
        self._pinned = (settings().checkpoint_path, dir_fd) if dir_fd is not None else None
        self._resumed_job_id = resumed_job_id
        self._collectives = collectives
        self._written = time.monotonic()
        self._thread: Optional[threading.Thread] = None  # the periodic one being written
        self._failures = 0  # periodic checkpoints failed in a row

    @property
    def path(self) -> Optional[str]:
        return self._settings().checkpoint_path

    @property
    def every_s(self) -> Optional[float]:
        return self._settings().checkpoint_every_s

    @property
    def lock_timeout_s(self) -> float:
        return self._settings().checkpoint_lock_timeout_s

    def write(self, path: Optional[str] = None) -> str:
        """Write the centre to `path` (default: `self.path`) atomically; returns the path.
        Raises PlatoonError (no centre, no path), LockTimeout, OSError."""
        path = path or self.path
        if not path:
            raise PlatoonError("no checkpoint path: pass checkpoint_path to the Controller")
        centre = self._ctl.shared_centre
        if centre is None:
            raise PlatoonError("no centre yet: no worker has called init_shared_params()")
        if not self._ctl.centre_ready:
            raise PlatoonError("no worker has written the centre's first values yet (its "
                               "first worker is inside init_shared_params()); checkpoint "
                               "once it has returned")
        arrays, states = self._copy(centre)
        meta = {"job_id": self._ctl.job_id, "time": time.time(), "layout": centre.layout}
        if self._ctl.param_names is not None:
            meta["names"] = self._ctl.param_names
        pinned = self._pinned
        save(path, arrays, meta, states, job_id=self._ctl.job_id,
             resumed_job_id=self._resumed_job_id,
             dir_fd=pinned[1] if pinned is not None and pinned[0] == path else None)
        self._written = time.monotonic()
        log.info("centre checkpointed to %s", path)
        return path

    def _copy(self, centre) -> Tuple[List[np.ndarray], Dict[str, List[np.ndarray]]]:
        """Copies of the centre and of every shared state, taken in one critical section:
        the whole lock excludes every stripe's, so no push (which changes a stripe of the
        centre and the same stripe of a rule's state together) lands between the two.
        LockTimeout if the lock is not free within `lock_timeout_s`."""
        centre.lock.acquire(self.lock_timeout_s)
        try:
            arrays = [a.copy() for a in centre.arrays]
            states = {name: [a.copy() for a in state]
                      for name, state in self._collectives.states.items()}
        finally:
            centre.lock.release()
        return arrays, states

    def tick(self, now: float) -> None:
        """Start a periodic checkpoint on its own thread if one is due."""
        if not (self.every_s and self.path and self._ctl.centre_ready
                and now - self._written >= self.every_s):
            return
        self._written = now  # the next attempt is a period later, whatever happens
        if self._thread is not None and self._thread.is_alive():
            log.debug("checkpoint to %s still being written: this period's is skipped",
                      self.path)
            return
        self._thread = threading.Thread(target=self._periodic, name="platoon-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _periodic(self) -> None:
        """A checkpoint on its own thread; a failure is logged (once in a row) and the next
        period retries."""
        path = self.path
        try:
            self.write(path)
        except Exception as exc:  # never fatal: the job goes on, the next period retries
            self._failures += 1
            if self._failures == 1:
                log.warning("periodic checkpoint to %s failed (%s: %s); serving goes on and it "
                            "is retried every %.3g s", path, type(exc).__name__, exc,
                            self.every_s)
            else:
                log.debug("periodic checkpoint to %s failed again (%d in a row): %s",
                          path, self._failures, exc)
            return
        if self._failures:
            log.warning("checkpoint to %s written again after %d failed attempt(s)",
                        path, self._failures)
            self._failures = 0

    def join(self) -> None:
        """Wait (bounded) for the periodic checkpoint being written, if any."""
        thread = self._thread
        if thread is None:
            return
        bound = 2 * self.lock_timeout_s + 120.0  # two lock waits, then the write
        thread.join(bound)
        if thread.is_alive():
            log.error("periodic checkpoint to %s still being written after %.3g s; not waiting "
                      "for it any longer", self.path, bound)

    def final(self) -> None:
        """The checkpoint when `serve` ends. A failure is logged, not raised, so it never
        hides how `serve` ended; the last periodic checkpoint stays."""
        self.join()
        if not self._ctl.centre_ready or not self.path:  # nothing of the job's to save
            return
        try:
            self.write()
        except Exception as exc:
            log.error("final checkpoint to %s failed (%s: %s); call checkpoint() again, or "
                      "resume from the last periodic one", self.path, type(exc).__name__, exc)


class Resume:
    """A checkpoint to initialise the centre from, read (and checked) at once so a bad one
    fails the controller at start rather than a worker later: its centre and its sync rules'
    shared states (read again, checked again, when a rule asks for one)."""

    def __init__(self, path: str, *, allow_nonfinite: bool = False):
        self.path = path
        arrays, meta = load(path, allow_nonfinite=allow_nonfinite)
        load_states(path, allow_nonfinite=allow_nonfinite)  # CheckpointError if unfit
        self._arrays: Optional[List[np.ndarray]] = arrays
        self.names: Optional[List[str]] = names_in(meta, len(arrays), path)  # None: unnamed
        job_id = meta.get("job_id") if isinstance(meta, dict) else None
        self.job_id: Optional[str] = job_id if isinstance(job_id, str) and job_id else None

    def arrays_for(self, layout: list, worker_id: int) -> Optional[List[np.ndarray]]:
        """The checkpoint's arrays (None once `release`d); LayoutMismatch if they do not fit
        `layout`, the parameters worker `worker_id` registers."""
        arrays = self._arrays
        if arrays is None:
            return None
        mismatch = protocol.describe_mismatch(layout, protocol.layout_of(arrays))
        if mismatch:
            raise LayoutMismatch("worker %d: %s (the centre comes from checkpoint %s)"
                                 % (worker_id, mismatch.replace("job's centre", "checkpoint"),
                                    self.path))
        return arrays

    def release(self) -> None:
        """The arrays are in the centre now: drop them."""
        self._arrays = None
