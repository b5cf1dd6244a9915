"""The worker: a client of the controller that shares its parameters through the centre."""

import functools
import logging
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

import numpy as np
import zmq

from . import adapters, protocol, security
from ._centre.stopsignal import StopSignal, describe
from ._deprecation import renamed_keywords
from ._os.environment import JobEnvironment
from ._os.process import unlink_segments_on_sigterm
from ._resources import Resources
from ._worker.client import ControlClient, endpoint, uncaught_error
from ._worker.collectives import WorkerCollectives
from ._worker.exchange import Exchange, SyncHandle, SyncStats, share
from ._worker.ports import await_ports
from .device import Device
from .errors import ControllerGone, ControllerTimeout, PlatoonError, StopRequested, WorkerClosed
from .placement import Placement
from .rules import ParamSyncRule

if TYPE_CHECKING:
    from ._worker.minibatches import MinibatchClient

log = logging.getLogger(__name__)

_DEFAULT: Any = object()  # "the worker's timeout_s"
_STOP_POLL_S = 0.1  # how often recv_mb looks at the stop signal while it waits
_REMOTE_STOP_POLL_S = 1.0  # how often a worker without the segment asks the controller
Port = Union[int, str, None]  # a port number or an endpoint string


def _while_open(method):
    """`method` raises WorkerClosed once the worker is closed (its sockets, centre and
    minibatch channel are gone then: no method may reach them)."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if self._closed:
            raise WorkerClosed("worker %s is closed (by close(), or at the end of its with "
                               "block): %s() needs an open worker; create a new Worker to "
                               "take part again" % (self.worker_id, method.__name__))
        return method(self, *args, **kwargs)
    return guarded


class Worker:
    """One training process of a job.

    Connects to the controller at tcp://host:control_port (or at the endpoint
    `control_port` when it is a string, such as a controller's
    `control_address` on the ipc transport) and registers,
    learning `worker_id` (0-based), `is_first`, `job_id` and `num_workers` (the
    controller's, None when it was not given one). `device` is the
    device the launcher pinned this worker to ("cuda0", "cpu"; "cpu" when run
    by hand), a `platoon.device.Device`: a str whose `local` is its name inside
    the process ("cuda:0": a pinned GPU is the only one the process sees) and
    `torch` the torch.device, as in ``model.to(w.device.local)``. `elastic_node` is
    its node's name in an elastic job (``python -m platoon.elastic.node``), else None.
    `global_rank` of `global_size` number it among every worker of the job (on one node,
    its `local_rank` of `local_size`); `placed_in_job` is False where they cannot (an
    elastic node started without ``--slot``: they are then its node's own). `placement` holds
    them all, as one `platoon.placement.Placement` (with its `label`, ``NODE/workerK`` or
    ``workerK``, and its `seed_offset`).

    Parameters:
        control_port: the controller's control port or endpoint string (None: the
            launcher's; in a script run by itself, with no launcher, a one-worker job:
            a controller serving in a thread of this process, closed with the worker,
            said once on stderr, so one script serves alone and under the launcher;
            SIGTERM then unlinks the job's segments before raising SystemExit or calling
            the script's own earlier handler, and the worker's failure is left to the
            script's own traceback).
        data_port: if given (a port or an endpoint string), also connect to the
            minibatch channel (see `recv_mb`).
        host: the controller's address.
        timeout_s: seconds to wait for any reply (None: forever); a request that
            times out raises ControllerTimeout and leaves the worker usable.
            (Old name: `timeout`, deprecated.)
        keys_file: the job's CURVE keys when the controller requires them
            (default: the launcher's, if any).

    Raises ControllerTimeout if no controller answers. Use as a context manager
    or call `close()`, which tells the controller this worker is done.
    """

    @renamed_keywords(timeout="timeout_s")
    def __init__(self, control_port: Port = None, data_port: Port = None, *,
                 host: str = "127.0.0.1", timeout_s: Optional[float] = 60.0,
                 keys_file: Optional[str] = None) -> None:
        # a node runner's worker may start before its controller serves: its ports come then
        env = JobEnvironment.read() if control_port is not None else await_ports(timeout_s)
        alone = None
        if control_port is None:
            control_port = env.control_port
            if control_port is None and env.launcher_pid is not None:
                raise ValueError("Worker needs the controller's control_port, or to run under "
                                 "platoon-launcher (which sets PLATOON_CONTROL_PORT)")
            if control_port is None:  # a script run by itself: a one-worker job
                alone = _OwnController(host)
                control_port = alone.address
        self.host = host
        self.timeout_s = timeout_s
        self.device = Device(env.device or "cpu")
        self.control_address = endpoint(host, control_port)
        self.worker_id = None
        self.is_first = False
        self.job_id = None
        self._res = Resources()
        # Its own controller (if any) closes after the worker's goodbye: finalizers made
        # later run first.
        self._own_controller = alone
        if alone is not None:
            self._own_finalizer = weakref.finalize(self, alone.close)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._closed = False
        self._sync_lock = threading.Lock()
        self._local: Optional[List[np.ndarray]] = None
        self._rule: Optional[ParamSyncRule] = None
        self._exchange: Optional[Exchange] = None
        self._adapter: Optional[adapters.Adapter] = None
        self._mb: Optional["MinibatchClient"] = None
        self._coll = WorkerCollectives()
        self._coll_finalizer = weakref.finalize(self, self._coll.close)
        # the job's stop flag in shared memory (see request_stop)
        self._stop_signal: Optional[StopSignal] = None
        self._stop_state = {"stop": False, "by": None, "reason": None}  # without it: asked
        self._stop_asked = -float("inf")
        keys_file = keys_file or env.keys_file
        try:
            self._client = ControlClient(
                self._res, self.control_address, index=env.worker_index,
                keys=security.load_keys(keys_file) if keys_file else None)
            info = self._client.register(timeout_s)
            self.worker_id = info["worker_id"]
            self.is_first = info["is_first"]
            self.job_id = info["job_id"]
            self._set_topology(info)
            self._attach_stop_signal(info.get("stop_segment"))
            if data_port is not None:
                self.init_mb_sock(data_port)
        except BaseException:
            self._finalizer()
            if alone is not None:
                self._own_finalizer()
            raise
        # Alone, the script's own traceback says how it failed; its controller, in this
        # process, would only say it again (as WorkerDied, suggesting the launcher's --restart).
        self._client.arm_farewell(report_error=alone is None)
        log.info("worker %d registered with job %s at %s", self.worker_id, self.job_id,
                 self.control_address)

    @property
    def timeout(self) -> Optional[float]:
        """Deprecated name of `timeout_s`."""
        return self.timeout_s

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self.timeout_s = value

    # -- control --

    @renamed_keywords(timeout="timeout_s")
    @_while_open
    def send_req(self, req: Any, info: Any = None, *, timeout_s: Optional[float] = _DEFAULT
                 ) -> Any:
        """Send request `req` with JSON-serialisable `info`; return the controller's reply.

        `req` is usually a string; any JSON value (such as a dict, as the
        original Platoon sent) reaches `handle_control` as it is.
        `timeout_s` in seconds overrides the worker's default (None: forever).
        Raises ControllerTimeout when no reply comes in time, ProtocolError
        at once for a request over the controller's size limit, and RemoteError
        when the controller answers with an error (its message and traceback
        included). If the connection was reset meanwhile, the worker registers
        again under its id and sends the request once more.
        """
        return self._client.request(req, info, timeout_s=self._timeout_s(timeout_s))

    def _timeout_s(self, timeout_s):
        return self.timeout_s if timeout_s is _DEFAULT else timeout_s

    @_while_open
    def report(self, minibatches: int = 0, **metrics: Any) -> None:
        """Tell the controller about progress: `minibatches` trained since the last report
        and any JSON metrics (loss=..., error=...). The launcher shows them in its status line.
        """
        self.send_req(protocol.REPORT, {"minibatches": minibatches, "syncs": self.syncs,
                                        "metrics": metrics})

    @_while_open
    def final_evaluation(self, evaluate: Callable[[], Any], *,
                         timeout_s: Optional[float] = _DEFAULT) -> Optional[Dict[str, Any]]:
        """Call after this worker's last sync: the job's last worker to do so evaluates the
        final centre, once, with `evaluate`, and the controller keeps the result.

        The final centre is the centre after the last sync of every worker. Each worker
        tells the controller it is past its last sync; the last one of the job's workers
        (none may be still to register or to replace) calls ``evaluate()``, which loads
        the centre and returns its metrics (a dict of JSON numbers or strings; tensors and
        numpy scalars are converted), and reports them: the controller writes them to the
        status file as ``final_result`` {"metrics", "worker"} and the launcher's summary
        shows them. Returns the metrics on that worker, None on the others (which do not
        wait). `PeriodicSync(..., evaluate=fn)` calls this from its `finish()`.

        On several nodes with tied centres (``platoon.mpi --tie-*``) the final centre is
        the agreed one: the last worker of each node waits (by default as long as the
        other nodes train: the job's collective timeout bounds it) for the tie's final
        round, which makes every node's centre the same, and node 0's evaluates it, once;
        its node prints the result and the launcher's summary shows it. Without a tie each
        node evaluates its own centre. In an elastic job it waits likewise, until every
        node of the quorum is done (its node bounds that wait: ``--final-timeout-s``).
        Raises TypeError when `evaluate` returns something else than a dict, and as
        `send_req`.
        """
        wait_s = None if timeout_s is _DEFAULT and (
            self.num_nodes > 1 or self.elastic_node is not None) else timeout_s
        reply = self.send_req(protocol.TRAINED, {}, timeout_s=wait_s)
        if not (isinstance(reply, dict) and reply.get("evaluate")):
            return None
        result = evaluate()
        if not isinstance(result, dict):
            raise TypeError("the final evaluation must return a dict of metrics, such as "
                            "{'accuracy': 0.89}, got %r" % (result,))
        metrics = {str(key): _json_number(value) for key, value in result.items()}
        self.send_req(protocol.FINAL_RESULT, {"metrics": metrics}, timeout_s=timeout_s)
        log.info("worker %d: final result %s", self.worker_id, metrics)
        return metrics

    @_while_open
    def start_together(self, *, timeout_s: Optional[float] = _DEFAULT) -> bool:
        """Wait until every worker of the job is here (a `barrier`), so that all begin
        training together; returns True. Once training is underway (the centre has
        counted a sync: a replacement, or a worker registering late) it returns False at
        once, as it does on an elastic node (`elastic_node`): its nodes come and go, so no
        barrier holds the job's workers, and `init_shared_params` already waited for the
        values they all start from (a live node's anchor, for a joiner). Call it after
        `init_shared_params`.

        Raises ControllerTimeout after `timeout_s` seconds (default: the worker's), saying
        how many workers the job expects.
        """
        centre = self._res.centre
        if self.elastic_node is not None or (centre is not None and centre.sync_counts.any()):
            return False
        timeout_s = self._timeout_s(timeout_s)
        try:
            self.barrier(timeout_s=timeout_s)
        except ControllerTimeout as exc:
            raise ControllerTimeout(
                "worker %s waited %s s for the job's %s workers to start together, and not all "
                "came (%s); start them all, give the worker a longer timeout_s, or opt out "
                "(PeriodicSync(..., start_together=False))"
                % (self.worker_id, timeout_s, self.num_workers or "registered", exc)) from exc
        return True

    @renamed_keywords(timeout="timeout_s")
    @_while_open
    def barrier(self, *, timeout_s: Optional[float] = _DEFAULT) -> None:
        """Wait until every worker of the job has reached the barrier.

        Raises ControllerTimeout after `timeout_s` seconds (default: the
        worker's); the worker then withdraws from the barrier, so the others do
        not pass it without this worker.
        """
        try:
            self.send_req(protocol.BARRIER, timeout_s=timeout_s)
        except ControllerTimeout:
            try:
                self.send_req(protocol.BARRIER_CANCEL, timeout_s=1.0)
            except PlatoonError:
                pass  # the controller is unreachable: nobody passes the barrier anyway
            raise

    # -- stopping --

    @_while_open
    def request_stop(self, reason: Optional[str] = None) -> None:
        """Ask every worker of the job to stop (each sees `stop_requested` turn True).

        The controller records `reason` and who asked, and logs them; it keeps serving
        until every worker has left, then the job ends normally. Asking again (here or
        elsewhere) keeps the first reason; asking once the controller has gone does
        nothing. Raises RemoteError/ControllerTimeout as `send_req`.
        """
        if reason is not None and not isinstance(reason, str):
            raise TypeError("reason must be a string or None, got %r" % (reason,))
        try:
            self._stop_state = self.send_req(protocol.STOP, {"request": True, "reason": reason})
        except ControllerGone as exc:
            log.info("worker %d: stop not requested, the job has ended: %s", self.worker_id, exc)

    @property
    def stop_requested(self) -> bool:
        """True once a stop of the job was requested, by any worker or the controller.

        Reads one byte of shared memory (well under a microsecond): check it as often as
        you like, say once a minibatch. A worker on another machine than its controller
        asks the controller instead, at most once a second.
        """
        signal = self._stop_signal
        if signal is not None:
            return signal.is_set()
        return self._asked_stop_state()["stop"]

    @property
    def stop_reason(self) -> Optional[str]:
        """The reason given with the first stop request (None before one, or if none
        was given)."""
        signal = self._stop_signal
        if signal is not None:
            return signal.state()[1]
        return self._asked_stop_state()["reason"]

    def _attach_stop_signal(self, name):
        if name is None or self._client.controller_pid is None:
            return  # no segment, or on another machine: asked by request instead
        try:
            self._stop_signal = signal = StopSignal.attach(name)
        except PlatoonError as exc:
            log.warning("worker %d: cannot map the stop signal (%s); asking the controller "
                        "instead", self.worker_id, exc)
            return
        self._stop_finalizer = weakref.finalize(self, signal.close)

    def _asked_stop_state(self):
        now = time.monotonic()
        if not self._stop_state["stop"] and not self._closed \
                and now - self._stop_asked >= _REMOTE_STOP_POLL_S:
            self._stop_asked = now
            self._stop_state = self.send_req(protocol.STOP, {"request": False})
        return self._stop_state

    def _stopped(self, where):
        by, reason = (self._stop_signal.state() if self._stop_signal is not None
                      else (self._stop_state["by"], self._stop_state["reason"]))
        return StopRequested("%s: %s asked job %s to stop (%s)" % (
            where, describe(by), self.job_id, reason or "no reason given"))

    # -- topology and collectives (platoon.collectives, platoon.mpi) --

    def _set_topology(self, info):
        # The controller's num_workers (None when it was not told): the workers sharing
        # this centre, which rules such as DiLoCo scale by.
        self.num_workers: Optional[int] = info.get("num_workers")
        # where this worker stands, as one object; the attributes below are its fields
        self.placement = placed = Placement.from_registration(self.worker_id or 0, info)
        self.local_rank = placed.local_rank
        self.local_size = placed.local_size
        self.global_rank = placed.global_rank
        self.global_size = placed.global_size
        self.node_rank = placed.node_rank
        self.num_nodes = placed.num_nodes
        self.elastic_node: Optional[str] = placed.elastic_node
        self.placed_in_job: bool = placed.placed_in_job

    @renamed_keywords(timeout="timeout_s")
    @_while_open
    def all_reduce(self, array: np.ndarray, op: str = "sum", *, out: Optional[np.ndarray] = None,
                   timeout_s: Optional[float] = _DEFAULT) -> np.ndarray:
        """Reduce `array` over every worker of the job; return the result.

        `op` is "sum", "mean" (floats only), "max" or "min" (not complex). The
        result goes into `out` (same shape and dtype) or, by default, into
        `array` itself. Every worker must call the same all_reduces in the same
        order. Workers of a node reduce through shared memory in worker-id
        order, so results are identical on every worker; the controllers
        combine nodes over MPI. Raises ValueError/TypeError for a bad op or
        array, ControllerTimeout after `timeout_s` s (default: the worker's),
        RemoteError if a worker left or the workers' ops differ.
        """
        return self._coll.all_reduce(self.send_req, array, op, out, self._timeout_s(timeout_s))

    @_while_open
    def shared_state(self, name: str, layout: List[dict]) -> List[np.ndarray]:
        """Zero-initialised arrays in shared memory, one set per job and `name`.

        `layout` is ``[{"dtype": str, "shape": [int]}]`` (see
        `platoon.protocol.layout_of`); every worker asking for `name` gets the
        same memory. The controller owns it (`Controller.shared_states`).
        """
        reply = self.send_req(protocol.INIT_STATE, {"name": name, "layout": layout})
        return self._coll.attach(reply["segment"], protocol.validate_layout(layout)).arrays

    # -- shared parameters --

    @_while_open
    def init_shared_params(self, params: Any, param_sync_rule: ParamSyncRule,
                           cleanup: bool = False, *,
                           names: Optional[Sequence[str]] = None) -> None:
        """Share `params` through the job's centre.

        `params` is a list of writable numpy arrays (updated in place), of
        PyTorch tensors or an nn.Module, of CuPy or pycuda GPU arrays, or of
        JAX arrays (see `platoon.adapters`).

        The first worker to call this initialises the centre with its values;
        every later worker's `params` are overwritten with the centre, so all
        start equal. `param_sync_rule` (a ParamSyncRule such as EASGD(0.5)) is
        applied by `sync_params`. `cleanup` is accepted for compatibility: the
        controller always owns and removes the shared memory. `names`, one
        distinct string per parameter (a model's state-dict keys, say), name them
        in the centre's checkpoints (see `platoon.load_centre`).

        Raises LayoutMismatch when the parameters differ from the centre's in
        number, dtype or shape, or their names from the names the centre has
        (the centre is left untouched), TypeError for unusable arrays, and
        TypeError or ValueError for bad `names`.
        """
        if self._local is not None:
            raise PlatoonError("init_shared_params() was already called on worker %s"
                               % self.worker_id)
        if not isinstance(param_sync_rule, ParamSyncRule):
            raise TypeError("param_sync_rule must be a platoon.ParamSyncRule (such as "
                            "EASGD(alpha=0.5)), got %r" % (param_sync_rule,))
        adapter = adapters.adapt(params)
        if self._res.centre is not None:  # left by an earlier attempt that failed
            self._res.centre.close()
            self._res.centre = None
        exchange = share(self._init_request, adapter, param_sync_rule, self._res,
                         cast(int, self.worker_id), self.timeout_s, names=names)
        self.is_first = exchange.first
        param_sync_rule.attach(self)  # rules with shared state (Downpour's optimizer)
        param_sync_rule.setup(adapter.arrays)
        self._adapter = adapter
        self._local = adapter.arrays
        self._rule = param_sync_rule
        self._exchange = exchange

    def _init_request(self, req: Any, info: Any = None) -> Any:
        # An elastic node answers platoon-init-params once its tie has decided whether a live
        # peer gives the centre's first values: the node bounds that wait, not the worker.
        wait_s = None if req == protocol.INIT_PARAMS and self.elastic_node is not None \
            else _DEFAULT
        return self.send_req(req, info, timeout_s=wait_s)

    @property
    def shared_params(self) -> Optional[List[np.ndarray]]:
        """The central parameters as numpy arrays in shared memory (None before init)."""
        centre = self._res.centre
        return None if centre is None else centre.arrays

    @property
    def stripes(self) -> List[List[Tuple[int, int, int]]]:
        """How the centre is cut into stripes, each locked on its own: for each stripe,
        (param_index, start, stop) ranges of flat element indices ([] before init)."""
        centre = self._res.centre
        return [] if centre is None else centre.stripes

    @_while_open
    def snapshot_centre(self, timeout_s: Optional[float] = _DEFAULT) -> List[np.ndarray]:
        """Copies of the central parameters, taken under the centre's whole lock.

        A consistent snapshot: no stripe is half-updated (another worker's sync
        may have reached some stripes and not yet others, as always). Waits at
        most `timeout_s` seconds (default: the worker's) for the lock, else
        LockTimeout. Raises PlatoonError before `init_shared_params`.
        """
        if self._res.centre is None:
            raise PlatoonError("call init_shared_params() before snapshot_centre()")
        return self._res.centre.snapshot(self._timeout_s(timeout_s))

    @_while_open
    def sync_params(self, synchronous: bool = True, *, params: Optional[Sequence] = None
                    ) -> List[Any]:
        """Apply the sync rule between this worker's parameters and the centre, in place.

        With synchronous=True (the default) each stripe of the centre is
        updated under its own lock (waiting at most the worker's timeout_s, else
        LockTimeout); rules that are not elementwise, and a caller holding
        `lock()`, update the whole centre under the whole lock. With False the
        caller is responsible for locking (see `lock`). Device parameters are
        copied to host before and back after, outside any lock. For immutable
        arrays (JAX) pass the current ones as `params`. Returns the parameters
        (new arrays for JAX, the same objects otherwise).
        """
        adapter, exchange = self._shared("sync_params")
        self._client.check_controller()
        with self._sync_lock:
            adapter.pull(params)
            exchange.sync(lock=synchronous)
            adapter.push()
        return adapter.params()

    @_while_open
    def start_sync(self, *, snapshot: Optional[bool] = None) -> SyncHandle:
        """Start a sync in a background thread; returns a SyncHandle: call its `wait()`.

        Default (snapshot=None): until `wait()` platoon does not touch the
        parameters, so the worker may go on computing and updating them; `wait()`
        applies the sync's effect on top of those updates. Of the two ways to keep
        that promise, the worker takes whichever cost its calling thread less in
        the syncs it measured (the median of the last 9 of each): overlapping (as
        snapshot=True) or syncing at once before this returns (the handle's
        ``at_once`` is then True and `wait()` has nothing to do). It tries the
        other way every 16 syncs, so the choice follows the compute beside it.
        It starts at once, and never overlaps while syncs at once take under 1 ms
        (their median): an overlap cannot save more than the sync takes, and
        costs a copy, a pull and a hand-off to the sync thread. Either way the
        default never costs much more than `sync_params()`.

        snapshot=True: always overlap. The parameters are copied (a snapshot)
        before this returns; `wait()` applies the sync's effect on top of the
        worker's updates: EASGD ``x += -alpha * (x_snap - c)``, ASGD
        ``x = c_new + (x - x_snap)``, where ``x_snap`` is the snapshot and ``c``
        each stripe of the centre when it was pushed. When the parameters did
        not change in between, the result equals `sync_params()` bit for bit.
        The copy and the pull cost the caller about one sync's time: it pays
        only when the compute beside it hides more.

        snapshot=False: no copy; the background thread runs `sync_params()`'s
        own update on the parameters themselves, stripe by stripe, at about
        `sync_params()`'s cost. Until `wait()` returns the caller must not write
        the parameters (an optimizer step, a load, ``p.data = ...``): such a write
        may be lost or half-applied. Reading them is safe (say the next
        minibatch's forward and backward): each element read holds its value
        from before or from after the sync, not one torn in between, and
        elements in different stripes may differ in which. After `wait()` the
        parameters and the centre are bit for bit what `sync_params()` gives.
        Parameters that are not all C-contiguous are copied anyway (the
        handle's ``snapshot`` attribute says which path ran).

        Device parameters are copied to host at the start (and, with a
        snapshot, at `wait()`), and back after `wait()`. One sync at a time:
        raises PlatoonError while one is in flight; TypeError for rules without
        push/pull and for immutable (JAX) parameters, which need
        `sync_params(params=...)`.
        """
        adapter, exchange = self._shared("start_sync")
        if not adapter.in_place:
            raise TypeError("start_sync() updates parameters in place, which JAX arrays do not "
                            "allow; call sync_params(params=...) instead")
        self._client.check_controller()
        with self._sync_lock:
            began = time.perf_counter()
            choice = exchange.overlap if snapshot is None else None
            if choice is not None and choice.choose() == choice.AT_ONCE:
                exchange.check_async()
                adapter.pull()
                exchange.sync()
                adapter.push()
                choice.record(choice.AT_ONCE, time.perf_counter() - began)
                return SyncHandle.finished(exchange)
            adapter.pull()
            return exchange.start(snapshot=snapshot is not False, choice=choice, began=began)

    def _shared(self, caller: str) -> "tuple[adapters.Adapter, Exchange]":
        """The adapter and exchange of the shared parameters; PlatoonError before
        `init_shared_params`."""
        if self._adapter is None or self._exchange is None:
            raise PlatoonError("call init_shared_params() before %s()" % caller)
        return self._adapter, self._exchange

    @property
    def syncs(self) -> int:
        """Completed syncs, synchronous or not (a failed one does not count); equals
        `sync_stats.syncs`."""
        return 0 if self._exchange is None else self._exchange.stats.syncs

    @property
    def sync_stats(self) -> Optional[SyncStats]:
        """A SyncStats: sync count and lock hold/wait times (None before init)."""
        return None if self._exchange is None else self._exchange.stats

    @renamed_keywords(timeout="timeout_s")
    @_while_open
    def lock(self, timeout_s: Optional[float] = None) -> "HeldLock":
        """Take the centre's whole lock, waiting at most `timeout_s` seconds (None: forever).

        Use ``with w.lock(timeout_s):``, which releases it on leaving the block, or
        call `unlock()`. Raises LockTimeout.
        """
        if self._res.centre is None:
            raise PlatoonError("call init_shared_params() before lock()")
        self._res.centre.lock.acquire(timeout_s)
        return HeldLock(self.unlock)

    @_while_open
    def unlock(self) -> None:
        """Release the centre's lock taken by `lock`."""
        if self._res.centre is None:
            raise PlatoonError("call init_shared_params() before unlock()")
        self._res.centre.lock.release()

    # -- minibatches --

    @_while_open
    def init_mb_sock(self, port: Port = None, *, prefetch: Optional[int] = None,
                     window_bytes: Optional[int] = protocol.DEFAULT_MB_WINDOW_BYTES) -> None:
        """Connect to the controller's minibatch channel on `port` (an endpoint string, or
        None: the launcher's).

        Minibatches come only when asked for: `recv_mb` asks for the one it waits for and
        more ahead, so the next ones travel while this one is used, within a window:
        at most `prefetch` minibatches ahead (None: 999; 0: none) and `window_bytes`
        of minibatches not yet finished (default 16 MiB; None: no byte bound). The
        controller sends one more while the worker holds less than `window_bytes`
        (and one whatever its size), so a worker that fails holds at most
        `window_bytes` plus one minibatch, re-sent to others. A worker that never
        calls `recv_mb` gets none. See docs/api.md, "The minibatch window".

        The process's heap is kept from then on, not given back after each burst of
        minibatches (`platoon._os.heap.keep_heap`: glibc's malloc thresholds, unless the
        user set them): each one received would otherwise touch fresh pages.
        """
        if port is None:
            port = JobEnvironment.read().data_port
            if port is None:
                raise ValueError("init_mb_sock() needs the controller's data port, or to run "
                                 "under platoon-launcher with a controller that called "
                                 "init_data()")
        if self._mb is not None:
            raise PlatoonError("the minibatch socket is already connected")
        if prefetch is not None and (not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError("prefetch must be None or an integer >= 0, got %r" % (prefetch,))
        if window_bytes is not None and (not isinstance(window_bytes, int) or window_bytes < 1):
            raise ValueError("window_bytes must be None or an integer >= 1, got %r"
                             % (window_bytes,))
        from ._os.heap import keep_heap
        from ._worker.minibatches import MinibatchClient  # loaded by the workers that use it only
        keep_heap()
        sock = self._client.socket(zmq.DEALER)
        address = endpoint(self.host, port)
        sock.connect(address)
        self._mb = client = MinibatchClient(
            sock, self.worker_id, self._client.token, prefetch, self._client.controller_alive,
            self._client.set_rcvtimeo, address, window_bytes or 0,
            failed=lambda: uncaught_error() is not None)  # an exception ending the script
        # Created after the sockets' finalizer, so it runs first at exit: goodbye, then close.
        self._mb_leave = weakref.finalize(self, client.leave)

    @renamed_keywords(timeout="timeout_s")
    @_while_open
    def recv_mb(self, *, timeout_s: Optional[float] = _DEFAULT) -> List[np.ndarray]:
        """Receive one minibatch: the list of arrays given to `Controller.send_mb`.

        Calling it again acknowledges the previous minibatch as finished; a worker
        that fails holding one (or closes with minibatches prefetched) has the
        controller re-send it to another worker. The arrays keep dtype, shape and
        memory order and are read-only views of the received message (no copy);
        copy one to modify it. Raises MinibatchTimeout after `timeout_s` seconds
        (default: the worker's), ProtocolError for a malformed message or when the
        controller refuses the request, and StopRequested once a stop of the job was
        requested (at once, or within 0.1 s while it waits), as no more minibatches may come.
        """
        if self._mb is None:
            raise PlatoonError("call init_mb_sock(port) (or pass data_port) before recv_mb()")
        if self.stop_requested:
            raise self._stopped("recv_mb")
        timeout_s = self._timeout_s(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._mb.receive(self._recv_unless_stopped, deadline, timeout_s)

    def _recv_unless_stopped(self, sock, deadline, copy=True):
        """`ControlClient.recv_within`, raising StopRequested when a stop is requested."""
        recv_within = self._client.recv_within
        while True:
            step = time.monotonic() + _STOP_POLL_S
            frame = recv_within(sock, step if deadline is None else min(step, deadline), copy)
            if frame is not None or (deadline is not None and time.monotonic() >= deadline):
                return frame
            if self.stop_requested:
                raise self._stopped("recv_mb")

    # -- teardown --

    def close(self, error: Optional[str] = None) -> None:
        """Tell the controller this worker is done, then release everything. Idempotent.

        With `error` (a message), the worker tells the controller it failed
        instead; the controller handles that as the worker's death (see
        `Controller.handle_worker_death`). Leaving a ``with`` block through an
        exception does this. (A script run alone only says it is done: its own
        traceback reports the failure.)
        """
        if self._closed:
            return
        # Before DONE, the goodbye (once: the finalizer is detached): what this worker has
        # not taken goes to others.
        if self._mb is not None and self._mb_leave.detach() is not None:
            self._mb.leave(failed=error is not None)
        try:
            if self._exchange is not None:  # its last push lands before the controller hears
                self._exchange.close(30.0 if self.timeout_s is None else self.timeout_s)
            try:
                self._client.say_done(error if self._own_controller is None else None,
                                      5.0 if self.timeout_s is None
                                      else min(self.timeout_s, 5.0))
            except PlatoonError as exc:
                log.warning("worker %d could not tell the controller it is done: %s",
                            self.worker_id, exc)
        finally:
            self._closed = True
            self._local = None
            self._res.farewell = None
            self._coll_finalizer()
            if self._stop_signal is not None:
                self._stop_finalizer()
            self._finalizer()
            if self._own_controller is not None:
                self._own_finalizer()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, exc_type, exc, tb) -> Optional[bool]:
        if exc_type is SystemExit and exc.code in (None, 0):  # sys.exit(0): a success
            self.close()
            return None
        if exc_type is None or issubclass(exc_type, (ControllerGone, StopRequested)):
            self.close()
            if exc_type is not None:  # a requested stop ends the block quietly
                return True if issubclass(exc_type, StopRequested) else None
            return None
        self.close(error="%s: %s" % (exc_type.__name__, exc))
        return None


def _json_number(value: Any) -> Any:
    """A metric as JSON: tensors and numpy scalars as Python numbers; strings and numbers
    as they are."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    item = getattr(value, "item", None)  # a one-element tensor or a numpy scalar
    if item is not None:
        return item()
    raise TypeError("a final metric must be a number or a string, got %r" % (value,))


class _OwnController:
    """The controller of a script run by itself (no port, no launcher): a one-worker job
    served by a thread of this process, closed with the worker."""

    def __init__(self, host: str):
        from .controller import Controller  # only a script run alone needs it here

        class _Alone(Controller):
            def handle_control(self, req, worker_id, req_info):
                raise PlatoonError("request %r: a script run by itself has a controller that "
                                   "handles only platoon's own requests; run it under "
                                   "platoon-launcher with your controller" % (req,))

        self.controller = ctl = _Alone(control_port=0, num_workers=1, host=host)
        self.address = cast(str, ctl.control_address)
        self._thread = threading.Thread(target=self._serve, name="platoon-own-controller",
                                        daemon=True)
        self._thread.start()
        # SIGTERM (a scheduler's time limit) would kill the script before its segments
        # are unlinked: this process owns them.
        self._restore_sigterm = unlink_segments_on_sigterm(ctl.job_id)
        _say_alone(ctl.job_id)

    def _serve(self) -> None:
        try:
            self.controller.serve()
        except Exception:  # noqa: BLE001 - logged: the worker's requests then fail
            log.exception("the controller of this one-worker job failed")

    def close(self) -> None:
        """Stop serving (it ends by itself once the worker said it is done), then close."""
        self._restore_sigterm()
        self.controller.close()
        self._thread.join(5.0)


_told_alone: List[str] = []


def _say_alone(job_id: str) -> None:
    """Say once per process that a script runs as a one-worker job."""
    if not _told_alone:
        _told_alone.append(job_id)
        sys.stderr.write("platoon: no controller port and not under platoon-launcher: running "
                         "as a one-worker job (job %s), with a controller in this process\n"
                         % job_id)
        sys.stderr.flush()


class HeldLock:
    """The centre's lock, taken by `Worker.lock`; leaving a ``with`` block releases it."""

    def __init__(self, release):
        self._release = release

    def __enter__(self) -> "HeldLock":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._release()
