"""The controller: a ZeroMQ ROUTER server that answers workers' control requests.

Requests named ``platoon-...`` are handled here (registration, shared-parameter
set-up, barrier, done); every other request goes to `handle_control`, which a
user overrides. Replies can be deferred (barrier, waiting for the centre to be
initialised), which is why the socket is a ROUTER and not a REP.
"""

import argparse
import hmac
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import socket
import threading
import time
import traceback
import weakref

import zmq

from . import protocol, security
from .checkpoint import load as load_checkpoint, save as save_checkpoint
from .collectives import NodeCollectives
from .environment import JobEnvironment
from .logthrottle import ThrottledLog
from .minibatches import MinibatchChannel
from .errors import LayoutMismatch, MinibatchTimeout, NotRegistered, PlatoonError, PortInUse, \
    ProtocolError, ServeTimeout, WorkerDied
from .peers import count_connections, is_loopback_address
from .process import announce, exit_on_sigterm as _exit_on_sigterm, raise_system_exit  # noqa: F401
from .resources import Resources
from .shmem import SharedCentre, param_offsets, pid_alive, remove_stale_segments

log = logging.getLogger(__name__)

_HOSTNAME = socket.gethostname()


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


def default_max_shared_bytes():
    """Half of the smaller of physical memory and /dev/shm: what one job may hold."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        pass
    try:
        stat = os.statvfs("/dev/shm")
        sizes.append(stat.f_blocks * stat.f_frsize)
    except OSError:
        pass
    return min(sizes) // 2 if sizes else 1 << 34


class _WorkerRecord:
    __slots__ = ("worker_id", "identity", "pid", "local", "token", "done", "dead")

    def __init__(self, worker_id, identity, pid, local):
        self.worker_id = worker_id
        self.identity = identity
        self.pid = pid
        self.local = local  # on this machine, so its pid can be watched
        self.token = secrets.token_hex(16)  # proves the worker's identity when it reconnects
        self.done = False
        self.dead = False  # failed: a replacement may take its id


class Controller:
    """Serves a job's workers. Subclass it and override `handle_control`.

    Parameters:
        control_port: port of the control socket; 0 picks a free one (see
            `control_port` afterwards); None binds the launcher's choice when run
            by platoon-launcher, else nothing until `init_control`.
        data_port: port of the minibatch socket, as for `control_port`.
        num_workers: if given, `serve` returns only once that many workers have
            registered and all are done, and barriers wait for all of them
            (under the launcher: the number of workers it starts).
        host: interface to bind; 127.0.0.1 unless the job spans machines.
        transport: "tcp", or "ipc" for Unix-domain sockets (one machine only, faster):
            pass port 0, and give workers `control_address` / `data_address`
            instead of ports; the socket files live in a private temporary
            directory removed by `close`.
        job_id: unique id of the job (names its shared memory); random by default.
        max_request_bytes: larger control requests get an error reply (a Worker
            refuses to send them, naming the limit).
        max_shared_bytes: shared memory the job's workers may have the controller
            allocate, centre, shared states and all_reduce buffers together
            (default: half of the smaller of RAM and /dev/shm); a request that
            would exceed it gets an error reply.
        restarts: how many dead workers a replacement is expected for (the
            launcher's --restart); a death within that budget is not an error.
        checkpoint_path: file to snapshot the centre to, atomically, every
            `checkpoint_every_s` seconds (if given) and when `serve` ends. Periodic
            checkpoints are written on a thread of their own while serving goes on;
            one that fails (the lock not free within `checkpoint_lock_timeout_s`, a
            full disk) is logged and retried a period later, never fatal.
        resume_from: a checkpoint (file or directory) to initialise the centre from;
            read and checked here: CheckpointError if it is unreadable, or holds NaN
            or Inf unless `allow_nonfinite`.
        liveness_interval_s: how often local workers' pids are checked.
        replacement_timeout_s: how long to wait for the replacement of a dead
            worker (within `restarts`) before carrying on without it.
        keys_file: CURVE keys (see `platoon.security`): only peers holding the
            job's client key may connect. Binding beyond loopback without them
            logs a warning.

    Worker processes on this machine are watched: one that exits without
    saying it is done is reported to `handle_worker_death` within about
    `liveness_interval_s`. Centres left in /dev/shm by dead jobs are removed
    at start.
    Raises PortInUse if a port is taken. Use as a context manager or call
    `close()`, which also unlinks the shared centre.
    """

    def __init__(self, control_port=None, data_port=None, *, num_workers=None, host="127.0.0.1",
                 job_id=None, max_request_bytes=protocol.DEFAULT_MAX_REQUEST_BYTES,
                 max_shared_bytes=None,
                 restarts=None, checkpoint_path=None, checkpoint_every_s=None, resume_from=None,
                 liveness_interval_s=0.5, keys_file=None, replacement_timeout_s=120.0,
                 transport="tcp", allow_nonfinite=False, checkpoint_lock_timeout_s=10.0):
        if transport not in ("tcp", "ipc"):
            raise ValueError("transport must be 'tcp' or 'ipc', got %r" % (transport,))
        self._env = env = JobEnvironment.read()
        remove_stale_segments()
        if control_port is None:
            control_port = env.control_port
        if num_workers is None:
            num_workers = env.num_workers
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ValueError("num_workers must be a positive integer or None, got %r"
                             % (num_workers,))
        self.job_id = job_id or env.job_id or secrets.token_hex(8)
        self.host = host
        self.num_workers = num_workers
        self.max_request_bytes = max_request_bytes
        self.max_shared_bytes = max_shared_bytes or default_max_shared_bytes()
        self._warnings = ThrottledLog(log)  # bad requests: a few lines, then a count
        self._afterword = None  # stops the replies to latecomers once serve has returned
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
        self._mb = None  # the _MinibatchChannel on the data socket
        self._data_lock = threading.Lock()
        self._workers = {}        # worker_id -> _WorkerRecord
        self._by_identity = {}    # ROUTER identity -> _WorkerRecord
        self._initialiser = None  # worker id writing the centre's first values
        self._centre_ready = False
        self._init_waiting = []   # (envelope, seq) of workers waiting for the centre's values
        self._barrier_waiting = {}  # worker id -> (envelope, seq)
        self.progress = {"minibatches": 0, "syncs": 0, "metrics": {}}
        self._syncs_by_worker = {}
        self._status_written = 0.0
        self._status_pending = False  # a report not yet written to the status file
        self.restarts_left = restarts if restarts is not None else (env.restarts or 0)
        self.replacement_timeout_s = replacement_timeout_s
        self._awaiting = []       # [deadline, worker id] of replacements expected for dead workers
        self._deaths = []         # (worker id, exit info) for handle_worker_death, in order
        self._next_tick = 0.0
        self._announced = False
        self.checkpoint_path = checkpoint_path or env.checkpoint_path
        self.checkpoint_every_s = checkpoint_every_s or env.checkpoint_every_s
        self.resume_from = resume_from or env.resume_from
        # Read now, so a bad checkpoint fails the controller at start, not a worker later.
        self._resumed = (load_checkpoint(self.resume_from, allow_nonfinite=allow_nonfinite)[0]
                         if self.resume_from else None)
        self._checkpointed = time.monotonic()
        self.checkpoint_lock_timeout_s = checkpoint_lock_timeout_s
        self._checkpoint_thread = None  # the periodic checkpoint being written, if any
        self._checkpoint_failures = 0   # periodic checkpoints failed in a row
        self.liveness_interval_s = liveness_interval_s
        keys_file = keys_file or env.keys_file
        self._keys = security.load_keys(keys_file) if keys_file else None
        if self._keys is not None:
            self._res.authenticator = security.start_authenticator(self._res.context, self._keys)
        elif not security.is_loopback(host):
            log.warning("controller binds %s without authentication: anyone who can reach this "
                        "machine can join the job; use keys (platoon-launcher --curve)", host)
        # Collectives and multi-node (platoon.collectives, platoon.mpi)
        self.node_link = None  # a platoon.mpi.NodeLink when the job spans nodes
        self._collectives = NodeCollectives(self)
        self._collectives_finalizer = weakref.finalize(self, self._collectives.close)
        if os.environ.get("PLATOON_MPI_NODE"):  # run by `python -m platoon.mpi`: join the job
            from .mpi import node_link_for
            self.node_link = node_link_for(self)
        if control_port is not None:
            self.init_control(control_port)
        if data_port is not None:
            self.init_data(data_port)

    # -- the original Platoon's command-line helpers --

    @staticmethod
    def default_parser():
        """An argparse parser for a controller script, as the original Platoon had: add your
        own options, then pass `default_arguments(args)` to the Controller.

        It takes `--control-port`, `--data-port`, `--data-hwm`, `--workers` (-nw) and, for old
        command lines, an optional experiment name, `-D` and `-w` (the launcher's business now:
        accepted and ignored).
        """
        parser = argparse.ArgumentParser(description="A platoon controller.")
        parser.add_argument("experiment_name", nargs="?", help="ignored (the launcher's)")
        parser.add_argument("--control-port", type=int, default=None,
                            help="default: the launcher's, else 5567")
        parser.add_argument("--data-port", type=int, default=None,
                            help="bind the minibatch socket on this port")
        parser.add_argument("--data-hwm", type=int, default=10,
                            help="minibatches queued on the data socket (default 10)")
        parser.add_argument("-nw", "--workers", type=int, default=None, dest="workers",
                            help="how many workers the job has (num_workers)")
        parser.add_argument("-D", "--devices", nargs="+", default=[], help="ignored")
        parser.add_argument("-w", "--worker-args", default=None, help="ignored")
        return parser

    @staticmethod
    def default_arguments(args):
        """Controller keyword arguments from `default_parser().parse_args()`."""
        env = JobEnvironment.read()
        port = args.control_port if args.control_port is not None else (env.control_port or 5567)
        kwargs = {"control_port": port}
        if getattr(args, "workers", None) is not None:
            kwargs["num_workers"] = args.workers
        if getattr(args, "data_port", None) is not None:
            kwargs["data_port"] = args.data_port
        return kwargs

    # -- set-up --

    def init_control(self, port):
        """Bind the control socket on `port` (0: a free one); returns the port."""
        if self._control is not None:
            raise PlatoonError("the control socket is already bound (port %d)" % self.control_port)
        sock = self._server_socket(zmq.ROUTER)
        # Frames up to twice the limit get an error reply; larger ones drop the connection.
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_request_bytes)
        sock.rcvhwm = 100
        try:
            self.control_port, self.control_address = self._bind(sock, port, "control")
        except PlatoonError:
            sock.close()
            raise
        self._control = sock
        log.info("controller of job %s listening on %s", self.job_id, self.control_address)
        return self.control_port

    def _server_socket(self, kind):
        sock = self._res.socket(kind)
        if self._keys is not None:
            security.make_server(sock, self._keys)
        return sock

    def init_data(self, port=None, hwm=10):
        """Bind the minibatch socket on `port` (0: a free one; None: the launcher's choice,
        else a free one). `hwm`: at most this many minibatches are on their way to, or
        waiting unread in, one worker (a worker asks for at most 1 + its prefetch)."""
        if port is None:
            port = self._env.data_port or 0
        if self._data is not None:
            raise PlatoonError("the data socket is already bound (port %d)" % self.data_port)
        if not isinstance(hwm, int) or hwm < 1:
            raise ValueError("hwm must be a positive integer, got %r" % (hwm,))
        sock = self._server_socket(zmq.ROUTER)
        sock.router_mandatory = 1  # a send to a peer that is gone raises instead of vanishing
        sock.sndhwm = 0  # bounded by the workers' credit (at most hwm each)
        sock.setsockopt(zmq.MAXMSGSIZE, 4096)  # requests are small: drop peers sending more
        try:
            self.data_port, self.data_address = self._bind(sock, port, "data")
        except PlatoonError:
            sock.close()
            raise
        self._mb = MinibatchChannel(sock, hwm, self._workers, self.data_address)
        self._data = sock
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

    @property
    def shared_centre(self):
        """The centre's SharedCentre (arrays, lock, stripes), None until a worker registers
        parameters. For platoon's own parts (the MPI centre tie)."""
        return self._res.centre

    @property
    def centre_ready(self):
        """True once the centre holds its first values (a worker's, or a checkpoint's)."""
        return self._centre_ready

    def handle_worker_death(self, worker_id, exit_info):
        """Called when a worker fails: it reported an error as it closed, or (on this
        machine) its process exited without saying it was done.

        `exit_info` holds its `pid`, and `error` (the worker's exception) or
        `detected_after_s` (the pid-check interval). The default raises WorkerDied,
        which ends `serve` and so the job; return instead to carry on with the others (the
        dead worker then counts as done). Within the `restarts` budget a
        replacement is expected instead and this hook is not called. It runs in
        `serve`, outside request handling, so what it raises ends `serve`.
        """
        raise WorkerDied("worker %d (pid %s) %s; the job stops. Override handle_worker_death "
                         "to carry on without it, or run the launcher with --restart N to "
                         "replace it" % (worker_id, exit_info["pid"],
                                         "failed: %s" % exit_info["error"]
                                         if "error" in exit_info
                                         else "died without saying it was done"))

    def all_done(self):
        """True once the expected workers have registered and all have said they are done
        (dead workers count as done; a replacement expected for one must register too)."""
        return (len(self._workers) >= (self.num_workers or 1) and not self._awaiting
                and all(rec.done for rec in self._workers.values()))

    def serve(self, timeout=None):
        """Answer requests until every worker is done.

        `timeout` is in seconds (None: no limit); ServeTimeout is raised when it
        runs out. Blocks in recv without using CPU while idle. SIGTERM during
        serve (in the main thread) raises SystemExit so cleanup runs.
        """
        if self._control is None:
            raise PlatoonError("call init_control(port) (or pass control_port) before serve()")
        self._stop_afterword()
        deadline = None if timeout is None else time.monotonic() + timeout
        restore = _exit_on_sigterm()
        self._announce_ready()
        if self.node_link is not None:
            self.node_link.start(self)  # the centre tie, if any
        sock = self._control
        rcvtimeo = None
        try:
            while not self.all_done():
                now = time.monotonic()
                wake = now + self.liveness_interval_s
                if deadline is not None:
                    wake = min(wake, deadline)
                # Block in recv with a receive timeout rather than in poll: a poll costs two
                # system calls and a Python Poller per request (about 10 us a round trip).
                wait_ms = max(0, int((wake - now) * 1000))
                if rcvtimeo is None or not wait_ms - 50 <= rcvtimeo <= wait_ms:
                    sock.rcvtimeo = rcvtimeo = wait_ms
                try:
                    first = sock.recv(copy=False)
                except zmq.Again:
                    first = None
                if first is not None:
                    self._serve_one(first)
                now = time.monotonic()
                if now >= self._next_tick:
                    self._tick(now)
                while self._deaths:  # outside request handling: what the hook raises ends serve
                    self.handle_worker_death(*self._deaths.pop(0))
                if deadline is not None and now >= deadline and not self.all_done():
                    raise ServeTimeout(
                        "serve() timed out after %.3g s with %d worker(s) registered, %d done"
                        % (timeout, len(self._workers),
                           sum(r.done for r in self._workers.values())))
            if self.node_link is not None:
                self.node_link.finish()  # waits for the other nodes to be done too
            self._start_afterword()
        finally:
            sock.rcvtimeo = -1
            try:
                self._final_checkpoint()
            finally:
                self._warnings.flush()
                self._write_status(force=True)
                restore()

    def _start_afterword(self):
        """Until `close` (or the next `serve`), answer latecomers that the job has ended,
        so a worker started too late fails at once instead of after its timeout."""
        stop = threading.Event()
        thread = threading.Thread(target=_answer_after_the_job, name="platoon-afterword",
                                  args=(self._control, stop, self.job_id, len(self._workers)),
                                  daemon=True)

        def stop_it():
            stop.set()
            thread.join(5)

        self._afterword = stop_it
        self._res.stoppers.append(stop_it)
        thread.start()

    def _stop_afterword(self):
        stop_it = self._afterword
        if stop_it is not None:
            self._afterword = None
            self._res.stoppers.remove(stop_it)
            stop_it()

    def _tick(self, now):
        """Periodic duties while serving: watch local workers' pids, give up on overdue
        replacements, checkpoint."""
        self._next_tick = now + self.liveness_interval_s
        self._warnings.flush(expired_only=True)
        if self._status_pending:
            self._write_status(force=True)
        self._check_pids()
        while self._awaiting and self._awaiting[0][0] <= now:
            self._awaiting.pop(0)
            log.warning("no replacement worker registered within %.3g s; carrying on without "
                        "it", self.replacement_timeout_s)
            self._release_barrier()
        if (self.checkpoint_every_s and self.checkpoint_path and self._res.centre is not None
                and now - self._checkpointed >= self.checkpoint_every_s):
            self._checkpointed = now  # the next attempt is a period later, whatever happens
            if self._checkpoint_thread is not None and self._checkpoint_thread.is_alive():
                log.debug("checkpoint to %s still being written: this period's is skipped",
                          self.checkpoint_path)
            else:
                self._checkpoint_thread = threading.Thread(
                    target=self._periodic_checkpoint, name="platoon-checkpoint", daemon=True)
                self._checkpoint_thread.start()

    def _periodic_checkpoint(self):
        """A checkpoint on its own thread; a failure is logged (once in a row) and the next
        period retries."""
        path = self.checkpoint_path
        try:
            self.checkpoint(path)
        except Exception as exc:  # never fatal: the job goes on, the next period retries
            self._checkpoint_failures += 1
            if self._checkpoint_failures == 1:
                log.warning("periodic checkpoint to %s failed (%s: %s); serving goes on and it "
                            "is retried every %.3g s", path, type(exc).__name__, exc,
                            self.checkpoint_every_s)
            else:
                log.debug("periodic checkpoint to %s failed again (%d in a row): %s",
                          path, self._checkpoint_failures, exc)
            return
        if self._checkpoint_failures:
            log.warning("checkpoint to %s written again after %d failed attempt(s)",
                        path, self._checkpoint_failures)
            self._checkpoint_failures = 0

    def _join_checkpoint(self):
        """Wait (bounded) for the periodic checkpoint being written, if any."""
        thread = self._checkpoint_thread
        if thread is None:
            return
        bound = 2 * self.checkpoint_lock_timeout_s + 120.0  # two lock waits, then the write
        thread.join(bound)
        if thread.is_alive():
            log.error("periodic checkpoint to %s still being written after %.3g s; not waiting "
                      "for it any longer", self.checkpoint_path, bound)

    def _final_checkpoint(self):
        """The checkpoint when `serve` ends. A failure is logged, not raised, so it never
        hides how `serve` ended; the last periodic checkpoint stays."""
        self._join_checkpoint()
        if self._res.centre is None or not self.checkpoint_path:
            return
        try:
            self.checkpoint()
        except Exception as exc:
            log.error("final checkpoint to %s failed (%s: %s); call checkpoint() again, or "
                      "resume from the last periodic one", self.checkpoint_path,
                      type(exc).__name__, exc)

    def _check_pids(self):
        for record in list(self._workers.values()):
            if not record.done and record.local and record.pid and not pid_alive(record.pid):
                self._worker_died(record, {"pid": record.pid,
                                           "detected_after_s": self.liveness_interval_s})

    def _worker_died(self, record, exit_info):
        """Count a failed worker as done; expect a replacement or queue the death hook."""
        log.error("worker %d (pid %s) failed: %s", record.worker_id, record.pid,
                  exit_info.get("error", "exited without saying it was done"))
        record.dead = True
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self._awaiting.append([time.monotonic() + self.replacement_timeout_s, record.worker_id])
            log.info("expecting a replacement for worker %d (%d restart(s) left)",
                     record.worker_id, self.restarts_left)
        else:
            self._deaths.append((record.worker_id, exit_info))
        self._done(record)

    def checkpoint(self, path=None):
        """Write the centre to `path` (default: `checkpoint_path`) atomically; returns the path.

        Taken under the centre's lock, so it is consistent. Raises PlatoonError
        when there is no centre or no path, LockTimeout if the lock is not free within
        `checkpoint_lock_timeout_s`, OSError if the file cannot be written.
        """
        path = path or self.checkpoint_path
        if not path:
            raise PlatoonError("no checkpoint path: pass checkpoint_path to the Controller")
        centre = self._res.centre
        arrays = self.snapshot_centre(self.checkpoint_lock_timeout_s)
        states = self._collectives.snapshot_states(centre.lock, self.checkpoint_lock_timeout_s)
        save_checkpoint(path, arrays, {"job_id": self.job_id, "time": time.time(),
                                       "layout": centre.layout}, states)
        self._checkpointed = time.monotonic()
        log.info("centre checkpointed to %s", path)
        return path

    def _announce_ready(self):
        """Tell a waiting launcher (through the pipe it passed) where we listen, once."""
        fd = self._env.ready_fd
        if fd is None or self._announced:
            return
        self._announced = True
        message = {"control_port": self.control_port, "data_port": self.data_port,
                   "job_id": self.job_id, "pid": os.getpid()}
        try:
            announce(fd, message)
        except OSError as exc:
            log.warning("could not tell the launcher that the controller is ready: %s", exc)

    def _report(self, wid, info):
        if not isinstance(info, dict):
            raise ProtocolError("platoon-report needs an object with minibatches, syncs, metrics")
        minibatches, syncs = info.get("minibatches"), info.get("syncs")
        metrics = info.get("metrics")
        if not (type(minibatches) is int and type(syncs) is int and minibatches >= 0
                and syncs >= 0 and isinstance(metrics, dict)):
            raise ProtocolError("platoon-report needs minibatches and syncs (integers >= 0) "
                                "and metrics (an object)")
        self.add_progress(wid, minibatches, syncs, metrics)

    def add_progress(self, worker_id, minibatches=0, syncs=None, metrics=None):
        """Count progress shown by the launcher's status line: `minibatches` trained since
        the last call, the worker's total `syncs`, and the latest JSON `metrics` (a dict)."""
        self.progress["minibatches"] += minibatches
        if syncs is not None:
            self._syncs_by_worker[worker_id] = syncs
            self.progress["syncs"] = sum(self._syncs_by_worker.values())
        self.progress["metrics"].update(metrics or {})
        self._write_status()

    def snapshot_centre(self, timeout=10.0):
        """Copies of the central parameters, taken under the centre's lock.

        Raises PlatoonError before any worker has registered parameters, and
        LockTimeout if the lock is not free within `timeout` seconds.
        """
        centre = self._res.centre
        if centre is None:
            raise PlatoonError("no centre yet: no worker has called init_shared_params()")
        centre.lock.acquire(timeout)
        try:
            return [a.copy() for a in centre.arrays]
        finally:
            centre.lock.release()

    def _write_status(self, force=False):
        """Write progress for the launcher's status line (0600), at most twice a second; a
        report that comes sooner is written by the next tick."""
        path = self._env.status_file
        now = time.monotonic()
        if path is None:
            return
        if not force and now - self._status_written < 0.5:
            self._status_pending = True
            return
        self._status_written = now
        self._status_pending = False
        status = dict(self.progress, workers=len(self._workers),
                      done=sum(r.done for r in self._workers.values()))
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), 0o600)
                json.dump(status, f)
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as exc:
            log.debug("status file %s not written: %s", path, exc)

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
            self._warnings.warning("malformed-request", "malformed request rejected: %s", exc)
            self._send_error(envelope, protocol.peek_seq(payload), exc)
            return
        try:
            self._dispatch(envelope, identity, request, frames[0])
        except (PlatoonError, ValueError, TypeError) as exc:
            self._warnings.warning("rejected-request", "request %.80r rejected: %s",
                                   request.req, exc)
            self._send_error(envelope, request.seq, exc)
        except Exception as exc:  # never let one request end the job
            log.exception("request %r failed in the controller", request.req)
            self._send_error(envelope, request.seq, exc)

    def _dispatch(self, envelope, identity, request, identity_frame):
        if request.req == protocol.REGISTER:
            self._send(envelope, request.seq,
                       self._register(identity, request.req_info, identity_frame))
            return
        record = self._by_identity.get(identity)
        if record is None:
            raise NotRegistered("request %r comes from a connection that has not registered; "
                                "create a platoon.Worker, which registers first" % (request.req,))
        if request.worker_id is not None and request.worker_id != record.worker_id:
            raise ProtocolError("request says worker_id %d but this connection registered as "
                                "worker %d" % (request.worker_id, record.worker_id))
        wid = record.worker_id
        if request.req != protocol.BARRIER:  # it gave up waiting at the barrier
            self._barrier_waiting.pop(wid, None)
        if not request.is_reserved:
            self._handle_user(envelope, request, wid)
        elif request.req == protocol.INIT_PARAMS:
            self._init_params(envelope, request, wid)
        elif request.req == protocol.PARAMS_READY:
            self._params_ready(envelope, request, wid)
        elif request.req == protocol.BARRIER:
            self._barrier_waiting[wid] = (envelope, request.seq)
            self._release_barrier()
        elif request.req == protocol.BARRIER_CANCEL:
            self._send(envelope, request.seq, None)
        elif request.req == protocol.DONE:
            info = request.req_info if isinstance(request.req_info, dict) else {}
            self._send(envelope, request.seq, None)
            if info.get("error") and not record.done:
                self._worker_died(record, {"pid": record.pid, "error": str(info["error"])})
            else:
                self._done(record)
        elif request.req == protocol.REPORT:
            self._report(wid, request.req_info)
            self._send(envelope, request.seq, None)
        elif request.req == protocol.ALLREDUCE:
            self._collectives.join(envelope, request.seq, wid, request.req_info)
        elif request.req == protocol.ALLREDUCE_CANCEL:
            self._collectives.cancel(wid, request.req_info)
            self._send(envelope, request.seq, None)
        elif request.req == protocol.ALLREDUCE_SETUP:
            self._send(envelope, request.seq, self._collectives.setup(wid, request.req_info))
        elif request.req == protocol.INIT_STATE:
            self._send(envelope, request.seq, self._collectives.state(request.req_info))
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

    def _register(self, identity, info, identity_frame):
        """A worker's registration (or, with its token, its return after a reconnect)."""
        info = info if isinstance(info, dict) else {}
        record = self._by_identity.get(identity)
        if record is None and "token" in info:
            record = self._reconnect(identity, info)
        elif record is None:
            pid, local = self._check_peer(info, identity_frame)
            if self._running() >= (self.num_workers or float("inf")):
                self._check_pids()  # a replacement may come before the tick notices a death
            if self._running() >= (self.num_workers or float("inf")):
                raise PlatoonError("job %s is full: num_workers=%d workers are running"
                                   % (self.job_id, self.num_workers))
            record = _WorkerRecord(self._assign_id(info.get("index")), identity, pid, local)
            replaced = self._workers.get(record.worker_id)
            if replaced is not None:
                self._by_identity.pop(replaced.identity, None)
            self._workers[record.worker_id] = record
            self._by_identity[identity] = record
            if self._initialiser is None and not self._centre_ready and not self.resume_from:
                self._initialiser = record.worker_id  # its values will initialise the centre
            log.info("worker %d registered (pid %s)%s", record.worker_id, pid,
                     " as the replacement of a failed one" if replaced is not None else "")
        reply = {"worker_id": record.worker_id, "is_first": record.worker_id == self._initialiser,
                 "job_id": self.job_id, "num_workers": self.num_workers,
                 "controller_pid": os.getpid(), "controller_host": _HOSTNAME,
                 "token": record.token, "max_request_bytes": self.max_request_bytes}
        if self.node_link is not None:
            reply.update(self.node_link.topology(record.worker_id))
        return reply

    def _check_peer(self, info, identity_frame):
        """(pid, local) of a registering peer, its claimed pid checked with the kernel when
        the peer is on this machine; raises PlatoonError for a claim that does not hold."""
        pid, host = info.get("pid"), info.get("host")
        if not isinstance(pid, int) or isinstance(pid, bool):
            pid = None
        if self.transport == "ipc":
            local = True
        else:
            try:
                peer = identity_frame.get("Peer-Address")
            except (zmq.ZMQError, AttributeError):
                peer = None
            if is_loopback_address(peer) and host != _HOSTNAME:
                raise PlatoonError("registration refused: a connection from this machine (%s) "
                                   "says it runs on host %r; a platoon.Worker registers with "
                                   "its own pid and host name" % (peer, host))
            local = host == _HOSTNAME
        if not local:
            return pid, False  # another machine: its pid means nothing here
        if pid is None:
            raise PlatoonError("registration refused: a worker on this machine must give its "
                               "pid (platoon.Worker does)")
        registered = sum(other.local and other.pid == pid and not other.done
                         for other in self._workers.values())
        if self.transport == "ipc":  # only this user can reach the 0700 socket directory
            reason = None if pid_alive(pid) else "no process %d runs on this machine" % pid
        else:  # each registration needs a connection of its own from that process
            try:
                held = count_connections(pid, self.control_port)
                reason = None if held > registered else (
                    "process %d holds %d connection(s) to port %d, %d of them registered"
                    % (pid, held, self.control_port, registered))
            except LookupError as exc:
                reason = str(exc)
        if reason is not None:
            raise PlatoonError("registration refused: it claims pid %d, but %s; a worker "
                               "registers with its own pid (platoon.Worker does)" % (pid, reason))
        return pid, True

    def _assign_id(self, requested):
        """The launcher's index for this worker if it is free (or belongs to a failed worker
        awaiting a replacement), else the id of a failed worker awaiting one, else the
        lowest free id."""
        ok = isinstance(requested, int) and not isinstance(requested, bool) and requested >= 0 \
            and (self.num_workers is None or requested < self.num_workers)
        if ok:
            for entry in self._awaiting:
                if entry[1] == requested:
                    self._awaiting.remove(entry)
                    return requested
            if requested not in self._workers:
                return requested
        if self._awaiting:
            return self._awaiting.pop(0)[1]
        wid = 0
        while wid in self._workers:
            wid += 1
        return wid

    def _reconnect(self, identity, info):
        """A registered worker's new connection (after a reset), proven by its token."""
        wid, token = info.get("worker_id"), info.get("token")
        record = self._workers.get(wid) if isinstance(wid, int) else None
        if record is None or not isinstance(token, str) \
                or not hmac.compare_digest(record.token.encode(), token.encode()):
            raise ProtocolError("re-registration refused: no registered worker has that id and "
                                "token")
        if record.done:
            raise PlatoonError("worker %d has already left job %s; create a new Worker"
                               % (wid, self.job_id))
        self._by_identity.pop(record.identity, None)
        record.identity = identity
        self._by_identity[identity] = record
        log.warning("worker %d reconnected (its connection was reset)", wid)
        return record

    def _running(self):
        return sum(not r.done for r in self._workers.values())

    def _init_params(self, envelope, request, wid):
        info = request.req_info if isinstance(request.req_info, dict) else {}
        layout = protocol.validate_layout(info.get("layout"))
        centre = self._res.centre
        if centre is None:
            self._reserve_shared(param_offsets(layout)[1], "the centre")
            resumed = self._load_resume(layout, wid)
            self._res.centre = centre = SharedCentre.create(self.job_id, layout)
            log.info("centre %s created by worker %d: %d parameters, %d bytes",
                     centre.name, wid, len(layout), centre.size)
            if resumed is not None:
                for dst, src in zip(centre.arrays, resumed):
                    dst[...] = src
                self._resumed = None  # in the centre now
                self._centre_ready = True
                log.info("centre initialised from checkpoint %s", self.resume_from)
        else:
            mismatch = protocol.describe_mismatch(layout, centre.layout)
            if mismatch:
                raise LayoutMismatch("worker %d: %s; every worker must pass the same parameters "
                                     "in the same order to init_shared_params" % (wid, mismatch))
        if self._centre_ready:
            self._send(envelope, request.seq, {"segment": centre.name, "initialise": False})
        elif self._initialiser in (None, wid):  # (again, after a failed first attempt)
            self._initialiser = wid
            self._send(envelope, request.seq, {"segment": centre.name, "initialise": True})
        else:
            self._init_waiting.append((envelope, request.seq))

    def _load_resume(self, layout, wid):
        """The checkpoint's arrays if resuming (checked against `layout`), else None."""
        arrays = self._resumed
        if arrays is None:
            return None
        mismatch = protocol.describe_mismatch(layout, protocol.layout_of(arrays))
        if mismatch:
            raise LayoutMismatch("worker %d: %s (the centre comes from checkpoint %s)"
                                 % (wid, mismatch.replace("job's centre", "checkpoint"),
                                    self.resume_from))
        return arrays

    def _reserve_shared(self, nbytes, what):
        """Raise PlatoonError if allocating `nbytes` more would exceed `max_shared_bytes`."""
        used = self._collectives.shared_bytes()
        if self._res.centre is not None:
            used += self._res.centre.size
        if used + nbytes > self.max_shared_bytes:
            raise PlatoonError("%s needs %d bytes of shared memory, but this job may hold %d "
                               "(%d in use); share less, or raise the Controller's "
                               "max_shared_bytes" % (what, nbytes, self.max_shared_bytes, used))

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
        if self._mb is not None:  # its minibatches: re-sent if it failed (send_mb's thread)
            self._mb.worker_left(record.token, record.dead)
        self._barrier_waiting.pop(record.worker_id, None)
        self._release_barrier()
        self._collectives.worker_left(record.worker_id)
        if record.worker_id == self._initialiser and not self._centre_ready:
            # The initialising worker left before writing: the next waiting one takes over.
            self._initialiser = None
            while self._init_waiting and self._initialiser is None:
                envelope, seq = self._init_waiting.pop(0)
                waiting = self._by_identity.get(envelope[0])
                if waiting is not None and not waiting.done:
                    self._initialiser = waiting.worker_id
                    self._send(envelope, seq, {"segment": self._res.centre.name,
                                               "initialise": True})

    def _release_barrier(self):
        if not self._barrier_waiting:
            return
        not_registered = max(0, (self.num_workers or 0) - len(self._workers)) + len(self._awaiting)
        if len(self._barrier_waiting) >= self._running() + not_registered:
            waiting, self._barrier_waiting = self._barrier_waiting, {}
            if self.node_link is not None:
                try:
                    self.node_link.barrier()  # the whole job, across nodes
                except PlatoonError as exc:
                    for envelope, seq in waiting.values():
                        self._send_error(envelope, seq, exc)
                    return
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
        """Send one minibatch (a list of numpy arrays) to the next worker that asks for one
        (in `Worker.recv_mb`); returns that worker's id.

        Safe to call from another thread while `serve` runs (one sending thread at a
        time). Waits for a request from a registered, live worker; raises
        MinibatchTimeout after `timeout` seconds (None: wait forever). Minibatches
        held by a worker that fails (dies, or closes with an error) and those a
        worker prefetched but never took are re-sent, before this one, to the next
        workers that ask: delivery is at least once. With copy=False the arrays are
        sent without a copy and must not be modified afterwards.
        """
        if self._data is None or self._data.closed:
            raise PlatoonError("call init_data(port) (or pass data_port) before send_mb(), "
                               "and keep the controller open")
        frames = [zmq.Frame(f, copy=copy) for f in protocol.encode_minibatch(arrays)]
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._data_lock:
            taker = self._mb.deliver(frames, deadline)
        if taker is None:
            raise MinibatchTimeout("no worker asked for a minibatch at %s within %.3g s; "
                                   "workers ask in recv_mb()" % (self.data_address, timeout))
        return taker

    @property
    def resent_minibatches(self):
        """How many minibatches were re-sent because the worker holding them failed or left."""
        return 0 if self._mb is None else self._mb.resent

    def flush_mb(self, timeout=None):
        """Wait until every minibatch sent is acknowledged (its worker asked for the next
        one, or left), re-sending those of workers that failed. Call it after the last
        `send_mb`. Raises MinibatchTimeout after `timeout` seconds (None: no limit)."""
        if self._data is None or self._data.closed:
            raise PlatoonError("call init_data(port) (or pass data_port) before flush_mb()")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._data_lock:
            held = self._mb.flush(deadline)
        if held:
            raise MinibatchTimeout("%d minibatch(es) sent from %s not acknowledged within %.3g s "
                                   "(workers acknowledge one by calling recv_mb again or closing)"
                                   % (held, self.data_address, timeout))

    # -- teardown --

    @property
    def shared_states(self):
        """Shared state segments (a Downpour optimizer's) as {name: [numpy arrays]}."""
        return self._collectives.states

    def close(self):
        """Close the sockets and unlink the shared centre. Idempotent."""
        self._join_checkpoint()
        if self._mb is not None:
            self._mb.close()
        self._collectives_finalizer()
        self._finalizer()
        if self._ipc_dir is not None:
            self._ipc_cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _answer_after_the_job(sock, stop, job_id, workers):
    """Reply to every request on `sock` that the job has ended (DONE is simply accepted),
    until `stop` is set. Runs on its own thread once `serve` has returned."""
    message = ("job %s has ended: its %d worker(s) are done and the controller no longer "
               "serves, so this worker came too late. Start every worker while the controller "
               "serves, and give it num_workers=N so that it waits for all of them"
               % (job_id, workers))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while not stop.is_set():
            if not poller.poll(100):
                continue
            frames = sock.recv_multipart()
            envelope, payload = frames[:-1], frames[-1]
            try:
                request = protocol.decode_request(payload)
            except ProtocolError:
                request = None
            seq = request.seq if request is not None else None
            if request is not None and request.req == protocol.DONE:
                reply = protocol.encode_reply(seq, None)
            else:
                reply = protocol.encode_error(seq, "JobEnded", message)
            sock.send_multipart(envelope + [reply])
    except zmq.ZMQError as exc:  # the socket closed under us: nothing left to answer
        log.debug("after-job replies stopped: %s", exc)


def main():
    """`python -m platoon.controller`: the default controller; serves until all workers are done."""
    with Controller() as ctl:
        if ctl.control_port is None:
            ctl.init_control(0)
        ctl.serve()


if __name__ == "__main__":
    main()
