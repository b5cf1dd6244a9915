"""A worker's control connection: requests and replies, re-registration, controller liveness.

`ControlClient` owns the DEALER socket to the controller's control socket. Each
request carries a sequence number, so a late reply to a request that timed out is
recognised and dropped. When the controller no longer knows the connection (a
network reset), the client registers again under its id with the token it was
issued, and sends the request once more. While waiting, it checks every second
that a controller on this machine is still alive (`ControllerGone`).

At exit, a worker that was not closed says goodbye without waiting (the
"farewell"), with the uncaught exception that ended the script, if any.
"""

import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import zmq

from .. import protocol, security
from .._os.process import pid_alive
from .._resources import Resources
from ..errors import ControllerGone, ControllerTimeout, NotRegistered, ProtocolError, RemoteError

log = logging.getLogger(__name__)

STILL_WAITING_S = 5.0  # a worker unanswered this long at registration says so, once
# This machine's name as socket.gethostname() gives it (glibc reads uname), without loading
# the socket module (a few ms of a worker's start-up).
HOSTNAME = os.uname().nodename


def endpoint(host: str, port) -> str:
    """tcp://host:port for a port number; an endpoint string (ipc://..., tcp://...) as is."""
    return port if isinstance(port, str) else "tcp://%s:%d" % (host, port)


class ControlClient:
    """The control connection to the controller at `address` (see the module docstring).

    `res` owns the sockets (so a finalizer can close them without this object);
    `keys` are the job's CURVE keys, if the controller requires them; `index`
    is the launcher's number for this worker. Call `register` before anything else.
    """

    def __init__(self, res: Resources, address: str, *, keys=None,
                 index: Optional[int] = None):
        self.address = address
        self.worker_id: Optional[int] = None
        self.job_id: Optional[str] = None
        self.token: Optional[str] = None  # proves who we are after a reconnect
        self.max_request_bytes: Optional[int] = None  # the controller's limit
        self.controller_pid: Optional[int] = None  # watched when on this machine
        self._res = res
        self._keys = keys
        self._index = index
        self._seq = 0
        self._lock = threading.Lock()
        self._checked = 0.0
        self._rcvtimeo_ms: Dict[Any, int] = {}  # socket -> the receive timeout set on it
        # (when, timeout_s) to say registration is still waiting
        self._still_waiting: Optional[Tuple[float, Optional[float]]] = None
        self.sock = self.socket(zmq.DEALER)
        self.sock.connect(address)

    def socket(self, kind: int) -> zmq.Socket:
        """A new socket of `kind` (linger 0; with the job's keys, if any), closed with `res`."""
        sock = self._res.socket(kind)
        if self._keys is not None:
            security.make_client(sock, self._keys)
        return sock

    # -- registration --

    def register(self, timeout_s: Optional[float]) -> dict:
        """Register with the controller; returns its reply (worker id, job id, topology).

        Raises ControllerTimeout, naming the address, when nobody answers; logs a warning
        once if nobody has answered after `STILL_WAITING_S`.
        """
        self._still_waiting = time.monotonic() + STILL_WAITING_S, timeout_s
        try:
            info = self.request(protocol.REGISTER, self._registration(), timeout_s=timeout_s)
        except ControllerTimeout:
            raise ControllerTimeout(
                "no controller answered at %s within %.3g s: start the controller first "
                "(a controller whose job has ended no longer listens), check the address, "
                "or raise the worker's timeout_s" % (self.address, timeout_s or 0.0)) from None
        finally:
            self._still_waiting = None
        if info.get("controller_host") == HOSTNAME:
            self.controller_pid = info.get("controller_pid")
        self.worker_id = info["worker_id"]
        self.job_id = info["job_id"]
        self.token = info.get("token")
        self.max_request_bytes = info.get("max_request_bytes")
        return info

    def arm_farewell(self, report_error: bool = True) -> None:
        """Say DONE at exit (with the uncaught exception that ended the script, if any and
        `report_error`) if `say_done` was not called by then."""
        _record_uncaught_exceptions()
        self._res.farewell = (self.sock, _Farewell(self.worker_id, self.controller_pid,
                                                   report_error))

    def _registration(self):
        """REGISTER's information: who we are, and after a reconnect our id and token."""
        info = {"pid": os.getpid(), "host": HOSTNAME, "index": self._index}
        if self.token is not None:
            info.update(worker_id=self.worker_id, token=self.token)
        return info

    # -- requests --

    def request(self, req: Any, info: Any = None, *, timeout_s: Optional[float]) -> Any:
        """Send `req` with `info`; the controller's reply (see `Worker.send_req`)."""
        with self._lock:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            try:
                return self._round_trip(req, info, deadline, timeout_s)
            except RemoteError as exc:
                if exc.remote_type != NotRegistered.__name__ or self.token is None:
                    raise
            log.warning("worker %d: the controller no longer knows this connection (it was "
                        "reset); registering again", self.worker_id)
            self._round_trip(protocol.REGISTER, self._registration(), deadline, timeout_s)
            return self._round_trip(req, info, deadline, timeout_s)

    def _round_trip(self, req, info, deadline, timeout_s):
        """One request and its reply (the caller holds the request lock)."""
        self._seq += 1
        seq = self._seq
        payload = protocol.encode_request(self.worker_id, req, info, seq)
        if self.max_request_bytes is not None and len(payload) > self.max_request_bytes:
            raise ProtocolError(
                "request %.60r is %d bytes, over the controller's limit of %d bytes; send large "
                "data through shared parameters (init_shared_params, shared_state) or the "
                "minibatch channel, or raise the controller's max_request_bytes"
                % (req, len(payload), self.max_request_bytes))
        try:
            self.sock.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            raise self._no_reply(req, timeout_s) from None
        while True:
            data = self.recv_within(self.sock, deadline)
            if data is None:
                raise self._no_reply(req, timeout_s)
            reply_seq, result = protocol.decode_reply(data)
            if reply_seq is not None and reply_seq != seq:
                continue  # a late reply to a request that timed out earlier
            if isinstance(result, RemoteError):
                raise result
            return result

    def _no_reply(self, req, timeout_s):
        return ControllerTimeout(
            "no reply to %r from the controller at %s within %.3g s; check that the controller "
            "is running and listening there, or raise the worker's timeout_s"
            % (req, self.address, timeout_s))

    def set_rcvtimeo(self, sock: zmq.Socket, wait_ms: int) -> None:
        """Make `sock`'s blocking receives wait at most `wait_ms` ms (setsockopt costs a few
        µs: only when it changes). Every change of a socket's receive timeout goes through
        here, so that `recv_within` knows the one set."""
        if self._rcvtimeo_ms.get(sock) != wait_ms:
            sock.rcvtimeo = self._rcvtimeo_ms[sock] = wait_ms

    def recv_within(self, sock: zmq.Socket, deadline: Optional[float], copy: bool = True):
        """The next frame from `sock`, or None at `deadline` (monotonic; None: never).

        Waits in slices of a second, raising ControllerGone if the controller dies
        meanwhile; blocks in recv with a receive timeout, which costs less than
        poll + recv.
        """
        while True:
            wait_ms = 1000
            if deadline is not None:
                wait_ms = min(wait_ms, max(0, int((deadline - time.monotonic()) * 1000)))
            current = self._rcvtimeo_ms.get(sock)
            if current is None or not 0 <= wait_ms - 50 <= current <= wait_ms:
                self.set_rcvtimeo(sock, wait_ms)
            try:
                return sock.recv(copy=copy)
            except zmq.Again:
                pass
            self.check_controller(force=True)
            now = time.monotonic()
            if self._still_waiting is not None and now >= self._still_waiting[0]:
                log.warning("still waiting for a controller at %s (timeout %s); is it started?",
                            self.address, "none" if self._still_waiting[1] is None
                            else "%.3g s" % self._still_waiting[1])
                self._still_waiting = None  # once
            if deadline is not None and now >= deadline:
                return None

    # -- liveness and goodbye --

    def controller_alive(self) -> bool:
        """False once a controller on this machine has exited (True when it runs elsewhere)."""
        return self.controller_pid is None or pid_alive(self.controller_pid)

    def check_controller(self, force: bool = False) -> None:
        """Raise ControllerGone if the controller (on this machine) has exited.

        Checked at most once a second unless `force`, so syncs stay cheap.
        """
        now = time.monotonic()
        if not force and now - self._checked < 1.0:
            return
        self._checked = now
        if not self.controller_alive():
            raise ControllerGone("the controller of job %s (pid %s, %s) has exited; worker %s "
                                 "cannot go on" % (self.job_id, self.controller_pid,
                                                   self.address, self.worker_id))

    def say_done(self, error: Optional[str], timeout_s: Optional[float]) -> None:
        """Tell the controller this worker is done (failed with `error`, if given), unless it
        is gone; the farewell at exit is no longer needed. Raises as `request`."""
        self._res.farewell = None
        if self.worker_id is not None and self.controller_alive():
            self.request(protocol.DONE, {"error": error} if error else None,
                         timeout_s=timeout_s)


class _Farewell:
    """DONE, sent without waiting when a worker is collected or its process exits with the
    worker unclosed: with the error that ended the script, if one did."""

    def __init__(self, worker_id, controller_pid, report_error=True):
        self.worker_id = worker_id
        self.controller_pid = controller_pid
        self.report_error = report_error

    def __call__(self):
        if self.controller_pid is not None and not pid_alive(self.controller_pid):
            return None
        error = uncaught_error() if self.report_error else None
        return protocol.encode_request(self.worker_id, protocol.DONE,
                                       {"error": error} if error else None)


_uncaught: List[str] = []
_previous_excepthook: Callable[..., Any] = sys.__excepthook__  # the hook _record_uncaught replaced


def uncaught_error() -> Optional[str]:
    """The exception ending the script ("Type: message"), once Python reports it; else None."""
    return _uncaught[-1] if _uncaught else None


def note_failed_exit(code) -> None:
    """The script is ending with sys.exit(`code`), a failure: an unclosed worker reports it
    at exit (platoon.launch.child calls this; SystemExit never reaches sys.excepthook)."""
    _uncaught.append("SystemExit: the script exited with %s" % (
        "exit code %d" % code if isinstance(code, int) else "the message %r" % (code,)))


def _record_uncaught(exc_type, exc, tb):
    _uncaught.append("%s: %s" % (exc_type.__name__, exc))
    _previous_excepthook(exc_type, exc, tb)


def _record_uncaught_exceptions():
    """Note an exception that ends the script (Python calls sys.excepthook before exit
    handlers), so an unclosed worker reports it as its failure."""
    global _previous_excepthook
    if sys.excepthook is not _record_uncaught:
        _previous_excepthook, sys.excepthook = sys.excepthook, _record_uncaught
