"""The controller: a ZeroMQ ROUTER server that answers workers' control requests.

`Controller` is a facade over small parts: the `WorkerRegistry` (ids, states,
liveness, restarts), the `Rendezvous` (barrier, centre initialisation), the
`RequestDispatcher` (reserved requests through a table, the others to
`handle_control`), `NodeCollectives` (all_reduce, shared states), the
`Checkpointer`, `Progress` (the launcher's status file) and the minibatch
channel. The parts reach the controller only through `ControllerServices`.
Replies can be deferred (barrier, waiting for the centre to be initialised),
which is why the socket is a ROUTER and not a REP.
"""

import dataclasses
import logging
import os
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, cast

import numpy as np
import zmq

from ._centre.shmem import SharedCentre, remove_stale_segments
from ._centre.stopsignal import CONTROLLER, JobStop
from ._controller.afterjob import AfterJobReplies
from ._controller.arguments import default_arguments, default_parser
from ._controller.checkpointing import Checkpointer, Resume
from ._controller.collectives import NodeCollectives
from ._controller.config import ControllerConfig, check_count, default_max_shared_bytes
from ._controller.dispatch import RequestDispatcher
from ._controller.endpoints import Endpoints
from ._controller.handoff import node_link_for
from ._controller.minibatches import MinibatchChannel
from ._controller.registry import WorkerRecord, WorkerRegistry, describe_death
from ._controller.rendezvous import Rendezvous
from ._controller.services import NodeLinkProtocol
from ._controller.status import Progress
from ._controller.threadfailures import ThreadFailures
from ._deprecation import renamed_keywords
from ._os.environment import JobEnvironment
from ._os.process import announce, raise_system_exit  # noqa: F401
from ._os.process import exit_on_sigterm as _exit_on_sigterm
from ._resources import Resources
from .errors import PlatoonError, ServeTimeout, StopRequested, WorkerDied

log = logging.getLogger(__name__)
_DEFAULT = ControllerConfig  # its class attributes: the settings' defaults
# How often serve() looks whether the centre tie's final round is done, while a worker waits
# for it to evaluate the agreed centre (a multi-node job's final evaluation).
_FINAL_POLL_S = 0.01


def _configured(name: str, doc: str, settable: bool = False) -> property:
    """An attribute read from the controller's one `config` (settable: a new config, checked
    as at the start: ValueError naming the setting; None for max_shared_bytes: the default)."""
    def get(self: "Controller") -> Any:
        return getattr(self.config, name)

    def set_(self: "Controller", value: Any) -> None:
        if name == "max_shared_bytes" and value is None:
            value = default_max_shared_bytes()
        self.config = dataclasses.replace(self.config, **{name: value})
    return property(get, set_ if settable else None, doc=doc)


class Controller:
    """Serves a job's workers. Subclass it and override `handle_control`.

    `control_port` and `data_port`: ports of the control and minibatch sockets; 0
    picks a free one (see the attributes afterwards); None binds the launcher's
    choice when run by platoon-launcher, else nothing until `init_control` /
    `init_data`. `node_link`: the link to the other nodes' controllers when the job
    spans nodes (a `NodeLinkProtocol`: `platoon.mpi.NodeLink`, an elastic node's
    `ElasticLink`); by default the one its node runner (`python -m platoon.mpi`, `python -m
    platoon.elastic.node`) made for this process (PLATOON_MPI_NODE), else none. The other
    keywords are the fields of `ControllerConfig`, documented there.

    Worker processes on this machine are watched: one that exits without
    saying it is done is reported to `handle_worker_death` within about
    `liveness_interval_s`. Centres left in /dev/shm by dead jobs are removed
    at start.
    Raises PortInUse if a port is taken. Use as a context manager or call
    `close()`, which also unlinks the shared centre.
    """

    # The settings' defaults are ControllerConfig's, named here (one copy: `_DEFAULT.host` is
    # the field's default), so that the signature shows them and type checkers see each one.
    def __init__(self, control_port: Optional[int] = None, data_port: Optional[int] = None, *,
                 num_workers: Optional[int] = _DEFAULT.num_workers,
                 host: str = _DEFAULT.host,
                 job_id: Optional[str] = _DEFAULT.job_id,
                 max_request_bytes: int = _DEFAULT.max_request_bytes,
                 max_shared_bytes: Optional[int] = _DEFAULT.max_shared_bytes,
                 restarts: Optional[int] = _DEFAULT.restarts,
                 checkpoint_path: Optional[str] = _DEFAULT.checkpoint_path,
                 checkpoint_every_s: Optional[float] = _DEFAULT.checkpoint_every_s,
                 resume_from: Optional[str] = _DEFAULT.resume_from,
                 liveness_interval_s: float = _DEFAULT.liveness_interval_s,
                 keys_file: Optional[str] = _DEFAULT.keys_file,
                 replacement_timeout_s: float = _DEFAULT.replacement_timeout_s,
                 transport: str = _DEFAULT.transport,
                 allow_nonfinite: bool = _DEFAULT.allow_nonfinite,
                 checkpoint_lock_timeout_s: float = _DEFAULT.checkpoint_lock_timeout_s,
                 node_link: Optional[NodeLinkProtocol] = None) -> None:
        self._env = env = JobEnvironment.read()
        # Every setting, resolved (given, else the launcher's, else the default) and checked
        # in one place: the one object the controller and its parts read them from.
        given = locals()
        self.config = config = ControllerConfig(**{
            f.name: given[f.name] for f in dataclasses.fields(ControllerConfig)
        }).with_environment(env)
        remove_stale_segments()
        self.control_port: Optional[int] = None
        self.data_port: Optional[int] = None
        self.control_address: Optional[str] = None  # what workers connect to: tcp://...:5567
        self.data_address: Optional[str] = None
        self._res = Resources()
        self._finalizer = weakref.finalize(self, self._res.close)
        self._control: Optional[zmq.Socket] = None
        self._data: Optional[zmq.Socket] = None
        self._mb: Optional[MinibatchChannel] = None
        self._requests: Optional[RequestDispatcher] = None
        self._after_job: Optional[AfterJobReplies] = None
        me = weakref.proxy(self)  # the parts hold the controller weakly: no cycles
        self._registry = WorkerRegistry(
            lambda: me.config,
            on_left=lambda rec: me._worker_left(rec),  # noqa: SLF001
            on_registered=lambda rec: me._progress.write(force=True))  # noqa: SLF001
        registry = self._registry
        self._progress = Progress(env.status_file, lambda: (len(registry),
                                                            len(registry.departed())),
                                  counted=lambda: me._counted(),  # noqa: SLF001
                                  pids=registry.pids, dir_fd=env.log_dir_fd,
                                  extra=lambda: me._link_totals())  # noqa: SLF001
        self._next_tick = 0.0
        self._announced = False
        # close() from another thread stops serve() first: ZeroMQ sockets are not thread-safe.
        self._serve_guard = threading.Lock()  # orders serve()'s start against close()
        self._closing = threading.Event()  # close() was called: serve() returns
        self._not_serving = threading.Event()  # no serve() is running
        self._not_serving.set()
        self._serving_thread: Optional[threading.Thread] = None
        # Read now, so a bad checkpoint fails the controller at start, not a worker later.
        resume = Resume(config.resume_from, allow_nonfinite=config.allow_nonfinite) \
            if config.resume_from else None
        self._rendezvous = Rendezvous(me, registry, self._res, resume)
        self._endpoints = Endpoints(self._res, config.transport, config.host, self.job_id,
                                    config.keys_file)
        self._collectives = NodeCollectives(self)
        self._collectives_finalizer = weakref.finalize(self, self._collectives.close)
        self._job_stop = JobStop(self.job_id)
        self._job_stop_finalizer = weakref.finalize(self, self._job_stop.close)
        # An uncaught exception in any thread of this process (a feeder's) fails the job;
        # StopRequested (send_mb's, after a stop) ends a thread in order.
        self._thread_failures = ThreadFailures(on_failure=lambda *f: me._thread_failed(*f),  # noqa: SLF001
                                               ignore=(StopRequested,))
        self._thread_failures.watch()
        self._thread_failures_finalizer = weakref.finalize(self, self._thread_failures.close)
        self._checkpointer = Checkpointer(me, self._collectives, lambda: me.config,
                                          resume.job_id if resume is not None else None,
                                          dir_fd=env.log_dir_fd
                                          if config.checkpoint_path == env.checkpoint_path
                                          else None)
        self.node_link = node_link  # when the job spans nodes
        if env.mpi_node:  # run by a node runner: the link it passes, or offers
            self.node_link = node_link_for(self, node_link)
        if control_port is None:
            control_port = env.control_port
        if control_port is not None:
            self.init_control(control_port)
        if data_port is not None:
            self.init_data(data_port)

    job_id = _configured("job_id", "The job's id (names its shared memory).")
    host = _configured("host", "The interface the sockets bind.")
    transport = _configured("transport", '"tcp" or "ipc".')
    num_workers = _configured("num_workers", "Workers the job expects (None: not known).")
    max_request_bytes = _configured("max_request_bytes", "The largest control request.")
    max_shared_bytes = _configured("max_shared_bytes", "Shared memory the job may hold.",
                                   settable=True)
    resume_from = _configured("resume_from", "The checkpoint the centre starts from.")
    allow_nonfinite = _configured("allow_nonfinite", "Resume from NaN or Inf.")
    checkpoint_path = _configured("checkpoint_path", "Where `checkpoint` writes.",
                                  settable=True)
    checkpoint_every_s = _configured("checkpoint_every_s", "Period of the checkpoints.",
                                     settable=True)
    checkpoint_lock_timeout_s = _configured(
        "checkpoint_lock_timeout_s", "How long a checkpoint waits for the centre's lock.",
        settable=True)
    replacement_timeout_s = _configured(
        "replacement_timeout_s", "How long a failed worker's replacement is waited for.",
        settable=True)
    liveness_interval_s = _configured("liveness_interval_s",
                                      "How often local workers' pids are checked.", settable=True)
    @property
    def restarts_left(self) -> int:
        """Replacements still allowed (a count the registry keeps; starts at `restarts`).
        Setting it checks it: ValueError unless an integer, 0 or more."""
        return self._registry.restarts_left

    @restarts_left.setter
    def restarts_left(self, value: int) -> None:
        self._registry.restarts_left = check_count("restarts_left", value, 0)

    default_parser = staticmethod(default_parser)
    default_arguments = staticmethod(default_arguments)

    # -- set-up --

    def init_control(self, port: Optional[int]) -> Optional[int]:
        """Bind the control socket on `port` (0: a free one); returns the port."""
        if self._control is not None:
            raise PlatoonError("the control socket is already bound (%s)" % self.control_address)
        # Frames up to twice the limit get an error reply; larger ones drop the connection.
        sock, self.control_port, self.control_address = self._endpoints.listen(
            port, "control", {zmq.MAXMSGSIZE: 2 * self.max_request_bytes, zmq.RCVHWM: 100})
        self._control = sock
        self._requests = RequestDispatcher(
            weakref.proxy(self), sock, registry=self._registry, rendezvous=self._rendezvous,
            collectives=self._collectives, progress=self._progress, stop=self._job_stop)
        self._after_job = after_job = AfterJobReplies(sock, self.job_id)
        self._res.stoppers.append(after_job.stop)
        log.info("controller of job %s listening on %s", self.job_id, self.control_address)
        return self.control_port

    def init_data(self, port: Optional[int] = None, hwm: Optional[int] = None) -> Optional[int]:
        """Bind the minibatch socket on `port` (0: a free one; None: the launcher's choice,
        else a free one). `hwm`: at most this many minibatches unacknowledged by one
        worker (None: as many as its window allows; see `Worker.init_mb_sock`)."""
        if port is None:
            port = self._env.data_port or 0
        if self._data is not None:
            raise PlatoonError("the data socket is already bound (%s)" % self.data_address)
        if hwm is not None and (not isinstance(hwm, int) or hwm < 1):
            raise ValueError("hwm must be None or a positive integer, got %r" % (hwm,))
        sock, self.data_port, self.data_address = self._endpoints.listen(
            port, "data", MinibatchChannel.SOCKET_OPTIONS)
        self._mb = channel = MinibatchChannel(  # send_mb raises StopRequested after a stop
            sock, hwm, self._registry, self.data_address, stopped=self._job_stop.message)
        self._job_stop.listeners.append(channel.wake)
        self._data = sock
        return self.data_port

    # -- the user's part --

    def handle_control(self, req: str, worker_id: int, req_info: Any) -> Any:
        """Answer request `req` from worker `worker_id`; the return value (JSON) is the reply.

        An exception raised here is sent to that worker, which raises it as a
        RemoteError; the controller keeps serving.
        """
        raise PlatoonError("this controller does not handle request %r: subclass Controller and "
                           "override handle_control(req, worker_id, req_info)" % (req,))

    def handle_worker_death(self, worker_id: int, exit_info: Dict[str, Any]) -> None:
        """Called when a worker fails: it reported an error as it closed, or (on this
        machine) its process exited without saying it was done.

        `exit_info` holds its `pid`, and `error` (the worker's exception) or
        `detected_after_s` (the pid-check interval). The default raises WorkerDied,
        which ends `serve` and so the job; return instead to carry on with the others (the
        dead worker then counts as done). Within the `restarts` budget a
        replacement is expected instead and this hook is not called. It runs in
        `serve`, outside request handling, so what it raises ends `serve`.
        """
        raise WorkerDied(describe_death(worker_id, exit_info))

    # -- stopping --

    def request_stop(self, reason: Optional[str] = None) -> None:
        """Ask every worker of the job to stop (see `Worker.stop_requested`), saying why.

        Workers see it at once, through shared memory; `serve` goes on answering until
        they have all left, then returns normally. Safe from any thread, and at any
        time: a second request does nothing (the first reason stays; it is logged at DEBUG
        only), nor does one after the job ended. In a multi-node job the other nodes'
        workers see it within about `liveness_interval_s`.
        """
        if reason is not None and not isinstance(reason, str):
            raise TypeError("reason must be a string or None, got %r" % (reason,))
        self._job_stop.request(CONTROLLER, reason)

    @property
    def stop_requested(self) -> bool:
        """True once a stop was requested, by the controller or a worker."""
        return self._job_stop.requested

    @property
    def stop_reason(self) -> Optional[str]:
        """The reason given with the first stop request (None if none was given)."""
        return self._job_stop.reason

    # -- state --

    @property
    def workers(self) -> List[int]:
        """Ids of the registered workers."""
        return self._registry.ids()

    @property
    def centre(self) -> Optional[List[np.ndarray]]:
        """The central parameters as numpy arrays (None until a worker registers them)."""
        return None if self._res.centre is None else self._res.centre.arrays

    @property
    def shared_centre(self) -> Optional[SharedCentre]:
        """The centre's SharedCentre (arrays, lock, stripes), None until a worker registers
        parameters. For platoon's own parts (the MPI centre tie)."""
        return self._res.centre

    @property
    def centre_ready(self) -> bool:
        """True once the centre holds its first values (a worker's, or a checkpoint's)."""
        return self._rendezvous.centre_ready

    @property
    def param_names(self) -> Optional[List[str]]:
        """The parameters' names, saved with the checkpoints (None: none given; see
        `Worker.init_shared_params`)."""
        return self._rendezvous.names

    @property
    def shared_states(self) -> Dict[str, List[np.ndarray]]:
        """Shared state segments (a Downpour optimizer's) as {name: [numpy arrays]}."""
        return self._collectives.states

    @property
    def all_reduce_rounds(self) -> int:
        """How many all_reduce rounds have completed on this node."""
        return self._collectives.rounds

    @property
    def progress(self) -> Dict[str, Any]:
        """{"minibatches", "syncs", "metrics"}: the job's progress so far. Syncs are counted
        in shared memory and minibatches as `send_mb` delivers them, also without reports
        (each the larger of the count and the workers' reports)."""
        return self._progress.refresh()

    def add_progress(self, worker_id: int, minibatches: int = 0, syncs: Optional[int] = None,
                     metrics: Optional[dict] = None) -> None:
        """Count progress shown by the launcher's status line: `minibatches` trained since
        the last call, the worker's total `syncs`, and the latest JSON `metrics` (a dict)."""
        self._progress.add(worker_id, minibatches, syncs, metrics)

    def all_done(self) -> bool:
        """True once the expected workers have registered and all have said they are done
        (dead workers count as done; a replacement expected for one must register too)."""
        return self._registry.all_done()

    # -- for the parts (see platoon._controller.services.ControllerServices) --

    def reply(self, envelope: list, seq: Optional[int], result: Any) -> None:
        """Send `result` (JSON) as the reply to request `seq` from `envelope`."""
        self._dispatcher("reply").reply(envelope, seq, result)

    def fail(self, envelope: list, seq: Optional[int], exc: BaseException) -> None:
        """Reply to request `seq` from `envelope` with error `exc` (the worker raises it)."""
        self._dispatcher("fail").fail(envelope, seq, exc)

    @property
    def final_result(self) -> Optional[Dict[str, Any]]:
        """The job's final result, once a worker reported it (`Worker.final_evaluation`):
        {"metrics": {...}, "worker": its id}; None before. Also in the status file."""
        return self._progress.final_result or None

    @property
    def log_dir(self) -> Optional[str]:
        """The launcher's log directory for this job (its logs, status file and checkpoints):
        a place for the job's own outputs; None when the controller was not launched."""
        status_file = self._env.status_file
        return os.path.dirname(status_file) if status_file else None

    def departed_workers(self) -> List[int]:
        """Ids of the workers that have left the job (done or failed)."""
        return self._registry.departed()

    def reserve_shared(self, nbytes: int, what: str) -> None:
        """Raise PlatoonError if allocating `nbytes` more would exceed `max_shared_bytes`."""
        used = self._collectives.shared_bytes() + self._job_stop.shared_bytes
        if self._res.centre is not None:
            used += self._res.centre.size
        if used + nbytes > self.max_shared_bytes:
            raise PlatoonError("%s needs %d bytes of shared memory, but this job may hold %d "
                               "(%d in use); share less, or raise the Controller's "
                               "max_shared_bytes" % (what, nbytes, self.max_shared_bytes, used))

    def _counted(self):
        """(syncs by worker id, minibatches delivered): progress platoon counts itself."""
        centre = self._res.centre
        return ([] if centre is None else centre.sync_counts.tolist(),
                0 if self._mb is None else self._mb.delivered)

    def _thread_failed(self, exc: BaseException, thread: str) -> None:
        """In `thread`, which `exc` just ended: stop the job's workers (serve raises `exc`)."""
        log.error("the controller's thread %r failed (%s: %s); the job stops", thread,
                  type(exc).__name__, exc)
        self._job_stop.request(CONTROLLER, "the controller's thread %r failed: %s: %s"
                               % (thread, type(exc).__name__, _first_line(exc)))

    def _raise_thread_failure(self) -> None:
        failed = self._thread_failures.first
        if failed is not None:
            exc, thread = failed
            self._progress.failure = {"error": "%s: %s" % (type(exc).__name__, _first_line(exc)),
                                      "thread": thread}
            raise exc

    def _worker_left(self, record: WorkerRecord) -> None:
        if self._mb is not None:  # its minibatches: re-sent if it failed (send_mb's thread)
            self._mb.worker_left(record.token, record.failed)
        self._rendezvous.worker_left(record.worker_id)
        self._collectives.worker_left(record.worker_id)

    # -- serving --

    @renamed_keywords(timeout="timeout_s")
    def serve(self, timeout_s: Optional[float] = None) -> None:
        """Answer requests until every worker is done.

        `timeout_s` is in seconds (None: no limit); ServeTimeout is raised when it
        runs out. Blocks in recv without using CPU while idle. SIGTERM during
        serve (in the main thread) raises SystemExit so cleanup runs.

        An uncaught exception in any other thread of this process (a thread feeding
        `send_mb`, say) since the controller was made fails the job: a stop is requested
        (workers see StopRequested), and serve raises that exception, with the thread's
        traceback, within about `liveness_interval_s`. Under platoon-launcher, the
        exception serve raises (unless `handle_worker_death` raised it) leads the
        launcher's failure report.

        `close()` from another thread makes serve return (within about
        `liveness_interval_s`) before it closes anything. Raises PlatoonError on a closed
        controller, or while serve already runs.
        """
        requests = self._dispatcher("serve")
        with self._serve_guard:
            if self._closing.is_set():
                raise PlatoonError("serve() on a closed controller (job %s): create a new "
                                   "Controller" % self.job_id)
            if not self._not_serving.is_set():
                raise PlatoonError("serve() is already running in thread %r; one serve() at "
                                   "a time" % getattr(self._serving_thread, "name", None))
            self._not_serving.clear()
            self._serving_thread = threading.current_thread()
        try:
            self._serve(requests, timeout_s)
        finally:
            self._serving_thread = None
            self._not_serving.set()

    def _serve(self, requests: RequestDispatcher, timeout_s: Optional[float]) -> None:
        after_job = cast(AfterJobReplies, self._after_job)  # made with the dispatcher
        after_job.stop()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        restore = _exit_on_sigterm()
        if not self._announced:
            self._announced = _announce_ready(self._env.ready_fd, {
                "control_port": self.control_port, "data_port": self.data_port,
                "job_id": self.job_id, "pid": os.getpid()})
        if self.node_link is not None:
            self.node_link.start(self)  # the centre tie, if any
        deaths = self._registry.deaths
        self._progress.start()
        in_death_hook = False
        try:
            self._raise_thread_failure()
            while not self.all_done():
                if self._closing.is_set():
                    log.warning("the controller is being closed while serving, with %d "
                                "worker(s) registered, %d done: serve() returns",
                                len(self._registry), len(self.departed_workers()))
                    return
                wake = time.monotonic() + (
                    _FINAL_POLL_S if requests.awaiting_final or self._rendezvous.deciding
                    else self.liveness_interval_s)
                requests.serve_next(wake if deadline is None else min(wake, deadline))
                requests.answer_final()
                self._rendezvous.poll_initial_centre()
                self._raise_thread_failure()
                now = time.monotonic()
                if now >= self._next_tick:
                    self._tick(now)
                while deaths:  # outside request handling: what the hook raises ends serve
                    death = deaths.popleft()
                    in_death_hook = True
                    self.handle_worker_death(*death)
                    in_death_hook = False
                if deadline is not None and now >= deadline and not self.all_done():
                    raise ServeTimeout(
                        "serve() timed out after %.3g s with %d worker(s) registered, %d done"
                        % (timeout_s or 0.0, len(self._registry), len(self.departed_workers())))
            self._raise_thread_failure()
            if self.node_link is not None:
                self._share_stop()  # this node's stop, if any, before it waits for the others
                self.node_link.finish()  # waits for the other nodes to be done too
            after_job.start(len(self._registry))
        except Exception as exc:
            if in_death_hook:  # for the launcher: this worker's death ended the job
                self._progress.failed_worker = {"worker_id": death[0],
                                                "pid": death[1].get("pid")}
            elif self._progress.failure is None:  # the controller's own
                self._progress.failure = {"error": "%s: %s" % (type(exc).__name__,
                                                               _first_line(exc))}
            raise
        finally:
            requests.stop_waiting()
            try:
                self._checkpointer.final()
            finally:
                requests.warnings.flush()
                self._progress.write(force=True)
                restore()

    def _share_stop(self) -> None:
        """Multi-node jobs: send this node's stop to the other nodes, take theirs."""
        if self.node_link is not None:
            self.node_link.share_stop(self._job_stop)

    def _link_totals(self) -> Dict[str, int]:
        """What the node link adds to the progress totals (none on one node)."""
        return {} if self.node_link is None else self.node_link.totals()

    def _tick(self, now: float) -> None:
        """Periodic duties while serving: watch local workers' pids, give up on overdue
        replacements, share the stop signal with other nodes, checkpoint."""
        self._next_tick = now + self.liveness_interval_s
        self._dispatcher("serve").warnings.flush(expired_only=True)
        self._progress.write(force=self._progress.pending)  # also the counts of syncs
        self._registry.check_liveness()
        self._share_stop()
        if self._registry.give_up_overdue(now):
            self._rendezvous.release_barrier()
        self._checkpointer.tick(now)

    # -- the centre --

    def checkpoint(self, path: Optional[str] = None) -> str:
        """Write the centre to `path` (default: `checkpoint_path`) atomically; returns the path.

        Taken under the centre's lock, so it is consistent. Raises PlatoonError
        when there is no centre or no path, LockTimeout if the lock is not free within
        `checkpoint_lock_timeout_s`, OSError if the file cannot be written.
        """
        return self._checkpointer.write(path)

    @renamed_keywords(timeout="timeout_s")
    def snapshot_centre(self, timeout_s: Optional[float] = 10.0) -> List[np.ndarray]:
        """Copies of the central parameters, taken under the centre's lock.

        Raises PlatoonError before any worker has registered parameters, and
        LockTimeout if the lock is not free within `timeout_s` seconds.
        """
        if self._res.centre is None:
            raise PlatoonError("no centre yet: no worker has called init_shared_params()")
        return self._res.centre.snapshot(timeout_s)

    # -- minibatches --

    @renamed_keywords(timeout="timeout_s")
    def send_mb(self, arrays: List[np.ndarray], *, timeout_s: Optional[float] = None,
                copy: bool = True) -> int:
        """Send one minibatch (a list of numpy arrays) to the next worker that asks for one
        (in `Worker.recv_mb`); returns that worker's id.

        Safe to call from another thread while `serve` runs (one sending thread at a
        time). Waits for a request from a registered, live worker; raises
        MinibatchTimeout after `timeout_s` seconds (None: wait forever). Minibatches
        held by a worker that fails (dies, or closes with an error) and those a
        worker prefetched but never took are re-sent, before this one, to the next
        workers that ask: delivery is at least once. With copy=False the arrays are
        sent without a copy and must not be modified afterwards. Raises StopRequested
        once a stop of the job was requested (at once, also while waiting): no worker
        asks any more, and UsedAfterFork in a process forked from this one (feed from a
        thread: ZeroMQ sockets do not work after fork()).
        """
        return self._channel("send_mb").send_mb(arrays, timeout_s, copy)

    @renamed_keywords(timeout="timeout_s")
    def flush_mb(self, timeout_s: Optional[float] = None) -> None:
        """Wait until every minibatch sent is acknowledged (its worker asked for the next
        one, or left), re-sending those of workers that failed. Call it after the last
        `send_mb`. Raises MinibatchTimeout after `timeout_s` seconds (None: no limit),
        StopRequested once a stop of the job was requested, UsedAfterFork as `send_mb`."""
        self._channel("flush_mb").flush_mb(timeout_s)

    @property
    def resent_minibatches(self) -> int:
        """How many minibatches were re-sent because the worker holding them failed or left."""
        return 0 if self._mb is None else self._mb.resent

    def _channel(self, caller: str) -> MinibatchChannel:
        if self._data is None or self._data.closed or self._mb is None:
            raise PlatoonError("call init_data(port) (or pass data_port) before %s(), and keep "
                               "the controller open" % caller)
        return self._mb

    def _dispatcher(self, caller: str) -> RequestDispatcher:
        if self._requests is None:
            raise PlatoonError("call init_control(port) (or pass control_port) before %s()"
                               % caller)
        return self._requests

    # -- teardown --

    CLOSE_WAITS_FOR_SERVE_S = 30.0  # plus liveness_interval_s: a handle_control's own time

    def close(self) -> None:
        """Close the sockets and unlink the shared centre. Idempotent.

        Safe from any thread: a `serve()` running in another one (leaving a ``with
        Controller()`` block through an exception, say) is made to return first, so no
        socket is closed under it. Raises PlatoonError when called from inside serve()
        (a handle_control, say: call request_stop there), or when serve() does not return
        within `CLOSE_WAITS_FOR_SERVE_S` seconds (the sockets are then left open).
        """
        with self._serve_guard:
            serving = self._serving_thread
            if serving is threading.current_thread():
                raise PlatoonError("close() called from inside serve(): its sockets are in "
                                   "use; call request_stop() to end the job, and close the "
                                   "controller after serve() returns")
            self._closing.set()
        limit = self.CLOSE_WAITS_FOR_SERVE_S + self.liveness_interval_s
        if not self._not_serving.wait(limit):
            raise PlatoonError("serve() in thread %r did not return within %.3g s of close(); "
                               "the controller's sockets are left open (a handle_control or "
                               "handle_worker_death that does not return?)"
                               % (getattr(serving, "name", None), limit))
        if self.node_link is not None:  # a multi-node job's centre tie: its rounds end before
            self.node_link.end_tie()  # the centre
        self._checkpointer.join()
        self._thread_failures_finalizer()
        if self._mb is not None:
            self._mb.close()
        self._collectives_finalizer()
        self._job_stop_finalizer()
        self._finalizer()
        self._endpoints.close()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of `exc`'s message, at most `limit` characters."""
    text = (str(exc).splitlines() or [""])[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _announce_ready(fd: Optional[int], message: dict) -> bool:
    """Tell a waiting launcher, through the pipe `fd` it passed, where we listen; returns
    whether there was one to tell."""
    if fd is None:
        return False
    try:
        announce(fd, message)
    except OSError as exc:
        log.warning("could not tell the launcher that the controller is ready: %s", exc)
    return True


def main() -> None:
    """`python -m platoon.controller`: the default controller; serves until all workers are done."""
    with Controller() as ctl:
        if ctl.control_port is None:
            ctl.init_control(0)
        ctl.serve()


__all__ = ["Controller", "default_max_shared_bytes", "main", "raise_system_exit"]

if __name__ == "__main__":
    main()
