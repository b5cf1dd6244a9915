"""One node of a multi-node job: run the controller as this MPI rank, start and watch its
workers, and abort the whole job on any failure."""

import argparse
import importlib
import importlib.util
import logging
import os
import runpy
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from typing import Mapping, Optional, Sequence, Union

from .._os.argv import join_option_values
from .._os.environment import (
    JobEnvironment,
    device_variables,
    without_job_variables,
    worker_environment,
)
from .._os.nodesettings import NodeSettings, flag_message
from .._os.process import die_with_parent, read_announcement, stop
from ..device import find_gpus, in_turn
from ..errors import PlatoonError
from ._comm import abort, import_mpi
from .handoff import offered
from .link import NodeLink
from .tie import CentreTie

log = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT_S = 3.0  # between SIGTERM and SIGKILL when stopping workers


def node_devices(count):
    """Each of this node's `count` workers' device, as the launcher plans them with -n: the
    node's visible GPUs in turn (several workers may share one), else "cpu"."""
    return in_turn(count, find_gpus()[0])


def _say(line):
    """`line` on stderr in one write (the nodes share mpiexec's terminal: print writes the
    newline apart, and another node's line could join this one)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _kill_with_parent():
    """Child side of Popen: SIGKILL this process when the thread that started it dies."""
    die_with_parent(signal.SIGKILL)


def load_controller_class(spec: Optional[str]) -> type:
    """``module:Class`` or ``path/file.py:Class`` to the class; raises PlatoonError."""
    if not spec:
        from ..controller import Controller
        return Controller
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise PlatoonError("controller %r: give it as module:Class or path/file.py:Class" % spec)
    try:
        if target.endswith(".py"):
            mod_spec = importlib.util.spec_from_file_location("platoon_user_controller", target)
            if mod_spec is None or mod_spec.loader is None:
                raise ImportError("not a Python file")
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        return getattr(module, name)
    except (ImportError, OSError, AttributeError) as exc:
        raise PlatoonError("cannot load controller %r: %s" % (spec, exc)) from None


def run_controller(controller, controller_args, link, host, serve_timeout):
    """Run this node's controller with `link` as its node link, until it has served: a
    controller script (``file.py``, run as ``__main__`` with `controller_args`; its Controller
    takes the link, `handoff.offered`) or a class (or ``module:Class`` / ``file.py:Class``,
    default platoon.Controller), created and served."""
    if isinstance(controller, str) and controller.endswith(".py"):
        sys.argv = [controller] + list(controller_args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(controller)))
        with offered(link):  # the script's Controller takes it (handoff.node_link_for)
            runpy.run_path(controller, run_name="__main__")
    else:
        cls = controller if isinstance(controller, type) else load_controller_class(controller)
        with cls(host=host, node_link=link) as ctl:
            ctl.serve(timeout_s=serve_timeout)


class _Workers:
    """Starts this node's workers once the controller announces its ports, and aborts the
    whole job as soon as one fails. Runs in its own thread, which lives as long as the
    workers (they die with it: PR_SET_PDEATHSIG)."""

    def __init__(self, argv, count, host, ready_fd, reaper_fd, fail, ready_timeout_s, env,
                 host_workers):
        self.argv, self.count, self.host = argv, count, host
        self.host_workers = host_workers
        self.ready_fd, self.reaper_fd = ready_fd, reaper_fd
        self._fail = fail  # fail(message): the node's end (platoon.mpi: the whole job's)
        self.ready_timeout_s, self.env = ready_timeout_s, env
        self.procs = []
        self.started = threading.Event()
        self.finished = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, name="platoon-workers", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            try:
                ready = read_announcement(self.ready_fd, self.ready_timeout_s)
            finally:
                os.close(self.ready_fd)
            if ready is None:
                return self._fail("the controller did not start serving within %.3g s (does "
                                  "the controller script call serve()?)" % self.ready_timeout_s)
            from ..launch import reaper
            devices = node_devices(self.count)
            for index, device in enumerate(devices):
                env = dict(self.env)
                env.update(JobEnvironment(control_port=ready["control_port"],
                                          data_port=ready.get("data_port") or None,
                                          worker_index=index, host=self.host,
                                          device=device).to_env())
                env.update(device_variables(device, devices, os.cpu_count() or 1, self.env,
                                            host_workers=self.host_workers))
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


def serve_then_finish(workers: "_Workers", controller, controller_args, link, host: str,
                      serve_timeout: Optional[float], finish_timeout_s: float) -> None:
    """A node runner's middle (platoon.mpi's and an elastic node's): run its controller with
    `link` until the job ends, then stop `workers` still running `finish_timeout_s` later;
    PlatoonError when the controller never served them or one exited non-zero."""
    run_controller(controller, controller_args, link, host, serve_timeout)
    if not workers.started.is_set():
        raise PlatoonError("the controller returned before serving its workers")
    stop(workers.procs, WORKER_STOP_TIMEOUT_S, grace_s=finish_timeout_s, group=False)
    failed = [p for p in workers.procs if p.returncode != 0]
    if failed:
        raise PlatoonError("worker pid %d exited with code %d"
                           % (failed[0].pid, failed[0].returncode))


def workers_on_this_host(comm, num_workers):
    """The workers of every rank of `comm` on this machine (MPI's shared-memory split: the
    ranks of a node that share it), among whom its cores are divided. Collective."""
    MPI = import_mpi()
    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return host.allreduce(int(num_workers)), host.Get_size()
    finally:
        host.Free()


def run_node(worker_argv: Sequence[str], num_workers: int, *,
             controller: Union[str, type, None] = None, controller_args: Sequence[str] = (),
             tie: Optional[CentreTie] = None, host: str = NodeSettings.host,
             serve_timeout: Optional[float] = None,
             ready_timeout_s: float = NodeSettings.ready_timeout_s,
             worker_env: Optional[Mapping[str, str]] = None,
             finish_timeout_s: float = NodeSettings.finish_timeout_s) -> int:
    """Run this MPI rank's part of a job; return its exit code (0: every worker succeeded).

    Collective: call it on every rank of COMM_WORLD. `controller` is a
    controller script (``file.py``, run as ``__main__`` with `controller_args`,
    as platoon-launcher runs EXPERIMENT_controller.py) or a class (or
    ``module:Class`` / ``file.py:Class``, default platoon.Controller) that is
    created and served. Either way the Controller finds its settings in the
    ``PLATOON_*`` environment (job id: one random id per job plus ``-nRANK``;
    a free port; `num_workers`) and its NodeLink through PLATOON_MPI_NODE.
    Once it serves, `num_workers` processes run `worker_argv` with the
    launcher's PLATOON_* variables (plus `worker_env`) and its thread caps, without
    MPI's and torchrun's rank variables (PMI_*, OMPI_*, RANK...: a worker is no MPI rank), the
    host's cores divided among the workers of every rank on this host. With tied
    centres, the job's final evaluation (`Worker.final_evaluation`) is of the agreed
    centre after the final round, once, on node 0, which prints it; node 0 alone writes
    PLATOON_STATUS_FILE and PLATOON_CHECKPOINT_PATH (its final centre: the agreed one),
    when they are set. Any failure (a worker
    exiting non-zero, the controller raising, no controller within
    `ready_timeout_s`) aborts the whole job; the exception is re-raised.
    Workers still running `finish_timeout_s` seconds after the controller
    finished are stopped (SIGTERM, then SIGKILL).
    """
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    job = world.bcast(JobEnvironment.read("job_id").job_id or secrets.token_hex(6), root=0)
    job_id = "%s-n%d" % (job, rank)
    from ..launch import reaper
    reaper_fd = reaper.start(job_id)
    read_fd, write_fd = os.pipe()
    # The job's status file and final centre (the launcher's --hosts gives them, or a user by
    # hand): node 0's to write, once its centre is the agreed one; no worker's.
    node0_files = ("status_file", "checkpoint_path")
    # The workers are not MPI ranks: MPI's PMI_* variables stay with this rank's process.
    env = worker_environment(os.environ, ("ready_fd", "mpi_node") + node0_files,
                                  worker_env)
    if rank != 0:
        for name in set(os.environ) - set(without_job_variables(os.environ, *node0_files)):
            del os.environ[name]
    env.update(JobEnvironment(job_id=job_id, num_workers=num_workers).to_env())
    os.environ.update(JobEnvironment(mpi_node=1, job_id=job_id, control_port=0,
                                     num_workers=num_workers, ready_fd=write_fd).to_env())
    workers = None
    try:
        link = NodeLink(num_workers, world, tie)
        host_workers, host_nodes = workers_on_this_host(world, num_workers)
        shared = "" if host_nodes == 1 else ", %d nodes share this host: its %d cores are " \
            "divided among their %d workers" % (host_nodes, os.cpu_count() or 1, host_workers)
        _say("platoon.mpi: node %d of %d, controller pid %d, job %s%s"
             % (rank, size, os.getpid(), job_id, shared))

        def fail(message):
            _say("platoon.mpi: node %d: %s; aborting the job" % (rank, message))
            abort(world, 1)

        workers = _Workers(worker_argv, num_workers, host, read_fd, reaper_fd, fail,
                           ready_timeout_s, env, host_workers)
        serve_then_finish(workers, controller, controller_args, link, host, serve_timeout,
                          finish_timeout_s)
        link.close()
        summary = link.tie_summary()
        if summary is not None:  # on the terminal, by hand too (the log says it at INFO only)
            _say("platoon.mpi: node %d: %s" % (rank, summary))
        final = link.final_result
        if final and isinstance(final.get("metrics"), dict):
            _say("platoon.mpi: final result (%s, evaluated once by node %d's worker %s): %s"
                 % ("the agreed centre, after the final tie round" if tie is not None
                    else "node %d's centre: the node centres are not tied" % rank, rank,
                    final.get("worker"), ", ".join("%s %s" % item
                                                   for item in final["metrics"].items())))
        return 0
    except BaseException as exc:
        print("platoon.mpi: node %d failed: %s: %s; aborting the job"
              % (rank, type(exc).__name__, exc), file=sys.stderr, flush=True)
        if workers is not None:
            stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
        abort(world, 1)
        raise


def parse_node_arguments(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]):
    """(args, the worker command) of a node's command line (``... -- COMMAND``; a .py runs
    under this Python), with logging set to the job's level: the MPI node's and the elastic
    node's alike. An empty command is a parser error."""
    args = parser.parse_args(join_option_values(sys.argv[1:] if argv is None else argv,
                                                ["--controller-args"]))
    command = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not command:
        parser.error("give the worker command after --")
    if command[0].endswith(".py"):
        command = [sys.executable] + command
    logging.basicConfig(level=(JobEnvironment.read("log_level").log_level or "WARNING").upper(),
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    return args, command


def make_parser() -> argparse.ArgumentParser:
    """``python -m platoon.mpi``'s command line: `NodeSettings`' options, then -- COMMAND."""
    parser = argparse.ArgumentParser(
        prog="python -m platoon.mpi",
        description="One node of a multi-node platoon job; run under mpiexec, one rank per node.")
    NodeSettings.add_arguments(parser)
    parser.add_argument("worker", nargs=argparse.REMAINDER,
                        help="-- then the worker command (python is sys.executable for a .py)")
    return parser


def read_node_settings(argv: Optional[Sequence[str]] = None):
    """(NodeSettings, the worker command) of a node runner's command line; exits with status 2
    (argparse's usage error) naming a bad option."""
    parser = make_parser()
    args, command = parse_node_arguments(parser, argv)
    del args.worker
    try:
        return NodeSettings.from_arguments(args), command
    except ValueError as exc:
        parser.error(flag_message(exc))
        raise  # (parser.error exits)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m platoon.mpi``: parse the command line and `run_node`; returns its code."""
    node, command = read_node_settings(argv)
    return run_node(command, node.workers, controller=node.controller,
                    controller_args=shlex.split(node.controller_args), tie=node.tie,
                    host=node.host, serve_timeout=node.serve_timeout_s,
                    ready_timeout_s=node.ready_timeout_s,
                    finish_timeout_s=node.finish_timeout_s)
