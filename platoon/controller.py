"""The controller: a ZeroMQ ROUTER server that answers workers' control requests.

Requests named ``platoon-...`` are handled here (registration, shared-parameter
set-up, barrier, done); every other request goes to `handle_control`, which a
user overrides. Replies can be deferred (barrier, waiting for the centre to be
initialised), which is why the socket is a ROUTER and not a REP.
"""

import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref

import zmq

from . import protocol
from .errors import LayoutMismatch, MinibatchTimeout, PlatoonError, PortInUse, ProtocolError, \
    ServeTimeout
from .resources import Resources
from .shmem import SharedCentre

log = logging.getLogger(__name__)


def _bind(sock, host, port):
    """Bind `sock` on tcp://host:port (port 0 or None: a free one); return the port."""
    try:
        if not port:
            return sock.bind_to_random_port("tcp://%s" % host)
        sock.bind("tcp://%s:%d" % (host, port))
        return port
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EADDRINUSE:
            raise PortInUse("cannot listen on tcp://%s:%s: address already in use (another "
                            "controller?); choose another port, or pass 0 for a free one"
                            % (host, port)) from None
        raise PlatoonError("cannot listen on tcp://%s:%s: %s" % (host, port, exc)) from None


class _WorkerRecord:
    __slots__ = ("worker_id", "identity", "pid", "done")

    def __init__(self, worker_id, identity, pid):
        self.worker_id = worker_id
        self.identity = identity
        self.pid = pid
        self.done = False


class Controller:
    """Serves a job's workers. Subclass it and override `handle_control`.

    Parameters:
        control_port: port of the control socket; 0 picks a free one (see
            `control_port` afterwards); None binds nothing until `init_control`.
        data_port: port of the minibatch socket, as for `control_port`.
        num_workers: if given, `serve` returns only once that many workers have
            registered and all are done, and barriers wait for all of them.
        host: interface to bind; 127.0.0.1 unless the job spans machines.
        transport: "tcp", or "ipc" for Unix-domain sockets (one machine only, faster):
            pass port 0, and give workers `control_address` / `data_address`
            instead of ports; the socket files live in a private temporary
            directory removed by `close`.
        job_id: unique id of the job (names its shared memory); random by default.
        max_request_bytes: larger control requests get an error reply.

    Raises PortInUse if a port is taken. Use as a context manager or call
    `close()`, which also unlinks the shared centre.
    """

    def __init__(self, control_port=None, data_port=None, *, num_workers=None, host="127.0.0.1",
                 job_id=None, max_request_bytes=protocol.DEFAULT_MAX_REQUEST_BYTES,
                 transport="tcp"):
        if transport not in ("tcp", "ipc"):
            raise ValueError("transport must be 'tcp' or 'ipc', got %r" % (transport,))
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ValueError("num_workers must be a positive integer or None, got %r"
                             % (num_workers,))
        self.job_id = job_id or secrets.token_hex(8)
        self.host = host
        self.num_workers = num_workers
        self.max_request_bytes = max_request_bytes
        self.transport = transport
        self.control_port = None
        self.data_port = None
        self.control_address = None  # the endpoint workers connect to, e.g. tcp://127.0.0.1:5567
        self.data_address = None
        self._ipc_dir = None
        self._res = Resources()
        self._finalizer = weakref.finalize(self, self._res.close)
        self._control = None
        self._data = None
        self._data_lock = threading.Lock()
        self._workers = {}        # worker_id -> _WorkerRecord
        self._by_identity = {}    # ROUTER identity -> _WorkerRecord
        self._initialiser = None  # worker id writing the centre's first values
        self._centre_ready = False
        self._init_waiting = []   # (envelope, seq) of workers waiting for the centre's values
        self._barrier_waiting = {}  # worker id -> (envelope, seq)
        if control_port is not None:
            self.init_control(control_port)
        if data_port is not None:
            self.init_data(data_port)

    # -- set-up --

    def init_control(self, port):
        """Bind the control socket on `port` (0: a free one); returns the port."""
        if self._control is not None:
            raise PlatoonError("the control socket is already bound (port %d)" % self.control_port)
        sock = self._res.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, 16 * self.max_request_bytes)
        try:
            self.control_port, self.control_address = self._bind(sock, port, "control")
        except PlatoonError:
            sock.close()
            raise
        self._control = sock
        log.info("controller of job %s listening on %s", self.job_id, self.control_address)
        return self.control_port

    def init_data(self, port, hwm=10):
        """Bind the minibatch socket on `port` (0: a free one), queueing up to `hwm` minibatches."""
        if self._data is not None:
            raise PlatoonError("the data socket is already bound (port %d)" % self.data_port)
        sock = self._res.socket(zmq.PUSH)
        sock.sndhwm = hwm
        try:
            self.data_port, self.data_address = self._bind(sock, port, "data")
        except PlatoonError:
            sock.close()
            raise
        self._data = sock
        self._data_timeout_ms = -1
        return self.data_port

    def _bind(self, sock, port, name):
        """Bind on the controller's transport; returns (port or None, endpoint)."""
        if self.transport == "tcp":
            port = _bind(sock, self.host, port)
            return port, "tcp://%s:%d" % (self.host, port)
        if port:
            raise ValueError("with transport='ipc' the controller picks its socket paths: pass "
                             "port 0, and give workers controller.%s_address" % name)
        if self._ipc_dir is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="platoon-%s-" % self.job_id)  # mode 0700
            self._ipc_cleanup = weakref.finalize(self, shutil.rmtree, self._ipc_dir, True)
        address = "ipc://%s" % os.path.join(self._ipc_dir, name)
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            raise PlatoonError("cannot listen on %s: %s" % (address, exc)) from None
        return None, address

    # -- the user's part --

    def handle_control(self, req, worker_id, req_info):
        """Answer request `req` from worker `worker_id`; the return value (JSON) is the reply.

        An exception raised here is sent to that worker, which raises it as a
        RemoteError; the controller keeps serving.
        """
        raise PlatoonError("this controller does not handle request %r: subclass Controller and "
                           "override handle_control(req, worker_id, req_info)" % (req,))

    # -- serving --

    @property
    def workers(self):
        """Ids of the registered workers."""
        return sorted(self._workers)

    @property
    def centre(self):
        """The central parameters as numpy arrays (None until a worker registers them)."""
        return None if self._res.centre is None else self._res.centre.arrays

    def all_done(self):
        """True once the expected workers have registered and all have said they are done."""
        expected = self.num_workers or 1
        return (len(self._workers) >= expected
                and all(rec.done for rec in self._workers.values()))

    def serve(self, timeout=None):
        """Answer requests until every worker is done.

        `timeout` is in seconds (None: no limit); ServeTimeout is raised when it
        runs out. Blocks in recv without using CPU while idle. SIGTERM during
        serve (in the main thread) raises SystemExit so cleanup runs.
        """
        if self._control is None:
            raise PlatoonError("call init_control(port) (or pass control_port) before serve()")
        deadline = None if timeout is None else time.monotonic() + timeout
        restore = _exit_on_sigterm()
        sock = self._control
        # Block in recv with a receive timeout rather than in poll: a poll costs two
        # system calls and a Python Poller per request (about 10 us a round trip).
        sock.rcvtimeo = -1
        try:
            while not self.all_done():
                if deadline is not None:
                    sock.rcvtimeo = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    first = sock.recv(copy=False)
                except zmq.Again:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ServeTimeout(
                            "serve() timed out after %.3g s with %d worker(s) registered, %d done"
                            % (timeout, len(self._workers),
                               sum(r.done for r in self._workers.values()))) from None
                    continue
                self._serve_one(first)
        finally:
            sock.rcvtimeo = -1
            restore()

    def _serve_one(self, first):
        sock = self._control
        frames = [first]
        while frames[-1].more:
            frames.append(sock.recv(copy=False))
        identity = frames[0].bytes
        body = frames[1:]
        envelope = [identity]
        if len(body) >= 2 and len(body[0]) == 0:  # a REQ client's empty delimiter
            envelope.append(b"")
            body = body[1:]
        if len(body) != 1:
            self._send_error(envelope, None, ProtocolError(
                "expected one request frame, got %d; send a single JSON object" % len(body)))
            return
        payload = body[0].buffer
        try:
            request = protocol.decode_request(payload, self.max_request_bytes)
        except ProtocolError as exc:
            log.warning("malformed request rejected: %s", exc)
            self._send_error(envelope, protocol.peek_seq(payload), exc)
            return
        try:
            self._dispatch(envelope, identity, request)
        except (PlatoonError, ValueError, TypeError) as exc:
            log.warning("request %r rejected: %s", request.req, exc)
            self._send_error(envelope, request.seq, exc)
        except Exception as exc:  # never let one request end the job
            log.exception("request %r failed in the controller", request.req)
            self._send_error(envelope, request.seq, exc)

    def _dispatch(self, envelope, identity, request):
        if request.req == protocol.REGISTER:
            self._send(envelope, request.seq, self._register(identity, request.req_info))
            return
        record = self._by_identity.get(identity)
        if record is None:
            raise ProtocolError("request %r comes from a connection that has not registered; "
                                "create a platoon.Worker, which registers first" % request.req)
        if request.worker_id is not None and request.worker_id != record.worker_id:
            raise ProtocolError("request says worker_id %d but this connection registered as "
                                "worker %d" % (request.worker_id, record.worker_id))
        wid = record.worker_id
        if not request.is_reserved:
            self._handle_user(envelope, request, wid)
        elif request.req == protocol.INIT_PARAMS:
            self._init_params(envelope, request, wid)
        elif request.req == protocol.PARAMS_READY:
            self._params_ready(envelope, request, wid)
        elif request.req == protocol.BARRIER:
            self._barrier_waiting[wid] = (envelope, request.seq)
            self._release_barrier()
        elif request.req == protocol.DONE:
            self._done(record)
            self._send(envelope, request.seq, None)
        else:
            raise ProtocolError("unknown reserved request %r; names starting with %r belong to "
                                "platoon, pick another name" % (request.req,
                                                                protocol.RESERVED_PREFIX))

    def _handle_user(self, envelope, request, wid):
        try:
            result = self.handle_control(request.req, wid, request.req_info)
        except Exception as exc:  # the worker gets it; the controller keeps serving
            log.exception("handle_control(%r) from worker %d raised", request.req, wid)
            self._send(envelope, None, None, error=protocol.encode_error(
                request.seq, type(exc).__name__, "handle_control(%r) raised %s: %s"
                % (request.req, type(exc).__name__, exc), traceback.format_exc()))
            return
        try:
            self._send(envelope, request.seq, result)
        except (TypeError, ValueError) as exc:
            raise PlatoonError("handle_control(%r) returned %r, which is not JSON-serialisable "
                               "(%s); return dicts, lists, strings, numbers, booleans or None"
                               % (request.req, type(result).__name__, exc)) from None

    # -- reserved requests --

    def _register(self, identity, info):
        pid = info.get("pid") if isinstance(info, dict) else None
        record = self._by_identity.get(identity)
        if record is None:
            if self.num_workers is not None and len(self._workers) >= self.num_workers:
                raise PlatoonError("job %s is full: num_workers=%d workers have registered"
                                   % (self.job_id, self.num_workers))
            record = _WorkerRecord(len(self._workers), identity, pid)
            self._workers[record.worker_id] = record
            self._by_identity[identity] = record
            log.info("worker %d registered (pid %s)", record.worker_id, pid)
        return {"worker_id": record.worker_id, "is_first": record.worker_id == 0,
                "job_id": self.job_id, "num_workers": self.num_workers}

    def _init_params(self, envelope, request, wid):
        info = request.req_info if isinstance(request.req_info, dict) else {}
        layout = protocol.validate_layout(info.get("layout"))
        centre = self._res.centre
        if centre is None:
            self._res.centre = centre = SharedCentre.create(self.job_id, layout)
            log.info("centre %s created by worker %d: %d parameters, %d bytes",
                     centre.name, wid, len(layout), centre.size)
        else:
            mismatch = protocol.describe_mismatch(layout, centre.layout)
            if mismatch:
                raise LayoutMismatch("worker %d: %s; every worker must pass the same parameters "
                                     "in the same order to init_shared_params" % (wid, mismatch))
        if self._centre_ready:
            self._send(envelope, request.seq, {"segment": centre.name, "initialise": False})
        elif self._initialiser is None:
            self._initialiser = wid
            self._send(envelope, request.seq, {"segment": centre.name, "initialise": True})
        else:
            self._init_waiting.append((envelope, request.seq))

    def _params_ready(self, envelope, request, wid):
        if wid != self._initialiser:
            raise ProtocolError("worker %d reported the centre's values but worker %s writes them"
                                % (wid, self._initialiser))
        self._centre_ready = True
        self._send(envelope, request.seq, None)
        reply = {"segment": self._res.centre.name, "initialise": False}
        for waiting_envelope, seq in self._init_waiting:
            self._send(waiting_envelope, seq, reply)
        self._init_waiting = []

    def _done(self, record):
        if record.done:
            return
        record.done = True
        log.info("worker %d is done", record.worker_id)
        self._barrier_waiting.pop(record.worker_id, None)
        self._release_barrier()
        if record.worker_id == self._initialiser and not self._centre_ready:
            # The initialising worker left before writing: the next waiting one takes over.
            self._initialiser = None
            if self._init_waiting:
                envelope, seq = self._init_waiting.pop(0)
                self._initialiser = self._by_identity[envelope[0]].worker_id
                self._send(envelope, seq, {"segment": self._res.centre.name, "initialise": True})

    def _release_barrier(self):
        if not self._barrier_waiting:
            return
        done = sum(r.done for r in self._workers.values())
        expected = (self.num_workers or len(self._workers)) - done
        if len(self._barrier_waiting) >= expected:
            waiting, self._barrier_waiting = self._barrier_waiting, {}
            for envelope, seq in waiting.values():
                self._send(envelope, seq, None)

    # -- replies --

    def _send(self, envelope, seq, result, error=None):
        payload = error if error is not None else protocol.encode_reply(seq, result)
        sock = self._control
        for part in envelope:
            sock.send(part, zmq.SNDMORE)
        sock.send(payload)

    def _send_error(self, envelope, seq, exc):
        self._send(envelope, None, None,
                   error=protocol.encode_error(seq, type(exc).__name__, str(exc)))

    # -- minibatches --

    def send_mb(self, arrays, *, timeout=None, copy=True):
        """Send one minibatch (a list of numpy arrays) to the next worker that asks for one.

        Safe to call from another thread while `serve` runs. Blocks while
        `hwm` minibatches are queued; raises MinibatchTimeout after `timeout`
        seconds (None: wait forever). With copy=False the arrays are sent
        without a copy and must not be modified afterwards.
        """
        if self._data is None:
            raise PlatoonError("call init_data(port) (or pass data_port) before send_mb()")
        frames = protocol.encode_minibatch(arrays)
        with self._data_lock:
            sock = self._data
            wait_ms = -1 if timeout is None else int(timeout * 1000)
            if self._data_timeout_ms != wait_ms:
                sock.sndtimeo = self._data_timeout_ms = wait_ms
            try:  # a whole multipart message is queued once its first frame is
                sock.send_multipart(frames, copy=copy)
            except zmq.Again:
                raise MinibatchTimeout("no worker took a minibatch from %s within %.3g s"
                                       % (self.data_address, timeout)) from None

    # -- teardown --

    def close(self):
        """Close the sockets and unlink the shared centre. Idempotent."""
        self._finalizer()
        if self._ipc_dir is not None:
            self._ipc_cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _exit_on_sigterm():
    """Make SIGTERM raise SystemExit while serving, so `finally` blocks and finalizers run."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
