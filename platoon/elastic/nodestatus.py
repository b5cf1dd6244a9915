"""An elastic node's status: what its launcher shows of it (its state, its quorum, its final
result; the keys: `platoon._os.statusfile`), rewritten by a thread as it changes, in its status
file and, through its heartbeats and a last message, at the lighthouse (whose status file the
launcher reads too: a node on another machine writes its own file there)."""

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional

from .._os.statusfile import quorum_entry, write_status
from ..errors import PlatoonError

if TYPE_CHECKING:
    from .client import LighthouseClient
    from .link import ElasticLink

log = logging.getLogger(__name__)

STATUS_EVERY_S = 0.5  # how often the node's state is looked at (the file rewritten if changed)
STATES = ("running", "finished", "failed", "refused", "stopped")
TELL_TIMEOUT_S = 2.0  # how long a node's last status may take to reach the lighthouse


class NodeStatus:
    """Node `name`'s status, made from `link` (its `ElasticLink`): at once, then every
    STATUS_EVERY_S when it has changed, until `end(state)` makes the last one (state one of
    STATES). It is written to the status file at `path` (None: none is written; the folder
    is made if missing; a file that cannot be written is logged once, never raised: the node
    trains on) and, once the node has a lighthouse client, sent with its heartbeats; the last
    one is sent to the lighthouse in a message of its own (waiting at most TELL_TIMEOUT_S).
    A context manager: leaving it without `end` ends it ``failed``."""

    def __init__(self, path: Optional[str], name: str, link: "ElasticLink") -> None:
        self.path, self.name, self.link = path, name, link
        self._lock = threading.Lock()
        self._written: Optional[Dict[str, Any]] = None
        self._ended = threading.Event()
        self._warned = False
        if path is not None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
            except OSError as exc:
                self._warn(exc)
        self._publish(self.snapshot("running"), last=False)
        self._thread = threading.Thread(target=self._run, name="platoon-node-status",
                                        daemon=True)
        self._thread.start()

    def _client(self) -> "Optional[LighthouseClient]":
        thread = self.link.tie_thread
        return None if thread is None else thread.client

    def snapshot(self, state: str, error: Optional[str] = None) -> Dict[str, Any]:
        """What the status says now, in `state`, with `error` (why it failed) if any."""
        thread = self.link.tie_thread
        client = self._client()
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
        """Make the last status, in `state` (one of STATES): written, and told to the
        lighthouse when the node has a client; later calls change nothing."""
        if state not in STATES:
            raise ValueError("NodeStatus state must be one of %s, got %r"
                             % (", ".join(STATES), state))
        if self._ended.is_set():
            return
        self._ended.set()
        status = self.snapshot(state, error)
        self._publish(status, last=True)
        client = self._client()
        if client is not None and not client.tell(status, TELL_TIMEOUT_S):
            log.warning("node %s: the lighthouse %s did not take its last status within %.3g s: "
                        "its launcher shows its end only from its status file %s", self.name,
                        client.lighthouse, TELL_TIMEOUT_S, self.path)

    def _run(self) -> None:
        while not self._ended.wait(STATUS_EVERY_S):
            try:
                self._publish(self.snapshot("running"), last=False)
            except Exception:  # never end the node for its status
                log.exception("node %s: its status could not be made", self.name)

    def _publish(self, status: Dict[str, Any], last: bool) -> None:
        with self._lock:
            if self._ended.is_set() and not last:
                return
            client = self._client()
            if client is not None:
                client.set_status(status)  # (sent with a heartbeat when it changed)
            if self.path is None or status == self._written:
                return
            try:
                write_status(self.path, status)
            except OSError as exc:
                self._warn(exc)
                return
            self._written = status

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("node %s: cannot write its status file %s (%s): the launcher shows its "
                        "quorum and final result only as the lighthouse has them", self.name,
                        self.path, exc)

    def __enter__(self) -> "NodeStatus":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end("failed", "ended without saying how")
        self._thread.join(2 * STATUS_EVERY_S)
