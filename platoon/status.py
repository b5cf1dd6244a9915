"""The job's progress, as the launcher's status line and end-of-job summary show it: counted
from the workers' reports and written to the launcher's status file (0600), at most twice a
second."""

import json
import logging
import os
import time
from typing import Callable, Dict, Optional, Tuple

from .errors import ProtocolError

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class Progress:
    """Minibatches trained, syncs and the latest metrics of a job.

    `counts()` gives (workers registered, workers that left) for the status file
    at `path` (None: none is written).
    """

    MIN_INTERVAL_S = 0.5

    def __init__(self, path: Optional[str], counts: Callable[[], Tuple[int, int]]):
        self.path = path
        self._counts = counts
        self.totals = {"minibatches": 0, "syncs": 0, "metrics": {}}
        self._syncs_by_worker: Dict[int, int] = {}
        self._reports: Dict[int, dict] = {}  # each worker's totals and latest metrics
        self._written = 0.0
        self.pending = False  # a report not yet written to the status file

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
        self.totals["minibatches"] += minibatches
        if syncs is not None:
            self._syncs_by_worker[worker_id] = syncs
            self.totals["syncs"] = sum(self._syncs_by_worker.values())
        self.totals["metrics"].update(metrics or {})
        report = self._reports.setdefault(worker_id, {"minibatches": 0, "syncs": 0,
                                                      "metrics": {}})
        report["minibatches"] += minibatches
        if syncs is not None:
            report["syncs"] = syncs
        report["metrics"].update(metrics or {})
        self.write()

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
        status = dict(self.totals, workers=workers, done=done,
                      reports={str(wid): report for wid, report in self._reports.items()})
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o600)
                json.dump(status, f)
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:
            log.debug("status file %s not written: %s", path, exc)
