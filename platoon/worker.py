"""The worker: a client of the controller that shares its parameters through the centre."""

import functools
import logging
import os
import socket
import sys
import threading
import time
import weakref

import numpy as np
import zmq

from . import adapters, protocol, security
from .collectives import WorkerCollectives, check_op
from .environment import JobEnvironment
from .errors import ControllerGone, ControllerTimeout, LayoutMismatch, MinibatchTimeout, \
    NotRegistered, PlatoonError, ProtocolError, RemoteError
from .exchange import Exchange
from .minibatches import MinibatchClient
from .rules import ParamSyncRule
from .resources import Resources
from .shmem import SharedCentre, pid_alive

log = logging.getLogger(__name__)

_DEFAULT = object()


def _endpoint(host, port):
    """tcp://host:port for a port number; an endpoint string (ipc://..., tcp://...) as is."""
    return port if isinstance(port, str) else "tcp://%s:%d" % (host, port)


class Worker:
    """One training process of a job.

    Connects to the controller at tcp://host:control_port (or at the endpoint
    `control_port` when it is a string, such as a controller's
    `control_address` on the ipc transport) and registers,
    learning `worker_id` (0-based), `is_first` and `job_id`. `device` is the
    device the launcher pinned this worker to ("cuda0", "cpu"; "cpu" when run
    by hand); a pinned GPU is the only one the process sees (cuda:0).

    Parameters:
        control_port: the controller's control port or endpoint string (None: the
            launcher's).
        data_port: if given (a port or an endpoint string), also connect to the
            minibatch channel (see `recv_mb`).
        host: the controller's address.
        timeout: seconds to wait for any reply (None: forever); a request that
            times out raises ControllerTimeout and leaves the worker usable.
        keys_file: the job's CURVE keys when the controller requires them
            (default: the launcher's, if any).

    Raises ControllerTimeout if no controller answers. Use as a context manager
    or call `close()`, which tells the controller this worker is done.
    """

    def __init__(self, control_port=None, data_port=None, *, host="127.0.0.1", timeout=60.0,
                 keys_file=None):
        env = JobEnvironment.read()
        if control_port is None:
            control_port = env.control_port
            if control_port is None:
                raise ValueError("Worker needs the controller's control_port, or to run under "
                                 "platoon-launcher (which sets PLATOON_CONTROL_PORT)")
        self.host = host
        self.timeout = timeout
        self.device = env.device or "cpu"
        self.control_address = _endpoint(host, control_port)
        self.worker_id = None
        self.is_first = False
        self.job_id = None
        self._res = Resources()
        self._finalizer = weakref.finalize(self, self._res.close)
        self._closed = False
        self._registered = False
        self._seq = 0
        self._token = None  # issued at registration; proves who we are after a reconnect
        self._max_request_bytes = None  # the controller's limit, learnt at registration
        self._index = env.worker_index  # the launcher's number for this worker
        self._controller_pid = None  # watched when the controller runs on this machine
        self._controller_checked = 0.0
        self._req_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._local = None
        self._rule = None
        self._exchange = None
        self._adapter = None
        self._mb = None
        self._coll = WorkerCollectives()
        self._coll_finalizer = weakref.finalize(self, self._coll.close)
        keys_file = keys_file or env.keys_file
        self._keys = security.load_keys(keys_file) if keys_file else None
        self._control = self._client_socket(zmq.DEALER)
        self._rcvtimeo_ms = {}  # socket -> the receive timeout set on it
        self._control.connect(self.control_address)
        try:
            try:
                info = self.send_req(protocol.REGISTER, self._registration())
            except ControllerTimeout:
                raise ControllerTimeout(
                    "no controller answered at %s within %.3g s: start the controller first "
                    "(a controller whose job has ended no longer listens), check the address, "
                    "or raise the worker's timeout" % (self.control_address, timeout)) from None
            if info.get("controller_host") == socket.gethostname():
                self._controller_pid = info.get("controller_pid")
            self.worker_id = info["worker_id"]
            self.is_first = info["is_first"]
            self.job_id = info["job_id"]
            self._token = info.get("token")
            self._max_request_bytes = info.get("max_request_bytes")
            self._set_topology(info)
            self._registered = True
            if data_port is not None:
                self.init_mb_sock(data_port)
        except BaseException:
            self._finalizer()
            raise
        _record_uncaught_exceptions()
        self._res.farewell = (self._control, functools.partial(
            _farewell, self.worker_id, self._controller_pid))
        log.info("worker %d registered with job %s at %s", self.worker_id, self.job_id,
                 self.control_address)

    # -- control --

    def send_req(self, req, info=None, *, timeout=_DEFAULT):
        """Send request `req` with JSON-serialisable `info`; return the controller's reply.

        `req` is usually a string; any JSON value (such as a dict, as the
        original Platoon sent) reaches `handle_control` as it is.
        `timeout` in seconds overrides the worker's default (None: forever).
        Raises ControllerTimeout when no reply comes in time, ProtocolError
        at once for a request over the controller's size limit, and RemoteError
        when the controller answers with an error (its message and traceback
        included). If the connection was reset meanwhile, the worker registers
        again under its id and sends the request once more.
        """
        timeout = self.timeout if timeout is _DEFAULT else timeout
        self._check_open()
        with self._req_lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                return self._round_trip(req, info, deadline, timeout)
            except RemoteError as exc:
                if exc.remote_type != NotRegistered.__name__ or self._token is None:
                    raise
            log.warning("worker %d: the controller no longer knows this connection (it was "
                        "reset); registering again", self.worker_id)
            self._round_trip(protocol.REGISTER, self._registration(), deadline, timeout)
            return self._round_trip(req, info, deadline, timeout)

    def _registration(self):
        """REGISTER's information: who we are, and after a reconnect our id and token."""
        info = {"pid": os.getpid(), "host": socket.gethostname(), "index": self._index}
        if self._token is not None:
            info.update(worker_id=self.worker_id, token=self._token)
        return info

    def _round_trip(self, req, info, deadline, timeout):
        """One request and its reply (the caller holds the request lock)."""
        self._seq += 1
        seq = self._seq
        payload = protocol.encode_request(self.worker_id, req, info, seq)
        if self._max_request_bytes is not None and len(payload) > self._max_request_bytes:
            raise ProtocolError(
                "request %.60r is %d bytes, over the controller's limit of %d bytes; send large "
                "data through shared parameters (init_shared_params, shared_state) or the "
                "minibatch channel, or raise the controller's max_request_bytes"
                % (req, len(payload), self._max_request_bytes))
        sock = self._control
        try:
            sock.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            raise self._no_reply(req, timeout) from None
        while True:
            data = self._recv_within(sock, deadline)
            if data is None:
                raise self._no_reply(req, timeout)
            reply_seq, result = protocol.decode_reply(data)
            if reply_seq is not None and reply_seq != seq:
                continue  # a late reply to a request that timed out earlier
            if isinstance(result, RemoteError):
                raise result
            return result

    def _recv_within(self, sock, deadline, copy=True):
        """The next frame from `sock`, or None at `deadline` (None: never). Waits in slices
        of a second, raising ControllerGone if the controller dies meanwhile; blocks in
        recv with a receive timeout, which costs less than poll + recv."""
        while True:
            wait_ms = 1000
            if deadline is not None:
                wait_ms = min(wait_ms, max(0, int((deadline - time.monotonic()) * 1000)))
            current = self._rcvtimeo_ms.get(sock)
            if current is None or not 0 <= wait_ms - 50 <= current <= wait_ms:
                if current != wait_ms:  # a setsockopt costs a few us: only when it changes
                    sock.rcvtimeo = self._rcvtimeo_ms[sock] = wait_ms
            try:
                return sock.recv(copy=copy)
            except zmq.Again:
                pass
            self._check_controller(force=True)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _check_controller(self, force=False):
        """Raise ControllerGone if the controller (on this machine) has exited.

        Checked at most once a second unless `force`, so syncs stay cheap.
        """
        now = time.monotonic()
        if not force and now - self._controller_checked < 1.0:
            return
        self._controller_checked = now
        if not self._controller_alive():
            raise ControllerGone("the controller of job %s (pid %d, %s) has exited; worker %s "
                                 "cannot go on" % (self.job_id, self._controller_pid,
                                                   self.control_address, self.worker_id))

    def _controller_alive(self):
        return self._controller_pid is None or pid_alive(self._controller_pid)

    def _no_reply(self, req, timeout):
        return ControllerTimeout(
            "no reply to %r from the controller at %s within %.3g s; check that the controller "
            "is running and listening there, or raise the worker's timeout"
            % (req, self.control_address, timeout))

    def report(self, minibatches=0, **metrics):
        """Tell the controller about progress: `minibatches` trained since the last report
        and any JSON metrics (loss=..., error=...). The launcher shows them in its status line.
        """
        self.send_req(protocol.REPORT, {"minibatches": minibatches, "syncs": self.syncs,
                                        "metrics": metrics})

    def barrier(self, *, timeout=_DEFAULT):
        """Wait until every worker of the job has reached the barrier.

        On ControllerTimeout the worker withdraws from the barrier, so the
        others do not pass it without this worker.
        """
        try:
            self.send_req(protocol.BARRIER, timeout=timeout)
        except ControllerTimeout:
            try:
                self.send_req(protocol.BARRIER_CANCEL, timeout=1.0)
            except PlatoonError:
                pass  # the controller is unreachable: nobody passes the barrier anyway
            raise

    # -- topology and collectives (platoon.collectives, platoon.mpi) --

    def _set_topology(self, info):
        self.local_rank = self.worker_id
        self.local_size = info.get("num_workers") or 1
        self.global_rank = info.get("global_rank", self.local_rank)
        self.global_size = info.get("global_size", self.local_size)
        self.node_rank = info.get("node_rank", 0)
        self.num_nodes = info.get("num_nodes", 1)

    def all_reduce(self, array, op="sum", *, out=None, timeout=_DEFAULT):
        """Reduce `array` over every worker of the job; return the result.

        `op` is "sum", "mean" (floats only), "max" or "min" (not complex). The
        result goes into `out` (same shape and dtype) or, by default, into
        `array` itself. Every worker must call the same all_reduces in the same
        order. Workers of a node reduce through shared memory in worker-id
        order, so results are identical on every worker; the controllers
        combine nodes over MPI. Raises ValueError/TypeError for a bad op or
        array, ControllerTimeout after `timeout` s (default: the worker's),
        RemoteError if a worker left or the workers' ops differ.
        """
        self._check_open()
        array = np.asarray(array)
        check_op(op, array.dtype)
        out = array if out is None else out
        if not isinstance(out, np.ndarray) or out.shape != array.shape \
                or out.dtype != array.dtype or not out.flags.writeable:
            raise ValueError("all_reduce writes into a writable numpy array of the input's shape "
                             "%s and dtype %s; got %r" % (array.shape, array.dtype, out))
        key = (array.dtype.str, array.size)
        entry = self._coll.reductions.get(key)
        if entry is None:
            reply = self.send_req(protocol.ALLREDUCE_SETUP,
                                  {"dtype": array.dtype.str, "count": array.size})
            seg = self._coll.attach(reply["segment"], [
                {"dtype": array.dtype.str, "shape": [reply["slots"] + 1, array.size]}])
            buf = seg.arrays[0]
            entry = self._coll.reductions[key] = (reply["segment"], buf[reply["slot"]],
                                                  buf[reply["slots"]])
        name, mine, result = entry
        np.copyto(mine.reshape(array.shape), array)
        try:
            self.send_req(protocol.ALLREDUCE, {"segment": name, "op": op}, timeout=timeout)
        except ControllerTimeout:  # withdraw, so the others do not reduce without us
            try:
                self.send_req(protocol.ALLREDUCE_CANCEL, {"segment": name}, timeout=1.0)
            except PlatoonError:
                pass
            raise
        np.copyto(out, result.reshape(array.shape))
        return out

    def shared_state(self, name, layout):
        """Zero-initialised arrays in shared memory, one set per job and `name`.

        `layout` is ``[{"dtype": str, "shape": [int]}]`` (see
        `platoon.protocol.layout_of`); every worker asking for `name` gets the
        same memory. The controller owns it (`Controller.shared_states`).
        """
        self._check_open()
        reply = self.send_req(protocol.INIT_STATE, {"name": name, "layout": layout})
        return self._coll.attach(reply["segment"], protocol.validate_layout(layout)).arrays

    # -- shared parameters --

    def init_shared_params(self, params, param_sync_rule, cleanup=False):
        """Share `params` through the job's centre.

        `params` is a list of writable numpy arrays (updated in place), of
        PyTorch tensors or an nn.Module, of CuPy or pycuda GPU arrays, or of
        JAX arrays (see `platoon.adapters`).

        The first worker to call this initialises the centre with its values;
        every later worker's `params` are overwritten with the centre, so all
        start equal. `param_sync_rule` (a ParamSyncRule such as EASGD(0.5)) is
        applied by `sync_params`. `cleanup` is accepted for compatibility: the
        controller always owns and removes the shared memory.

        Raises LayoutMismatch when the parameters differ from the centre's in
        number, dtype or shape (the centre is left untouched), TypeError for
        unusable arrays.
        """
        self._check_open()
        if self._local is not None:
            raise PlatoonError("init_shared_params() was already called on worker %d"
                               % self.worker_id)
        if not isinstance(param_sync_rule, ParamSyncRule):
            raise TypeError("param_sync_rule must be a platoon.ParamSyncRule (such as "
                            "EASGD(alpha=0.5)), got %r" % (param_sync_rule,))
        adapter = adapters.adapt(params)
        params = adapter.arrays
        for i, p in enumerate(params):
            if not p.flags.writeable:
                raise TypeError("parameter %d is read-only; sync_params updates parameters in "
                                "place, so pass writable arrays" % i)
        param_sync_rule.check(params)
        layout = protocol.layout_of(params)
        try:
            reply = self.send_req(protocol.INIT_PARAMS, {"layout": layout,
                                                         "rule": repr(param_sync_rule)})
        except RemoteError as exc:
            if exc.remote_type == LayoutMismatch.__name__:
                raise LayoutMismatch(str(exc)) from exc
            raise
        if self._res.centre is not None:  # left by an earlier attempt that failed
            self._res.centre.close()
        centre = SharedCentre.attach(reply["segment"], layout)
        self._res.centre = centre
        if reply["initialise"]:
            adapter.pull()
        centre.lock.acquire(self.timeout)
        try:
            if reply["initialise"]:
                for c, p in zip(centre.arrays, params):
                    c[...] = p
            else:
                for c, p in zip(centre.arrays, params):
                    p[...] = c
        finally:
            centre.lock.release()
        if reply["initialise"]:
            self.send_req(protocol.PARAMS_READY)
        else:
            adapter.push()
        self.is_first = bool(reply["initialise"])
        param_sync_rule.attach(self)  # rules with shared state (Downpour's optimizer)
        param_sync_rule.setup(params)
        self._adapter = adapter
        self._local = params
        self._rule = param_sync_rule
        self._exchange = Exchange(param_sync_rule, params, centre, self.worker_id, self.timeout)
        self._exchange.before_pull = adapter.pull
        self._exchange.after_pull = adapter.push

    @property
    def shared_params(self):
        """The central parameters as numpy arrays in shared memory (None before init)."""
        centre = self._res.centre
        return None if centre is None else centre.arrays

    def sync_params(self, synchronous=True, *, params=None):
        """Apply the sync rule between this worker's parameters and the centre, in place.

        With synchronous=True (the default) each stripe of the centre is
        updated under its own lock (waiting at most the worker's timeout, else
        LockTimeout); rules that are not elementwise, and a caller holding
        `lock()`, update the whole centre under the whole lock. With False the
        caller is responsible for locking (see `lock`). Device parameters are
        copied to host before and back after, outside any lock. For immutable
        arrays (JAX) pass the current ones as `params`. Returns the parameters
        (new arrays for JAX, the same objects otherwise).
        """
        if self._local is None:
            raise PlatoonError("call init_shared_params() before sync_params()")
        self._check_controller()
        with self._sync_lock:
            self._adapter.pull(params)
            self._exchange.sync(lock=synchronous)
            self._adapter.push()
        return self._adapter.params()

    def start_sync(self):
        """Start a sync in a background thread; returns a SyncHandle: call its `wait()`.

        The parameters are copied (a snapshot) before this returns; until
        `wait()` platoon does not touch them, so the worker may go on computing
        and updating them. `wait()` applies the sync's effect on top of those
        updates: EASGD ``x += -alpha * (x_snap - c)``, ASGD
        ``x = c_new + (x - x_snap)``, where ``x_snap`` is the snapshot and ``c``
        each stripe of the centre when it was pushed. When the parameters did
        not change in between, the result equals `sync_params()` bit for bit.
        Device parameters are copied to host at the start and at `wait()`, and
        back after it. One sync at a time: raises PlatoonError while one is in
        flight; TypeError for rules without push/pull and for immutable (JAX)
        parameters, which need `sync_params(params=...)`.
        """
        if self._local is None:
            raise PlatoonError("call init_shared_params() before start_sync()")
        if not self._adapter.in_place:
            raise TypeError("start_sync() updates parameters in place, which JAX arrays do not "
                            "allow; call sync_params(params=...) instead")
        self._check_controller()
        with self._sync_lock:
            self._adapter.pull()
            return self._exchange.start()

    @property
    def syncs(self):
        """Completed syncs, synchronous or not (a failed one does not count); equals
        `sync_stats.syncs`."""
        return 0 if self._exchange is None else self._exchange.stats.syncs

    @property
    def sync_stats(self):
        """A SyncStats: sync count and lock hold/wait times (None before init)."""
        return None if self._exchange is None else self._exchange.stats

    def lock(self, timeout=None):
        """Take the centre's lock (seconds, None: forever); raises LockTimeout."""
        if self._res.centre is None:
            raise PlatoonError("call init_shared_params() before lock()")
        self._res.centre.lock.acquire(timeout)

    def unlock(self):
        """Release the centre's lock taken by `lock`."""
        if self._res.centre is None:
            raise PlatoonError("call init_shared_params() before unlock()")
        self._res.centre.lock.release()

    # -- minibatches --

    def init_mb_sock(self, port=None, *, prefetch=1):
        """Connect to the controller's minibatch channel on `port` (an endpoint string, or
        None: the launcher's).

        Minibatches come only when asked for: `recv_mb` asks for the one it waits for and
        `prefetch` more (0: none ahead), so the next ones travel while this one is
        used. A worker that never calls `recv_mb` gets none.
        """
        self._check_open()
        if port is None:
            port = JobEnvironment.read().data_port
            if port is None:
                raise ValueError("init_mb_sock() needs the controller's data port, or to run "
                                 "under platoon-launcher with a controller that called "
                                 "init_data()")
        if self._mb is not None:
            raise PlatoonError("the minibatch socket is already connected")
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError("prefetch must be an integer >= 0, got %r" % (prefetch,))
        sock = self._client_socket(zmq.DEALER)
        self._mb_address = _endpoint(self.host, port)
        sock.connect(self._mb_address)
        self._mb = sock
        self._mb_client = client = MinibatchClient(sock, self.worker_id, self._token, prefetch,
                                                   self._controller_alive)
        client.failed = lambda: bool(_uncaught)  # an exception ending the script
        # Created after the sockets' finalizer, so it runs first at exit: goodbye, then close.
        self._mb_leave = weakref.finalize(self, client.leave)

    def recv_mb(self, *, timeout=_DEFAULT):
        """Receive one minibatch: the list of arrays given to `Controller.send_mb`.

        Calling it again acknowledges the previous minibatch as finished; a worker
        that fails holding one (or closes with minibatches prefetched) has the
        controller re-send it to another worker. The arrays keep dtype, shape and
        memory order and are read-only views of the received message (no copy);
        copy one to modify it. Raises MinibatchTimeout after `timeout` seconds
        (default: the worker's), ProtocolError for a malformed message or when the
        controller refuses the request.
        """
        if self._mb is None:
            raise PlatoonError("call init_mb_sock(port) (or pass data_port) before recv_mb()")
        self._check_open()
        timeout = self.timeout if timeout is _DEFAULT else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        sock, client = self._mb, self._mb_client
        try:
            client.ask()
        except zmq.Again:
            raise MinibatchTimeout("cannot ask %s for a minibatch: the request queue is full"
                                   % self._mb_address) from None
        first = self._recv_within(sock, deadline, copy=False)
        if first is None:
            raise MinibatchTimeout("no minibatch from %s within %.3g s"
                                   % (self._mb_address, timeout)) from None
        frames = [first]
        while frames[-1].more:  # the rest of a message is there once its first frame is
            frames.append(sock.recv(copy=False))
        refusal = protocol.mb_refusal(frames)
        if refusal is not None:
            client.outstanding = 0
            raise ProtocolError("the controller at %s refused worker %s's minibatch request: %s"
                                % (self._mb_address, self.worker_id, refusal))
        client.received_one()
        return protocol.decode_minibatch(frames)

    # -- teardown --

    def _client_socket(self, kind):
        sock = self._res.socket(kind)
        if self._keys is not None:
            security.make_client(sock, self._keys)
        return sock

    def _check_open(self):
        if self._closed:
            raise PlatoonError("worker %s is closed" % self.worker_id)

    def close(self, error=None):
        """Tell the controller this worker is done, then release everything. Idempotent.

        With `error` (a message), the worker tells the controller it failed
        instead; the controller handles that as the worker's death (see
        `Controller.handle_worker_death`). Leaving a ``with`` block through an
        exception does this.
        """
        if self._closed:
            return
        if self._mb is not None:  # before DONE: what it has not taken goes to others
            self._mb_client.failed = lambda: error is not None
            self._mb_leave()
        try:
            if self._exchange is not None:  # its last push lands before the controller hears
                self._exchange.close(timeout=30.0 if self.timeout is None else self.timeout)
            if self._registered and self._controller_alive():
                timeout = 5.0 if self.timeout is None else min(self.timeout, 5.0)
                try:
                    self.send_req(protocol.DONE, {"error": error} if error else None,
                                  timeout=timeout)
                except PlatoonError as exc:
                    log.warning("worker %d could not tell the controller it is done: %s",
                                self.worker_id, exc)
        finally:
            self._closed = True
            self._local = None
            self._res.farewell = None
            self._coll_finalizer()
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or issubclass(exc_type, ControllerGone):
            self.close()
        else:
            self.close(error="%s: %s" % (exc_type.__name__, exc))


_uncaught = []
_previous_excepthook = None


def _record_uncaught(exc_type, exc, tb):
    _uncaught.append("%s: %s" % (exc_type.__name__, exc))
    _previous_excepthook(exc_type, exc, tb)


def _farewell(worker_id, controller_pid):
    """DONE, sent without waiting when a worker is collected or its process exits with the
    worker unclosed: with the error that ended the script, if one did."""
    if controller_pid is not None and not pid_alive(controller_pid):
        return None
    return protocol.encode_request(worker_id, protocol.DONE,
                                   {"error": _uncaught[-1]} if _uncaught else None)


def _record_uncaught_exceptions():
    """Note an exception that ends the script (Python calls sys.excepthook before exit
    handlers), so an unclosed worker reports it as its failure."""
    global _previous_excepthook
    if sys.excepthook is not _record_uncaught:
        _previous_excepthook, sys.excepthook = sys.excepthook, _record_uncaught
