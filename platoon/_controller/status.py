"""The job's progress, as the launcher's status line and end-of-job summary show it: counted
by platoon (syncs in shared memory, minibatches as `send_mb` delivers them) and from the
workers' reports, and written to the launcher's status file (0600), at most twice a second.
The file's keys are listed in `platoon._os.statusfile`.
"""

import json
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._os.statusfile import MAX_METRICS, MAX_NAME, MAX_TEXT, shortened, write_status
from ..errors import ProtocolError

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name



def bounded(value: Any) -> Any:
    """A metric's value as kept: a number (an int beyond 2**53 as a float), a bool or None
    as is; anything else as text of at most MAX_TEXT characters (JSON kept as is if short)."""
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        if abs(value) <= 1 << 53:
            return value
        try:
            return float(value)
        except OverflowError:
            return "an integer of %d bits" % value.bit_length()
    if not isinstance(value, str):
        text = json.dumps(value)
        if len(text) <= MAX_TEXT:
            return value
        value = text
    return shortened(value)


def _put(kept: dict, name: str, value: Any) -> bool:
    """Keep `name`'s `value` in `kept` unless it holds MAX_METRICS other names already."""
    if name not in kept and len(kept) >= MAX_METRICS:
        return False
    kept[name] = value
    return True


class Progress:
    """Minibatches trained, syncs and the latest metrics of a job.

    `counts()` gives (workers registered, workers that left) for the status file
    at `path` (None: none is written; `dir_fd`: its directory, opened by the launcher, to
    write it in whatever the path leads to now); `counted()` gives (syncs by worker id,
    minibatches delivered), which platoon counts without reports; `extra()` gives further
    totals counted elsewhere (a multi-node job's ``tie_rounds``, ``tie_bytes_sent``).
    """

    MIN_INTERVAL_S = 0.5

    def __init__(self, path: Optional[str], counts: Callable[[], Tuple[int, int]],
                 counted: Callable[[], Tuple[List[int], int]] = lambda: ([], 0),
                 pids: Callable[[], List[int]] = list, dir_fd: Optional[int] = None,
                 extra: Callable[[], Dict[str, Any]] = dict):
        self.path = path
        self._dir_fd = dir_fd
        self._counts = counts
        self._pids = pids  # of the workers that registered: the launcher's check
        self._counted = counted
        self._extra = extra
        self.totals: Dict[str, Any] = {"minibatches": 0, "syncs": 0, "metrics": {}}
        self._reported_minibatches = 0
        self._syncs_by_worker: Dict[int, int] = {}
        self._reports: Dict[int, dict] = {}  # each worker's totals and latest metrics
        self._written = 0.0
        self.pending = False  # a report not yet written to the status file
        self.started: Optional[float] = None  # when serve started (monotonic)
        self.failure: Optional[Dict[str, Any]] = None  # what serve raised, for the launcher
        self.failed_worker: Optional[Dict[str, Any]] = None  # whose death ended serve
        self._trained: set = set()  # ids of the workers past their last sync
        self.final_result: Optional[Dict[str, Any]] = None  # {"metrics", "worker"}

    def start(self) -> None:
        """Serving starts: elapsed time counts from the first call."""
        if self.started is None:
            self.started = time.monotonic()

    def refresh(self) -> dict:
        """Update and return `totals`: each count is the larger of the reported and the
        counted one (syncs worker by worker: a replacement's reports start again at 0)."""
        counted_syncs, delivered = self._counted()
        by_worker = list(counted_syncs)  # a copy: it is added to below
        syncs = 0
        for wid, n in self._syncs_by_worker.items():
            if wid < len(by_worker):
                by_worker[wid] = max(by_worker[wid], n)
            else:
                syncs += n
        self.totals["syncs"] = syncs + sum(by_worker)
        self.totals["minibatches"] = max(self._reported_minibatches, delivered)
        self.totals.update(self._extra())
        return self.totals

    def report(self, worker_id: int, info) -> None:
        """``platoon-report`` {minibatches, syncs, metrics}: a worker's progress."""
        if not isinstance(info, dict):
            raise ProtocolError("platoon-report needs an object with minibatches, syncs, metrics")
        minibatches, syncs = info.get("minibatches"), info.get("syncs")
        metrics = info.get("metrics")
        if not (type(minibatches) is int and type(syncs) is int and minibatches >= 0
                and syncs >= 0 and isinstance(metrics, dict)):
            raise ProtocolError("platoon-report needs minibatches and syncs (integers >= 0) "
                                "and metrics (an object)")
        self.add(worker_id, minibatches, syncs, metrics)

    def add(self, worker_id: int, minibatches: int = 0, syncs: Optional[int] = None,
            metrics: Optional[dict] = None) -> None:
        """Count `minibatches` more, worker `worker_id`'s total `syncs`, the latest `metrics`."""
        self._reported_minibatches += minibatches
        if syncs is not None:
            self._syncs_by_worker[worker_id] = syncs
        report = self._reports.setdefault(worker_id, {"minibatches": 0, "syncs": 0,
                                                      "metrics": {}})
        report["minibatches"] += minibatches
        if syncs is not None:
            report["syncs"] = syncs
        self._keep(worker_id, report, metrics or {})
        self.write()

    def _keep(self, worker_id: int, report: dict, metrics: dict) -> None:
        """Keep `metrics` in the job's and the worker's: at most MAX_METRICS names each (the
        first reported), of at most MAX_NAME characters, their values `bounded`. What either
        does not keep is counted in its ``metrics_dropped``; the first drop is logged."""
        dropped = [0, 0]  # (from the job's, from the worker's)
        for name, value in metrics.items():
            name = str(name)
            if len(name) > MAX_NAME:
                dropped = [dropped[0] + 1, dropped[1] + 1]
                continue
            value = bounded(value)
            dropped[0] += not _put(self.totals["metrics"], name, value)
            dropped[1] += not _put(report["metrics"], name, value)
        if dropped[1] and not report.get("metrics_dropped"):
            log.warning("worker %d reported metrics that are not kept: the controller keeps "
                        "at most %d metric names (of up to %d characters) for the job and "
                        "for each worker, the first reported; report fewer",
                        worker_id, MAX_METRICS, MAX_NAME)
        if dropped[1]:
            report["metrics_dropped"] = report.get("metrics_dropped", 0) + dropped[1]
        if dropped[0]:
            self.totals["metrics_dropped"] = self.totals.get("metrics_dropped", 0) + dropped[0]

    def trained(self, worker_id: int, registry) -> bool:
        """Worker `worker_id` made its last sync. True, once, when it is the last of the
        workers `registry` still expects: the centre is final, and that worker evaluates it."""
        self._trained.add(worker_id)
        if self.final_result is not None or registry.still_expected() > registry.running():
            return False  # (workers still to register, or replacements to come)
        if not set(registry.ids()) - set(registry.departed()) <= self._trained:
            return False
        self.final_result = {}  # claimed: no other worker is told to evaluate
        return True

    def final(self, worker_id: int, metrics) -> bool:
        """``platoon-final-result``: keep the first worker's `metrics` (an object) as the job's
        ``final_result``; False when one was already kept."""
        if not isinstance(metrics, dict):
            raise ProtocolError("platoon-final-result needs metrics (an object)")
        if self.final_result:
            return False
        kept: Dict[str, Any] = {}
        for name, value in metrics.items():
            if len(str(name)) <= MAX_NAME:
                _put(kept, str(name), bounded(value))
        self.final_result = {"metrics": kept, "worker": worker_id}
        if len(kept) < len(metrics):
            self.final_result["metrics_dropped"] = len(metrics) - len(kept)
        self.write(force=True)
        return True

    def write(self, force: bool = False) -> None:
        """Write the status file; sooner than `MIN_INTERVAL_S` after the last write (unless
        `force`), only mark it `pending` for the next tick."""
        path = self.path
        now = time.monotonic()
        if path is None:
            return
        if not force and now - self._written < self.MIN_INTERVAL_S:
            self.pending = True
            return
        self._written = now
        self.pending = False
        workers, done = self._counts()
        status = dict(self.refresh(), workers=workers, done=done, worker_pids=self._pids(),
                      reports={str(wid): report for wid, report in self._reports.items()})
        if self.started is not None:
            elapsed = now - self.started
            status.update(elapsed_s=round(elapsed, 3),
                          syncs_per_s=round(status["syncs"] / elapsed, 3) if elapsed > 0 else 0.0)
        if self.failure is not None:
            status["failure"] = self.failure
        if self.failed_worker is not None:
            status["failed_worker"] = self.failed_worker
        if self.final_result:
            status["final_result"] = self.final_result
        try:
            write_status(path, status, self._dir_fd)
        except (OSError, TypeError, ValueError) as exc:
            log.debug("status file %s not written: %s", path, exc)

