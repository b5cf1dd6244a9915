"""One node of a fixed-world job: run the controller as this MPI rank, start and watch its
workers (the node layer's `platoon.node.runner`), and abort the whole job on any failure."""

import argparse
import logging
import os
import secrets
import shlex
import sys
from typing import Mapping, Optional, Sequence, Union

from .._os.environment import JobEnvironment, without_job_variables, worker_environment
from .._os.nodesettings import NodeSettings, flag_message
from .._os.process import stop
from ..node import reaper
from ..node.runner import (  # noqa: F401 (load_controller_class: platoon.mpi's name too)
    WORKER_STOP_TIMEOUT_S,
    Workers,
    load_controller_class,
    parse_node_arguments,
    say,
    serve_then_finish,
)
from ..node.tie import CentreTie
from ._comm import abort, import_mpi
from .link import NodeLink

log = logging.getLogger(__name__)


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
        say("platoon.mpi: node %d of %d, controller pid %d, job %s%s"
             % (rank, size, os.getpid(), job_id, shared))

        def fail(message):
            say("platoon.mpi: node %d: %s; aborting the job" % (rank, message))
            abort(world, 1)

        workers = Workers(worker_argv, num_workers, host, read_fd, reaper_fd, fail,
                          ready_timeout_s, env, host_workers, "node-%d" % rank)
        serve_then_finish(workers, controller, controller_args, link, host, serve_timeout,
                          finish_timeout_s)
        link.close()
        summary = link.tie_summary()
        if summary is not None:  # on the terminal, by hand too (the log says it at INFO only)
            say("platoon.mpi: node %d: %s" % (rank, summary))
        final = link.final_result
        if final and isinstance(final.get("metrics"), dict):
            say("platoon.mpi: final result (%s, evaluated once by node %d's worker %s): %s"
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
