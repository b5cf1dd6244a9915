"""The controller's registry of workers: ids, tokens, states, liveness and restarts.

A worker registers on the control socket and gets an id (the launcher's index for
it when free) and a token that proves its identity when it reconnects. A worker
on this machine must prove the pid it claims (the kernel is asked which process
holds the connection). Its pid is then watched: one that exits without saying it
is done has failed. A failed worker within the restart budget is expected to be
replaced by a worker that takes its id; otherwise its death is queued for the
controller's `handle_worker_death` hook.
"""

import collections
import enum
import hmac
import logging
import secrets
import socket
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple, cast

import zmq

from .._os.process import pid_alive
from ..errors import PlatoonError, ProtocolError
from .config import ControllerConfig
from .peers import count_connections, holds_other_end, is_loopback_address

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name

HOSTNAME = socket.gethostname()


class WorkerState(enum.Enum):
    """Where a worker is in its life, as the controller sees it."""

    REGISTERED = "registered"  # connected and known by its id and token
    READY = "ready"            # holds the centre's values (it attached the centre)
    DONE = "done"              # said it is done
    FAILED = "failed"          # died, or closed with an error
    REPLACED = "replaced"      # failed, and a new worker took its id


LEFT = frozenset((WorkerState.DONE, WorkerState.FAILED, WorkerState.REPLACED))


class WorkerRecord:
    """One registered worker: its id, connection identity, pid and state."""

    __slots__ = ("worker_id", "identity", "pid", "local", "token", "state")

    def __init__(self, worker_id: int, identity: bytes, pid: Optional[int], local: bool):
        self.worker_id = worker_id
        self.identity = identity
        self.pid = pid
        self.local = local  # on this machine, so its pid can be watched
        self.token = secrets.token_hex(16)  # proves the worker's identity when it reconnects
        self.state = WorkerState.REGISTERED

    @property
    def has_left(self) -> bool:
        """Done, failed or replaced: it takes part in nothing any more."""
        return self.state in LEFT

    @property
    def failed(self) -> bool:
        return self.state in (WorkerState.FAILED, WorkerState.REPLACED)


class WorkerRegistry:
    """The workers of one job, by id and by connection identity.

    `settings()` gives the controller's one `ControllerConfig` (read at each use, so a
    setting changed on the controller holds here at once): the job id, its number of
    workers, restarts and the replacement and liveness periods. `on_left(record)` is
    called once for each worker that leaves (done or failed). Deaths that no
    replacement is expected for wait in `deaths` for the controller's hook.
    """

    def __init__(self, settings: Callable[[], ControllerConfig], *,
                 on_left: Callable[[WorkerRecord], None],
                 on_registered: Callable[[WorkerRecord], None] = lambda record: None):
        self._settings = settings
        self.restarts_left: int = settings().restarts or 0  # a count, not a setting
        self._on_left = on_left
        self._on_registered = on_registered
        self._pids: List[int] = []  # of every worker that registered, in order
        self._by_id: Dict[int, WorkerRecord] = {}
        self._by_identity: Dict[bytes, WorkerRecord] = {}
        self._awaiting: List[Tuple[float, int]] = []  # (deadline, id) of expected replacements
        self.deaths: Deque[Tuple[int, dict]] = collections.deque()  # (id, exit info) for the hook

    @property
    def job_id(self) -> str:
        return cast(str, self._settings().job_id)

    @property
    def num_workers(self) -> Optional[int]:
        return self._settings().num_workers

    @property
    def replacement_timeout_s(self) -> float:
        return self._settings().replacement_timeout_s

    @property
    def liveness_interval_s(self) -> float:
        return self._settings().liveness_interval_s

    # -- lookup --

    def get(self, worker_id: int) -> Optional[WorkerRecord]:
        return self._by_id.get(worker_id)

    def by_identity(self, identity: bytes) -> Optional[WorkerRecord]:
        return self._by_identity.get(identity)

    def ids(self) -> List[int]:
        """Ids of the registered workers (those that left included)."""
        return sorted(self._by_id)

    def departed(self) -> List[int]:
        """Ids of the workers that have left (done or failed)."""
        return sorted(wid for wid, rec in self._by_id.items() if rec.has_left)

    def pids(self) -> List[int]:
        """The pids of every worker that ever registered (those that left included)."""
        return list(self._pids)

    def __len__(self) -> int:
        return len(self._by_id)

    def running(self) -> int:
        return sum(not rec.has_left for rec in self._by_id.values())

    def still_expected(self) -> int:
        """Workers that may yet take part: running ones, those not registered yet, and the
        replacements expected for failed ones."""
        unregistered = max(0, (self.num_workers or 0) - len(self._by_id))
        return self.running() + unregistered + len(self._awaiting)

    def all_done(self) -> bool:
        """Every expected worker has registered and left (a replacement expected must come)."""
        return (len(self._by_id) >= (self.num_workers or 1) and not self._awaiting
                and all(rec.has_left for rec in self._by_id.values()))

    # -- registration --

    def register(self, identity: bytes, info: dict, identity_frame,
                 transport: str, control_port: Optional[int],
                 welcome: Optional[Callable[[WorkerRecord, bool], None]] = None
                 ) -> Tuple[WorkerRecord, bool]:
        """A new worker's record, or (with its token) a reconnecting worker's: (record, new).

        All or nothing: `welcome(record, new)` (which builds the reply) runs before anything
        is recorded; if it raises, the registry is left as it was, so the worker may retry.
        Raises PlatoonError when the job is full or the peer's pid claim does not hold,
        ProtocolError for a reconnection with an unknown id or token.
        """
        record = self._by_identity.get(identity)
        if record is not None:
            if welcome is not None:
                welcome(record, False)
            return record, False
        if "token" in info:
            return self._reconnect(identity, info, welcome), False
        pid, local = check_peer(info, identity_frame, transport, control_port,
                                self._claimed_by(info.get("pid")))
        index = info.get("index")
        held = self._by_id.get(index) if isinstance(index, int) else None
        if self.running() >= (self.num_workers or float("inf")) \
                or (held is not None and not held.has_left):
            # A replacement may come before the tick notices a death: the launcher starts it
            # once the worker it replaces has exited, with that worker's index. Its id is
            # that index, never a free one that a worker slow to start would then miss.
            self.check_liveness()
        if self.running() >= (self.num_workers or float("inf")):
            raise PlatoonError("job %s is full: num_workers=%s workers are running"
                               % (self.job_id, self.num_workers))
        record = WorkerRecord(self._choose_id(info.get("index")), identity, pid, local)
        if welcome is not None:
            welcome(record, True)
        for entry in self._awaiting:  # its id was a failed worker's: that one is replaced
            if entry[1] == record.worker_id:
                self._awaiting.remove(entry)
                break
        replaced = self._by_id.get(record.worker_id)
        if replaced is not None:
            if replaced.state is WorkerState.DONE:  # it failed after saying it was done
                self.restarts_left -= 1
                log.error("worker %d (pid %s) exited after saying it was done, and a "
                          "replacement came for it: it failed (%d restart(s) left)",
                          replaced.worker_id, replaced.pid, self.restarts_left)
            replaced.state = WorkerState.REPLACED
            self._by_identity.pop(replaced.identity, None)
        self._by_id[record.worker_id] = record
        self._by_identity[identity] = record
        if pid is not None:
            self._pids.append(pid)
        log.info("worker %d registered (pid %s)%s", record.worker_id, pid,
                 " as the replacement of a failed one" if replaced is not None else "")
        self._on_registered(record)  # before the reply: the launcher may see it exit at once
        return record, True

    def _claimed_by(self, pid) -> int:
        """How many running local workers registered with `pid`."""
        return sum(rec.local and rec.pid == pid and not rec.has_left
                   for rec in self._by_id.values())

    def _choose_id(self, requested) -> int:
        """The launcher's index for this worker if it is free (or belongs to a failed worker
        awaiting a replacement), else the id of a failed worker awaiting one, else the
        lowest free id. Changes nothing: `register` records the choice."""
        ok = isinstance(requested, int) and not isinstance(requested, bool) and requested >= 0 \
            and (self.num_workers is None or requested < self.num_workers)
        if ok and (requested not in self._by_id
                   or any(entry[1] == requested for entry in self._awaiting)
                   or self._done_then_died(requested)):
            return requested
        if self._awaiting:
            return self._awaiting[0][1]
        wid = 0
        while wid in self._by_id:
            wid += 1
        return wid

    def _done_then_died(self, worker_id: int) -> bool:
        """Whether worker `worker_id` said it was done, but its process has exited since and a
        restart is left: the launcher replaces a worker whose exit status is a failure
        (sys.exit(3) after close()), and the replacement takes its id."""
        record = self._by_id[worker_id]
        return (record.state is WorkerState.DONE and self.restarts_left > 0 and record.local
                and record.pid is not None and not pid_alive(record.pid))

    def _reconnect(self, identity: bytes, info: dict,
                   welcome: Optional[Callable[[WorkerRecord, bool], None]]) -> WorkerRecord:
        """A registered worker's new connection (after a reset), proven by its token."""
        wid, token = info.get("worker_id"), info.get("token")
        record = self._by_id.get(wid) if isinstance(wid, int) else None
        if record is None or not isinstance(token, str) \
                or not hmac.compare_digest(record.token.encode(), token.encode()):
            raise ProtocolError("re-registration refused: no registered worker has that id and "
                                "token")
        if record.has_left:
            raise PlatoonError("worker %s has already left job %s; create a new Worker"
                               % (wid, self.job_id))
        if welcome is not None:
            welcome(record, False)
        self._by_identity.pop(record.identity, None)
        record.identity = identity
        self._by_identity[identity] = record
        log.warning("worker %d reconnected (its connection was reset)", wid)
        return record

    # -- leaving --

    def mark_ready(self, record: WorkerRecord) -> None:
        """`record` has the centre's values."""
        if record.state is WorkerState.REGISTERED:
            record.state = WorkerState.READY

    def done(self, record: WorkerRecord) -> None:
        """The worker said it is done (a second call does nothing)."""
        if not record.has_left:
            record.state = WorkerState.DONE
            log.info("worker %d is done", record.worker_id)
            self._on_left(record)

    def fail(self, record: WorkerRecord, exit_info: dict) -> None:
        """The worker failed: expect a replacement within the restart budget, else queue
        its death for the controller's hook."""
        if record.has_left:
            return
        log.error("worker %d (pid %s) failed: %s", record.worker_id, record.pid,
                  exit_info.get("error", "exited without saying it was done"))
        record.state = WorkerState.FAILED
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self._awaiting.append((time.monotonic() + self.replacement_timeout_s,
                                   record.worker_id))
            log.info("expecting a replacement for worker %d (%d restart(s) left)",
                     record.worker_id, self.restarts_left)
        else:
            self.deaths.append((record.worker_id, exit_info))
        log.info("worker %d is done", record.worker_id)
        self._on_left(record)

    def check_liveness(self) -> None:
        """Fail the local workers whose process has exited without saying it was done."""
        for record in list(self._by_id.values()):
            if not record.has_left and record.local and record.pid \
                    and not pid_alive(record.pid):
                self.fail(record, {"pid": record.pid,
                                   "detected_after_s": self.liveness_interval_s})

    def give_up_overdue(self, now: float) -> int:
        """Stop expecting replacements whose time ran out; returns how many."""
        overdue = 0
        while self._awaiting and self._awaiting[0][0] <= now:
            self._awaiting.pop(0)
            overdue += 1
            log.warning("no replacement worker registered within %.3g s; carrying on without "
                        "it", self.replacement_timeout_s)
        return overdue


def describe_death(worker_id: int, exit_info: dict) -> str:
    """What `Controller.handle_worker_death` raises by default: who failed, how, what to do."""
    return ("worker %d (pid %s) %s; the job stops. Override handle_worker_death to carry on "
            "without it, or run the launcher with --restart N to replace it"
            % (worker_id, exit_info["pid"], "failed: %s" % exit_info["error"]
               if "error" in exit_info else "died without saying it was done"))


def check_peer(info: dict, identity_frame, transport: str, control_port: Optional[int],
               claimed: int) -> Tuple[Optional[int], bool]:
    """(pid, local) of a registering peer, its claimed pid checked with the kernel when the
    peer is on this machine (`claimed`: running workers registered with that pid already).
    Raises PlatoonError for a claim that does not hold."""
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool):
        pid = None
    if transport == "ipc":
        local = True
    else:
        try:
            peer = identity_frame.get("Peer-Address")
        except (zmq.ZMQError, AttributeError):
            peer = None
        if is_loopback_address(peer) and host != HOSTNAME:
            raise PlatoonError("registration refused: a connection from this machine (%s) "
                               "says it runs on host %r; a platoon.Worker registers with "
                               "its own pid and host name" % (peer, host))
        local = host == HOSTNAME
    if not local:
        return pid, False  # another machine: its pid means nothing here
    if pid is None:
        raise PlatoonError("registration refused: a worker on this machine must give its "
                           "pid (platoon.Worker does)")
    if transport == "ipc":  # only this user can reach the 0700 socket directory
        reason = None if pid_alive(pid) else "no process %d runs on this machine" % pid
    elif holds_other_end(pid, _source_fd(identity_frame)):  # it holds this very connection
        reason = None
    else:  # each registration needs a connection of its own from that process
        try:
            held = count_connections(pid, control_port)
            reason = None if held > claimed else (
                "process %d holds %d connection(s) to port %s, %d of them registered"
                % (pid, held, control_port, claimed))
        except LookupError as exc:
            reason = str(exc)
    if reason is not None:
        raise PlatoonError("registration refused: it claims pid %d, but %s; a worker "
                           "registers with its own pid (platoon.Worker does)" % (pid, reason))
    return pid, True


def _source_fd(frame) -> int:
    """The controller's descriptor of the connection `frame` came on (-1 if unknown: ZeroMQ
    marks ZMQ_SRCFD deprecated; without it, `check_peer` counts the pid's connections)."""
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError):
        return -1
