"""Jobs across nodes: one controller per MPI rank, linked through mpi4py.

Everything that imports mpi4py lives here, and imports it lazily: platoon
works without it on one node. Run one controller per node with::

    mpiexec -n NODES python -m platoon.mpi --workers N [--controller SCRIPT.py | MOD:CLASS]
        [--tie-every-s S] [--tie-every-syncs K] [--tie-beta B] -- WORKER_COMMAND...

Each rank (`run_node`) sets the ``PLATOON_*`` environment and runs the
controller (a script as platoon-launcher runs it, or a class); the Controller
sees PLATOON_MPI_NODE and takes this rank's `NodeLink`. Once it serves, the
rank starts N workers running WORKER_COMMAND. Through the link, all_reduce
and barrier span the job, every worker learns its global rank, and an
optional `CentreTie` keeps the node centres elastically tied (hierarchical
EASGD).

A failure anywhere ends the job: a worker that exits non-zero or a controller
error makes the rank call MPI_Abort; a rank that dies makes ``mpiexec`` kill
the others; a `platoon.reaper` per rank then stops that rank's workers and
unlinks its shared memory.

The controller's MPI calls run in its serve thread (collectives, which block
it only while all of the node's workers wait in that collective anyway) and
in the tie thread, on separate duplicated communicators; this needs
MPI_THREAD_MULTIPLE, which mpi4py requests by default.
"""

import argparse
import importlib
import importlib.util
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .child import die_with_parent
from .environment import JobEnvironment
from .errors import PlatoonError

log = logging.getLogger(__name__)

_MPI_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}
_AGREE_BYTES = 96


_TIE_LOCK_TIMEOUT_S = 60.0  # a worker stopped while holding the centre fails the tie


def _wait(request, timeout_s=None, spin_s=100e-6):
    """Complete a small non-blocking MPI request without spinning a core while a peer is late.

    MPI's blocking calls busy-poll; a controller waiting for a slower node would
    take a core from its own workers. So: poll for `spin_s`, then sleep between
    polls with a backoff capped at 0.5 ms. Used to meet the peers; the data then
    moves with a blocking call, which progresses faster once everyone is there.
    Returns False if the peers did not all arrive within `timeout_s` (None: forever).
    """
    spin_until = time.perf_counter() + spin_s
    while time.perf_counter() < spin_until:
        if request.Test():
            return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = 20e-6
    while not request.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.5e-3)
    return True


def import_mpi():
    """mpi4py's MPI module; raises PlatoonError saying how to install it."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # RuntimeError: mpi4py without an MPI library
        raise PlatoonError("multi-node platoon needs mpi4py and an MPI library: pip install "
                           "mpi4py mpich (in platoon's clone: pip install -e '.[mpi]') - %s"
                           % exc) from None
    return MPI


@dataclass
class CentreTie:
    """Hierarchical EASGD between node centres.

    A tie round comes every `every_s` seconds, or once every node's workers
    have made `every_syncs` syncs since the last round (counted from their
    `Worker.report()` calls, which carry the worker's sync count), whichever
    is set (both: whichever comes first on each node). In a round the
    controllers average their centres over MPI and move each toward the mean:
    ``c += beta * (mean - c)``, with `c` and `mean` taken at the same instant
    so syncs made meanwhile are kept; beta=1 makes the centres equal. Raises
    ValueError for bad values.
    """

    every_s: Optional[float] = 1.0
    beta: float = 0.5
    every_syncs: Optional[int] = None

    def __post_init__(self):
        if self.every_s is None and self.every_syncs is None:
            raise ValueError("CentreTie needs every_s (seconds) or every_syncs (syncs per node)")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError("CentreTie every_s must be > 0 seconds, got %r" % self.every_s)
        if self.every_syncs is not None and (not isinstance(self.every_syncs, int)
                                             or self.every_syncs < 1):
            raise ValueError("CentreTie every_syncs must be an integer >= 1, got %r"
                             % (self.every_syncs,))
        if not 0 < self.beta <= 1:
            raise ValueError("CentreTie beta must be in (0, 1], got %r" % self.beta)


class NodeLink:
    """A controller's link to the other nodes' controllers.

    Parameters:
        num_workers: workers on this node.
        comm: the communicator with one rank per node (default COMM_WORLD).
        tie: a CentreTie, or None for independent node centres.

    A node that does not reach a collective within `collective_timeout_s`
    (PLATOON_MPI_TIMEOUT_S, default 1800) is taken to hang: the job is
    aborted rather than left waiting forever.

    Collective: every rank must create it. As ``controller.node_link`` it is
    used by the controller: `start` when serve() begins, `finish` when it
    ends; `close()` then frees the communicators.
    """

    def __init__(self, num_workers, comm=None, tie=None):
        MPI = self.MPI = import_mpi()
        world = comm if comm is not None else MPI.COMM_WORLD
        if tie is not None and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise PlatoonError("the centre tie needs MPI_THREAD_MULTIPLE but MPI gives level %d; "
                               "use an MPI built with thread support (mpich is)"
                               % MPI.Query_thread())
        self._comm = world.Dup()
        self._tie_comm = world.Dup() if tie is not None else None
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        counts = self._comm.allgather(int(num_workers))
        self.num_workers = int(num_workers)
        self.worker_offset = sum(counts[:self.rank])
        self.global_size = sum(counts)
        self.tie = tie
        self.tie_rounds = 0
        self._stop = threading.Event()
        self._thread = None
        self._finished = False
        self._closed = False
        self.collective_timeout_s = float(os.environ.get("PLATOON_MPI_TIMEOUT_S", "1800"))

    def topology(self, worker_id):
        """What a worker learns at registration, beyond its local id."""
        return {"global_rank": self.worker_offset + worker_id, "global_size": self.global_size,
                "node_rank": self.rank, "num_nodes": self.size}

    def _agree(self, what):
        """Check that every rank is entering the same collective; raise PlatoonError if not."""
        text = repr(what).encode()[:_AGREE_BYTES]
        mine = np.zeros(_AGREE_BYTES, np.uint8)
        mine[:len(text)] = np.frombuffer(text, np.uint8)
        seen = np.empty((self.size, _AGREE_BYTES), np.uint8)
        if not _wait(self._comm.Iallgather(mine, seen), self.collective_timeout_s):
            log.error("node %d: the other nodes did not reach %r within %.0f s (a node "
                      "hangs?)", self.rank, what, self.collective_timeout_s)
            self.abort(1)
        if (seen != mine).any():
            raise PlatoonError("the nodes' workers called different collectives: %s; every worker "
                               "must call the same collectives in the same order" % "; ".join(
                                   "node %d: %s" % (r, bytes(row).rstrip(b"\0").decode())
                                   for r, row in enumerate(seen)))

    def fail_round(self, reason):
        """This node's round failed before its data was ready: enter the agreement anyway, so
        the other nodes fail the same round instead of pairing it with our next one."""
        try:
            self._agree(("failed", reason))
        except PlatoonError:
            pass  # expected: the others entered a real collective

    def all_reduce(self, array, op):
        """Combine this node's reduced `array` with the other nodes' in place; return the
        number of workers it now covers (the divisor of a mean)."""
        self._agree(("all_reduce", array.dtype.str, array.size, op))
        self._comm.Allreduce(self.MPI.IN_PLACE, array.reshape(-1),
                             getattr(self.MPI, _MPI_OPS[op]))
        return self.global_size

    def barrier(self):
        """Wait for every node's controller (each calls it when its workers are all in)."""
        self._agree(("barrier",))

    def abort(self, code=1):
        """End the whole job now: every rank, hence every controller and worker."""
        log.error("node %d aborts the job (exit code %d)", self.rank, code)
        _abort(self._comm, code)

    # -- hierarchical EASGD --

    def start(self, controller):
        """Start the centre tie (if any) for `controller`'s centre."""
        if self.tie is not None and self._thread is None:
            self._thread = threading.Thread(target=self._tie_loop, args=(controller,),
                                            name="platoon-centre-tie", daemon=True)
            self._thread.start()

    def _tie_loop(self, ctl):
        comm, MPI = self._tie_comm, self.MPI
        try:
            while True:
                self._wait_for_round(ctl)
                flags = np.array([ctl.centre_ready, self._stop.is_set()], np.int32)
                _wait(comm.Iallreduce(MPI.IN_PLACE, flags, MPI.MIN))
                if flags[1]:  # every node is done
                    return
                if flags[0]:
                    self._tie_round(ctl)
        except Exception:
            log.exception("the centre tie failed on node %d", self.rank)
            self.abort(1)

    def _wait_for_round(self, ctl):
        """Return when this node is due for a tie round (or is done)."""
        tie, start = self.tie, time.monotonic()
        syncs = ctl.progress["syncs"]
        while not self._stop.is_set():
            left = None if tie.every_s is None else start + tie.every_s - time.monotonic()
            if left is not None and left <= 0:
                return
            if tie.every_syncs is not None:
                if ctl.progress["syncs"] - syncs >= tie.every_syncs:
                    return
                left = 0.01 if left is None else min(left, 0.01)  # reports arrive in serve()
            self._stop.wait(left)

    def _tie_round(self, ctl):
        comm, MPI = self._tie_comm, self.MPI
        centre = ctl.shared_centre
        if self.tie_rounds == 0:
            layouts = comm.allgather(centre.layout)
            if any(lay != centre.layout for lay in layouts):
                raise PlatoonError("the nodes' centres differ in layout: %s" % layouts)
        snaps = ctl.snapshot_centre(timeout=_TIE_LOCK_TIMEOUT_S)  # a stopped holder: error
        means = [s.copy() for s in snaps]
        for m in means:
            comm.Allreduce(MPI.IN_PLACE, m.reshape(-1), MPI.SUM)  # peers are here: blocking
            m /= self.size
        centre.lock.acquire(_TIE_LOCK_TIMEOUT_S)
        try:
            for c, s, m in zip(centre.arrays, snaps, means):
                m -= s
                m *= self.tie.beta
                c += m
        finally:
            centre.lock.release()
        self.tie_rounds += 1
        log.debug("node %d: centre tie round %d", self.rank, self.tie_rounds)

    def finish(self):
        """This node is done: check that every node is (a node still in a collective gets an
        error instead of a hang), then end the centre tie. The controller calls it when
        serve() ends, before its centre goes away. Collective; idempotent."""
        if self._finished:
            return
        self._finished = True
        self._agree(("done",))
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self):
        """`finish`, then free the communicators. Collective; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.finish()
        self._comm.Free()
        if self._tie_comm is not None:
            self._tie_comm.Free()


# -- running one node --------------------------------------------------------

_RUNNER_LINK = None  # the NodeLink that `run_node` made for this process's controller


def node_link_for(controller):
    """The NodeLink of this rank, for a Controller created under `python -m platoon.mpi`
    (which sets PLATOON_MPI_NODE). Raises PlatoonError elsewhere."""
    link = _RUNNER_LINK
    if link is None:
        raise PlatoonError("PLATOON_MPI_NODE is set but this process was not started by "
                           "python -m platoon.mpi (or platoon.mpi.run_node); unset it")
    if controller.num_workers != link.num_workers:
        raise PlatoonError("the controller expects %s workers but platoon.mpi starts %d on this "
                           "node; leave num_workers to the environment (PLATOON_NUM_WORKERS)"
                           % (controller.num_workers, link.num_workers))
    return link


def _kill_with_parent():
    """Child side of Popen: SIGKILL this process when the thread that started it dies."""
    die_with_parent(signal.SIGKILL)


def load_controller_class(spec):
    """``module:Class`` or ``path/file.py:Class`` to the class; raises PlatoonError."""
    from .controller import Controller
    if not spec:
        return Controller
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise PlatoonError("controller %r: give it as module:Class or path/file.py:Class" % spec)
    try:
        if target.endswith(".py"):
            mod_spec = importlib.util.spec_from_file_location("platoon_user_controller", target)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        return getattr(module, name)
    except (ImportError, OSError, AttributeError) as exc:
        raise PlatoonError("cannot load controller %r: %s" % (spec, exc)) from None


class _Workers:
    """Starts this node's workers once the controller announces its ports, and aborts the
    whole job as soon as one fails. Runs in its own thread, which lives as long as the
    workers (they die with it: PR_SET_PDEATHSIG)."""

    def __init__(self, argv, count, host, ready_fd, reaper_fd, world, ready_timeout_s, env):
        self.argv, self.count, self.host = argv, count, host
        self.ready_fd, self.reaper_fd, self.world = ready_fd, reaper_fd, world
        self.ready_timeout_s, self.env = ready_timeout_s, env
        self.procs = []
        self.started = threading.Event()
        self.finished = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, name="platoon-workers", daemon=True)
        self.thread.start()

    def _fail(self, message):
        print("platoon.mpi: node %d: %s; aborting the job" % (self.world.Get_rank(), message),
              file=sys.stderr, flush=True)
        _abort(self.world, 1)

    def _run(self):
        try:
            ready = _read_announcement(self.ready_fd, self.ready_timeout_s)
            if ready is None:
                return self._fail("the controller did not start serving within %.3g s (does "
                                  "the controller script call serve()?)" % self.ready_timeout_s)
            from . import reaper
            for index in range(self.count):
                env = dict(self.env, PLATOON_CONTROL_PORT=str(ready["control_port"]),
                           PLATOON_WORKER_INDEX=str(index), PLATOON_HOST=self.host)
                env.pop("PLATOON_READY_FD", None)
                env.pop("PLATOON_MPI_NODE", None)
                if ready.get("data_port"):
                    env["PLATOON_DATA_PORT"] = str(ready["data_port"])
                proc = subprocess.Popen(self.argv, env=env, preexec_fn=_kill_with_parent)
                reaper.watch(self.reaper_fd, proc.pid)
                self.procs.append(proc)
            self.started.set()
            watchers = [threading.Thread(target=self._watch, args=(p,), daemon=True)
                        for p in self.procs]
            for w in watchers:
                w.start()
            for w in watchers:
                w.join()
        except BaseException as exc:
            self.error = exc
            self._fail("could not start the workers: %s" % exc)
        finally:
            self.finished.set()

    def _watch(self, proc):
        code = proc.wait()
        if code != 0:
            self._fail("worker pid %d exited with code %d" % (proc.pid, code))


def _read_announcement(fd, timeout_s):
    """The controller's JSON line on the ready pipe, or None (timeout, or closed first)."""
    import json
    import select
    deadline, data = time.monotonic() + timeout_s, b""
    try:
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            data += chunk
    finally:
        os.close(fd)
    return json.loads(data.split(b"\n", 1)[0])


def run_node(worker_argv, num_workers, *, controller=None, controller_args=(), tie=None,
             host="127.0.0.1", serve_timeout=None, ready_timeout_s=120.0, worker_env=None):
    """Run this MPI rank's part of a job; return its exit code (0: every worker succeeded).

    Collective: call it on every rank of COMM_WORLD. `controller` is a
    controller script (``file.py``, run as ``__main__`` with `controller_args`,
    as platoon-launcher runs EXPERIMENT_controller.py) or a class (or
    ``module:Class`` / ``file.py:Class``, default platoon.Controller) that is
    created and served. Either way the Controller finds its settings in the
    ``PLATOON_*`` environment (job id: one random id per job plus ``-nRANK``;
    a free port; `num_workers`) and its NodeLink through PLATOON_MPI_NODE.
    Once it serves, `num_workers` processes run `worker_argv` with the
    launcher's PLATOON_* variables (plus `worker_env`). Any failure (a worker
    exiting non-zero, the controller raising, no controller within
    `ready_timeout_s`) aborts the whole job.
    """
    global _RUNNER_LINK
    import runpy
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    job = world.bcast(JobEnvironment.read().job_id or secrets.token_hex(6), root=0)
    job_id = "%s-n%d" % (job, rank)
    from . import reaper
    reaper_fd = reaper.start(job_id)
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, **(worker_env or {}))
    env.update(PLATOON_JOB_ID=job_id, PLATOON_NUM_WORKERS=str(num_workers))
    os.environ.update(PLATOON_MPI_NODE="1", PLATOON_JOB_ID=job_id, PLATOON_CONTROL_PORT="0",
                      PLATOON_NUM_WORKERS=str(num_workers), PLATOON_READY_FD=str(write_fd))
    workers = None
    try:
        _RUNNER_LINK = link = NodeLink(num_workers, world, tie)
        print("platoon.mpi: node %d of %d, controller pid %d, job %s"
              % (rank, size, os.getpid(), job_id), file=sys.stderr, flush=True)
        workers = _Workers(worker_argv, num_workers, host, read_fd, reaper_fd, world,
                           ready_timeout_s, env)
        if isinstance(controller, str) and controller.endswith(".py"):
            sys.argv = [controller] + list(controller_args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(controller)))
            runpy.run_path(controller, run_name="__main__")
        else:
            cls = controller if isinstance(controller, type) else \
                load_controller_class(controller)
            with cls(host=host) as ctl:
                ctl.serve(timeout=serve_timeout)
        if not workers.started.is_set():
            raise PlatoonError("the controller returned before serving its workers")
        _stop(workers.procs, grace_s=30.0)  # they said they are done: let them exit
        failed = [p for p in workers.procs if p.returncode != 0]
        if failed:
            raise PlatoonError("worker pid %d exited with code %d"
                               % (failed[0].pid, failed[0].returncode))
        link.close()
        return 0
    except BaseException as exc:
        print("platoon.mpi: node %d failed: %s: %s; aborting the job"
              % (rank, type(exc).__name__, exc), file=sys.stderr, flush=True)
        if workers is not None:
            _stop(workers.procs)
        _abort(world, 1)
        raise
    finally:
        _RUNNER_LINK = None


# How long a rank's last words get to reach mpiexec before MPI_Abort tears the job down
# (MPICH drops output still in transit: the reason for an abort went missing without it).
ABORT_GRACE_S = 0.5


def _abort(comm, code):
    """MPI_Abort on `comm`, once this rank's stderr and stdout have had time to reach mpiexec."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)


def _stop(procs, grace_s=0.0, term_s=3.0):
    """Wait up to `grace_s` for `procs` to exit, SIGTERM the rest, SIGKILL them after `term_s`."""
    for wait_s, signal_them in ((grace_s, "terminate"), (term_s, "kill")):
        deadline = time.monotonic() + wait_s
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                getattr(proc, signal_them)()
    for proc in procs:
        proc.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m platoon.mpi",
        description="One node of a multi-node platoon job; run under mpiexec, one rank per node.")
    parser.add_argument("--workers", type=int, required=True, help="workers on each node")
    parser.add_argument("--controller", default=None,
                        help="controller script file.py (run as __main__, like "
                             "EXPERIMENT_controller.py), or module:Class or file.py:Class "
                             "(created and served); default platoon.Controller")
    parser.add_argument("--controller-args", default="",
                        help="arguments of a controller script (one shell-quoted string)")
    parser.add_argument("--host", default="127.0.0.1", help="interface the controller binds")
    parser.add_argument("--tie-every-s", type=float, default=None,
                        help="tie the node centres every so many seconds (hierarchical EASGD)")
    parser.add_argument("--tie-every-syncs", type=int, default=None,
                        help="tie the node centres once every node's workers have reported so "
                             "many syncs (Worker.report)")
    parser.add_argument("--tie-beta", type=float, default=0.5,
                        help="how far each centre moves toward the mean at a tie (0, 1]")
    parser.add_argument("--serve-timeout-s", type=float, default=None)
    parser.add_argument("worker", nargs=argparse.REMAINDER,
                        help="-- then the worker command (python is sys.executable for a .py)")
    args = parser.parse_args(argv)
    command = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not command:
        parser.error("give the worker command after --")
    if command[0].endswith(".py"):
        command = [sys.executable] + command
    logging.basicConfig(level=os.environ.get("PLATOON_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    tie = None
    if args.tie_every_s is not None or args.tie_every_syncs is not None:
        tie = CentreTie(args.tie_every_s, args.tie_beta, args.tie_every_syncs)
    import shlex
    return run_node(command, args.workers, controller=args.controller,
                    controller_args=shlex.split(args.controller_args), tie=tie, host=args.host,
                    serve_timeout=args.serve_timeout_s)


if __name__ == "__main__":
    # Run the copy that `import platoon.mpi` gives, which the Controller consults.
    from platoon.mpi import main as _main
    sys.exit(_main())
