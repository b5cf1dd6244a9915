"""An elastic node's status file: what its launcher shows of it (its state, its quorum, its
final result; the keys: `platoon._os.statusfile`), rewritten by a thread as it changes."""

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional

from .._os.statusfile import quorum_entry, write_status
from ..errors import PlatoonError

if TYPE_CHECKING:
    from .link import ElasticLink

log = logging.getLogger(__name__)

STATUS_EVERY_S = 0.5  # how often the node's state is looked at (the file rewritten if changed)
STATES = ("running", "finished", "failed", "refused", "stopped")


class NodeStatus:
    """Node `name`'s status file at `path` (None: none is written), made from `link` (its
    `ElasticLink`): written at once, then every STATUS_EVERY_S when what it says has changed,
    until `end(state)` writes the last one (state one of STATES). The folder is made if
    missing; a file that cannot be written is logged once, never raised (the node trains on).
    A context manager: leaving it without `end` ends it ``failed``."""

    def __init__(self, path: Optional[str], name: str, link: "ElasticLink") -> None:
        self.path, self.name, self.link = path, name, link
        self._lock = threading.Lock()
        self._written: Optional[Dict[str, Any]] = None
        self._ended = threading.Event()
        self._warned = False
        self._thread: Optional[threading.Thread] = None
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        except OSError as exc:
            self._warn(exc)
        self._write(self.snapshot("running"), last=False)
        self._thread = threading.Thread(target=self._run, name="platoon-node-status",
                                        daemon=True)
        self._thread.start()

    def snapshot(self, state: str, error: Optional[str] = None) -> Dict[str, Any]:
        """What the status file says now, in `state`, with `error` (why it failed) if any."""
        thread = self.link.tie_thread
        client = None if thread is None else thread.client
        try:
            quorum = None if client is None else client.current_quorum()
        except PlatoonError:  # refused by the lighthouse: no quorum to show
            quorum = None
        status: Dict[str, Any] = {
            "name": self.name, "pid": os.getpid(), "state": state,
            "quorum": None if quorum is None else quorum_entry(quorum.id, quorum.members),
            "quorums": [] if thread is None else list(thread.quorums),
            "rounds": 0 if thread is None else thread.rounds,
            "kept_own_centre": bool(thread is not None and thread.gave_up)}
        final = self.link.final_result
        if final and isinstance(final.get("metrics"), dict):
            status["final_result"] = final
        if error is not None:
            status["error"] = error
        return status

    def end(self, state: str, error: Optional[str] = None) -> None:
        """Write the last status, in `state` (one of STATES); later calls change nothing."""
        if state not in STATES:
            raise ValueError("NodeStatus state must be one of %s, got %r"
                             % (", ".join(STATES), state))
        if self._ended.is_set():
            return
        self._ended.set()
        if self.path is not None:
            self._write(self.snapshot(state, error), last=True)

    def _run(self) -> None:
        while not self._ended.wait(STATUS_EVERY_S):
            try:
                self._write(self.snapshot("running"), last=False)
            except Exception:  # never end the node for its status
                log.exception("node %s: its status could not be made", self.name)

    def _write(self, status: Dict[str, Any], last: bool) -> None:
        with self._lock:
            if status == self._written or (self._ended.is_set() and not last):
                return
            try:
                write_status(self.path, status)  # type: ignore[arg-type]
            except OSError as exc:
                self._warn(exc)
                return
            self._written = status

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("node %s: cannot write its status file %s (%s): the launcher will not "
                        "show its quorum or final result", self.name, self.path, exc)

    def __enter__(self) -> "NodeStatus":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end("failed", "ended without saying how")
        if self._thread is not None:
            self._thread.join(2 * STATUS_EVERY_S)
