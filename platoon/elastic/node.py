"""One node of an elastic job: its controller and workers, run by the node layer's runner
(`platoon.node.runner`) as ``python -m platoon.mpi`` runs them, with the node centres tied
through each quorum's gloo group (`ElasticTie`)::

    python -m platoon.elastic.node --join LIGHTHOUSE_HOST:PORT --name NAME \\
        --secret-file SECRET --workers 2 --tie-every-s 3 --tie-compress int8 -- train.py

A node that dies is out of the next quorum; the others go on. A node started mid-run takes
the anchor and outer momentum from a live member at its first round.
"""

import argparse
import functools
import logging
import os
import secrets
import shlex
import sys
import threading
import time
from typing import Optional, Sequence, Tuple

from .._os.environment import JobEnvironment, worker_environment
from .._os.nodesettings import (
    EXIT_REFUSED,
    OUTER_RULES,
    TIE_CODECS,
    NodeSettings,
    elastic_tie,
    flag_message,
)
from .._os.process import stop
from ..errors import NodeRefused, PlatoonError
from ..node import reaper
from ..node.runner import (
    WORKER_STOP_TIMEOUT_S,
    Workers,
    parse_node_arguments,
    say,
    serve_then_finish,
)
from ..node.tie import CentreTie
from .tie import FINAL_TIMEOUT_S

log = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"  # where a node's controller serves its workers
TIE_TIMEOUT_S = 30.0  # a round's collectives wait at most this long for a silent member


def process_start_time() -> float:
    """When this process started (time.time() seconds; now, where /proc cannot say)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


class _StoreInBackground:
    """`make(host)` (the node's StoreServer) run in a thread from construction; `get()` waits
    for it (raising what it raised); closed with the node (a context manager)."""

    def __init__(self, make, host: str):
        self._store = None
        self._error: Optional[BaseException] = None

        def run():
            try:
                self._store = make(host)
            except BaseException as exc:  # raised again by get()
                self._error = exc

        self._thread = threading.Thread(target=run, name="platoon-store", daemon=True)
        self._thread.start()

    def get(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._store

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._thread.join()
        if self._store is not None:
            self._store.close()


def run_elastic_node(worker_argv: Sequence[str], num_workers: int, *, join: str, name: str,
                     tie: CentreTie, tie_timeout_s: float = TIE_TIMEOUT_S,
                     secret_file: Optional[str] = None, host: str = NodeSettings.host,
                     controller=None, controller_args: Sequence[str] = (),
                     ready_timeout_s: float = NodeSettings.ready_timeout_s,
                     finish_timeout_s: float = NodeSettings.finish_timeout_s,
                     heartbeat_interval_s: float = 0.1,
                     final_timeout_s: float = FINAL_TIMEOUT_S,
                     slot: Optional[Tuple[int, int]] = None) -> int:
    """Run node `name` of the elastic job whose lighthouse is at `join`; return its exit code.
    The workers get PLATOON_ELASTIC_NODE=name; a worker failing ends this node only. Once its
    workers are done, the node waits for the final round as long as its group makes rounds;
    after `final_timeout_s` without one it keeps its own centre and ends. `slot` (I, N): the
    node's place among N node slots, by which its workers' data is split (`ElasticLink`)."""
    from . import LighthouseClient, load_secret
    from .link import ElasticLink
    from .store import StoreServer
    started_at = process_start_time()
    secret = load_secret(secret_file)
    job_id = "%s-%s" % (JobEnvironment.read("job_id").job_id or secrets.token_hex(6), name)
    reaper_fd = reaper.start(job_id)
    read_fd, write_fd = os.pipe()
    # the workers are no MPI or torchrun ranks (one node per host under srun or mpiexec)
    env = worker_environment(os.environ, ("ready_fd", "mpi_node", "checkpoint_path",
                                          "status_file"))
    env.update(JobEnvironment(job_id=job_id, num_workers=num_workers,
                              elastic_node=name).to_env())
    # mpi_node=1: a node runner's controller (a --controller script's too) takes the node link
    # its runner offers (`platoon._controller.handoff`): here the ElasticLink
    os.environ.update(JobEnvironment(mpi_node=1, job_id=job_id, control_port=0,
                                     num_workers=num_workers, ready_fd=write_fd).to_env())
    workers = None
    link = None

    def fail(message):
        say("platoon.elastic: node %s: %s; this node ends (the others go on)" % (name, message))
        if workers is not None:
            stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
        thread = None if link is None else link.tie_thread
        os._exit(EXIT_REFUSED if thread is not None
                 and isinstance(thread.final_error, NodeRefused) else 1)

    # the data plane's store (the job's nodes only: it holds the secret), made while the
    # controller and its workers start; the tie needs it once the centre exists
    with _StoreInBackground(functools.partial(StoreServer, secret=secret), host) as store:
        def connect():
            address = store.get().address
            say("platoon.elastic: node %s: data plane at %s" % (name, address))
            return LighthouseClient(join, name, address, secret=secret,
                                    heartbeat_interval_s=heartbeat_interval_s)

        link = ElasticLink(num_workers, connect, name, tie, tie_timeout_s, fail, started_at,
                           final_timeout_s, slot)
        say("platoon.elastic: node %s, controller pid %d, job %s, lighthouse %s"
            % (name, os.getpid(), job_id, join))
        try:
            # the controller and its workers talk on this machine; the data plane is
            # reached at `host` (where its store listens: see StoreServer)
            workers = Workers(worker_argv, num_workers, LOCAL_HOST, read_fd, reaper_fd, fail,
                              ready_timeout_s, env, num_workers, "node-%s" % name)
            serve_then_finish(workers, controller, controller_args, link, LOCAL_HOST, None,
                              finish_timeout_s)
            link.close()
        except BaseException as exc:
            say("platoon.elastic: node %s failed: %s: %s" % (name, type(exc).__name__, exc))
            if workers is not None:
                stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
            raise
        thread = link.tie_thread
        if thread is not None:
            say("platoon.elastic: node %s: %s" % (name, thread.summary()))
            if thread.first_contribution_s is not None:
                say("platoon.elastic: node %s: first contributing round %.2f s after its start"
                     % (name, thread.first_contribution_s))
        final = link.final_result
        if final and isinstance(final.get("metrics"), dict):
            say("platoon.elastic: final result (the agreed centre, evaluated once by node %s): "
                 "%s" % (name, ", ".join("%s %s" % item for item in final["metrics"].items())))
    return 0


def read_arguments(argv: Optional[Sequence[str]] = None):
    """(the parsed options, the node's tie, the worker command) of
    ``python -m platoon.elastic.node``'s command line; exits with status 2 (argparse's usage
    error) naming a bad option."""
    parser = argparse.ArgumentParser(
        prog="python -m platoon.elastic.node",
        description="One node of an elastic platoon job (nodes that come and go).")
    parser.add_argument("--join", required=True, metavar="HOST:PORT",
                        help="the lighthouse (python -m platoon.elastic.lighthouse)")
    parser.add_argument("--name", required=True,
                        help="this node's stable name: its slot (a restarted node keeps it)")
    parser.add_argument("--workers", type=int, default=1, help="workers on this node")
    parser.add_argument("--slot", type=int, default=None, metavar="I",
                        help="this node's place among --slots N node slots (0 <= I < N; "
                             "platoon-launcher gives each host its own): its workers' "
                             "global_rank and global_size count every slot's workers, and "
                             "platoon.shard gives each slot its own part of the data")
    parser.add_argument("--slots", type=int, default=None, metavar="N",
                        help="how many node slots the job has (with --slot)")
    parser.add_argument("--secret-file", default=None,
                        help="the job's secret (default: $PLATOON_ELASTIC_SECRET_FILE)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address at which the other nodes reach this node's data "
                             "plane: its store listens there and gloo binds it (default "
                             "127.0.0.1, which other machines cannot reach: give an address "
                             "they can; the store and gloo accept whoever reaches them: run "
                             "the data plane on a trusted network or behind a firewall; the "
                             "controller serves its workers on 127.0.0.1)")
    parser.add_argument("--controller", default=None,
                        help="controller script file.py, or module:Class or file.py:Class")
    parser.add_argument("--controller-args", default="",
                        help="arguments of a controller script (one shell-quoted string)")
    default = elastic_tie()  # (platoon-launcher --elastic writes what differs from it)
    parser.add_argument("--tie-every-s", type=float, default=default.every_s,
                        help="an outer round every so many seconds (default %s)"
                             % default.every_s)
    parser.add_argument("--tie-outer", choices=OUTER_RULES, default=default.outer,
                        help="what a round does: diloco (an outer Nesterov step on the nodes' "
                             "mean move; default) or easgd (each centre moves toward the "
                             "nodes' mean by --tie-beta)")
    parser.add_argument("--tie-beta", type=float, default=default.beta,
                        help="easgd: how far each centre moves toward the mean at a round, "
                             "(0, 1] (default %g)" % default.beta)
    parser.add_argument("--tie-compress", choices=TIE_CODECS, default=default.compress,
                        help="how the moves travel: float32, int8 or int4 (default %s)"
                             % default.compress)
    parser.add_argument("--tie-outer-lr", type=float, default=default.outer_lr,
                        help="the outer learning rate (default %g)" % default.outer_lr)
    parser.add_argument("--tie-outer-momentum", type=float, default=default.outer_momentum,
                        help="the outer Nesterov momentum (default %g)"
                             % default.outer_momentum)
    parser.add_argument("--tie-timeout-s", type=float, default=TIE_TIMEOUT_S,
                        help="a round's collectives wait at most this long for a member that "
                             "stops answering (default 30; more than --tie-every-s)")
    parser.add_argument("--final-timeout-s", type=float, default=FINAL_TIMEOUT_S,
                        help="a node whose workers are done waits for the final round as long "
                             "as its quorum makes rounds; after this long without one (its "
                             "peers gone, too few nodes, the lighthouse gone) it keeps its own "
                             "centre and ends (default %g; more than --tie-timeout-s)"
                             % FINAL_TIMEOUT_S)
    parser.add_argument("--ready-timeout-s", type=float, default=NodeSettings.ready_timeout_s)
    parser.add_argument("--finish-timeout-s", type=float,
                        default=NodeSettings.finish_timeout_s)
    parser.add_argument("worker", nargs=argparse.REMAINDER,
                        help="-- then the worker command (python is sys.executable for a .py)")
    args, command = parse_node_arguments(parser, argv)
    try:
        tie = elastic_tie(every_s=args.tie_every_s, compress=args.tie_compress,
                          outer=args.tie_outer, beta=args.tie_beta, outer_lr=args.tie_outer_lr,
                          outer_momentum=args.tie_outer_momentum)
    except ValueError as exc:
        parser.error(flag_message(exc))
    if (args.slot is None) != (args.slots is None):
        parser.error("--slot and --slots go together")
    if args.slot is not None and not 0 <= args.slot < args.slots:
        parser.error("--slot must be in [0, --slots), got %d of %d" % (args.slot, args.slots))
    if not args.tie_timeout_s > args.tie_every_s:
        parser.error("--tie-timeout-s must be more than --tie-every-s")
    if not args.final_timeout_s > args.tie_timeout_s:
        parser.error("--final-timeout-s must be more than --tie-timeout-s")
    return args, tie, command


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m platoon.elastic.node``: parse the command line and `run_elastic_node`."""
    args, tie, command = read_arguments(argv)
    try:
        return run_elastic_node(command, args.workers, join=args.join, name=args.name, tie=tie,
                                tie_timeout_s=args.tie_timeout_s, secret_file=args.secret_file,
                                host=args.host, controller=args.controller,
                                controller_args=shlex.split(args.controller_args),
                                ready_timeout_s=args.ready_timeout_s,
                                finish_timeout_s=args.finish_timeout_s,
                                final_timeout_s=args.final_timeout_s,
                                slot=None if args.slot is None else (args.slot, args.slots))
    except PlatoonError as exc:
        print("platoon.elastic.node: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
