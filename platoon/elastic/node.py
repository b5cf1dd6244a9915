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
from typing import TYPE_CHECKING, Callable, List, NoReturn, Optional, Sequence, Tuple

from .._os.elasticsettings import ElasticNodeSettings
from .._os.environment import JobEnvironment, worker_environment
from .._os.nodesettings import EXIT_REFUSED
from .._os.process import stop
from .._os.statusfile import final_result_text
from ..errors import NodeRefused, PlatoonError
from ..node import reaper
from ..node.prefork import PreforkedWorker, prefork
from ..node.runner import (
    WORKER_STOP_TIMEOUT_S,
    Workers,
    parse_node_arguments,
    say,
    serve_then_finish,
)
from .nodestatus import NodeStatus

if TYPE_CHECKING:
    from .client import LighthouseClient
    from .link import ElasticLink
    from .store import StoreServer

log = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"  # where a node's controller serves its workers


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


class _DataPlaneInBackground:
    """The node's data plane made ready in threads while its controller and workers start:
    from construction, `make(host)` (its StoreServer); once `import_gloo_after` is told its
    workers started, torch's gloo imported (seconds, which its first group would otherwise
    wait for, after its quorum, the others waiting in its rendezvous; not before: the import
    would slow the controller's start, sharing its interpreter). `get()` waits for both and
    returns the store (raising what `make` raised; torch missing is said as a group is built).
    Closed with the node (a context manager)."""

    def __init__(self, make: Callable[[str], "StoreServer"], host: str) -> None:
        self._store: Optional[StoreServer] = None
        self._error: Optional[BaseException] = None
        self._gloo: Optional[threading.Thread] = None
        self._begun = threading.Event()  # the import of gloo began
        self._closed = threading.Event()

        def run() -> None:
            try:
                self._store = make(host)
            except BaseException as exc:  # raised again by get()
                self._error = exc

        self._thread = threading.Thread(target=run, name="platoon-store", daemon=True)
        self._thread.start()

    def import_gloo_after(self, started: threading.Event, given_up: threading.Event) -> None:
        """Import torch's gloo once `started` is set (unless `given_up` is first)."""
        def run() -> None:
            while not started.wait(0.05):
                if given_up.is_set() or self._closed.is_set():
                    return
            self._begun.set()
            from .dataplane import load_torch
            try:
                load_torch()
            except PlatoonError as exc:  # said again as a group is built
                log.debug("the data plane: %s", exc)

        self._gloo = threading.Thread(target=run, name="platoon-gloo-import", daemon=True)
        self._gloo.start()

    def get(self) -> "StoreServer":
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._gloo is not None and self._begun.is_set():
            self._gloo.join()
        assert self._store is not None  # (`make` returned it, or raised)
        return self._store

    def __enter__(self) -> "_DataPlaneInBackground":
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._thread.join()
        if self._store is not None:
            self._store.close()


def run_elastic_node(worker_argv: Sequence[str], settings: ElasticNodeSettings, *,
                     heartbeat_interval_s: float = 0.1,
                     preforked: Sequence["PreforkedWorker"] = ()) -> int:
    """Run the elastic node `settings` describe (its lighthouse, name, node, slot, bounds and
    status file: `ElasticNodeSettings`), its workers running `worker_argv`; return its exit
    code. The workers get PLATOON_ELASTIC_NODE=name; a worker failing ends this node only.
    Once its workers are done, the node waits for the final round as long as its group makes
    rounds; after `settings.final_timeout_s` without one it keeps its own centre and ends.
    Its slot (I, N): its place among N node slots, by which its workers' data is split
    (`ElasticLink`). Its workers forked ahead (`preforked`: `platoon.node.prefork`), if any,
    are started instead of new processes."""
    from .secret import load_secret
    from .store import StoreServer
    node, name = settings.node, settings.name
    num_workers = node.workers
    started_at = process_start_time()
    secret = load_secret(settings.secret_file)
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
    workers: Optional[Workers] = None
    link: Optional[ElasticLink] = None
    status: Optional[NodeStatus] = None

    def fail(message: str) -> NoReturn:
        say("platoon.elastic: node %s: %s; this node ends (the others go on)" % (name, message))
        if workers is not None:
            stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
        thread = None if link is None else link.tie_thread
        refused = thread is not None and isinstance(thread.final_error, NodeRefused)
        if status is not None:
            status.end("refused" if refused else "failed", message)
        os._exit(EXIT_REFUSED if refused else 1)

    # the data plane's store (the job's nodes only: it holds the secret) and torch's gloo,
    # made ready while the controller and its workers start; the tie needs them once the
    # centre exists (the node heartbeats once it can build its group)
    with _DataPlaneInBackground(functools.partial(StoreServer, secret=secret),
                                node.host) as store:
        # the workers first (the controller and its workers talk on this machine; the data
        # plane is reached at `host`, where its store listens: see StoreServer): their
        # start-up (python, the script's imports, data and model) overlaps the node's own
        # from here on (its link's imports: numpy, pyzmq; its controller)
        workers = Workers(worker_argv, num_workers, LOCAL_HOST, read_fd, reaper_fd, fail,
                          node.ready_timeout_s, env, num_workers, "node-%s" % name,
                          preforked)
        try:
            from . import link as elastic_link
            from .client import LighthouseClient

            def connect() -> "LighthouseClient":
                address = store.get().address
                say("platoon.elastic: node %s: data plane at %s" % (name, address))
                return LighthouseClient(settings.join, name, address, secret=secret,
                                        heartbeat_interval_s=heartbeat_interval_s)

            link = elastic_link.ElasticLink(num_workers, connect, name, settings.tie,
                                            settings.tie_timeout_s, fail, started_at,
                                            settings.final_timeout_s, settings.slot)
        except BaseException:
            stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
            raise
        say("platoon.elastic: node %s, controller pid %d, job %s, lighthouse %s"
            % (name, os.getpid(), job_id, settings.join))
        with NodeStatus(settings.status_file, name, link) as status:
            try:
                store.import_gloo_after(workers.started, workers.finished)
                serve_then_finish(workers, node.controller, shlex.split(node.controller_args),
                                  link, LOCAL_HOST, node.serve_timeout_s, node.finish_timeout_s)
                link.close()
            except BaseException as exc:
                say("platoon.elastic: node %s failed: %s: %s" % (name, type(exc).__name__, exc))
                status.end("stopped" if isinstance(exc, (SystemExit, KeyboardInterrupt))
                           else "failed", "%s: %s" % (type(exc).__name__, exc))
                if workers is not None:
                    stop(workers.procs, WORKER_STOP_TIMEOUT_S, group=False)
                raise
            thread = link.tie_thread
            if thread is not None:
                say("platoon.elastic: node %s: %s" % (name, thread.summary()))
                if thread.first_contribution_s is not None:
                    say("platoon.elastic: node %s: first contributing round %.2f s after its "
                        "start" % (name, thread.first_contribution_s))
            final = link.final_result
            if final and isinstance(final.get("metrics"), dict):
                say("platoon.elastic: " + final_result_text(name, final["metrics"]))
            status.end("finished")
    return 0


def read_arguments(argv: Optional[Sequence[str]] = None
                   ) -> Tuple[ElasticNodeSettings, List[str]]:
    """(the node's settings, the worker command) of ``python -m platoon.elastic.node``'s
    command line; exits with status 2 (argparse's usage error) naming a bad option."""
    parser = argparse.ArgumentParser(
        prog="python -m platoon.elastic.node",
        description="One node of an elastic platoon job (nodes that come and go).")
    ElasticNodeSettings.add_arguments(parser)
    parser.add_argument("worker", nargs=argparse.REMAINDER,
                        help="-- then the worker command (python is sys.executable for a .py)")
    args, command = parse_node_arguments(parser, argv)
    try:
        return ElasticNodeSettings.from_arguments(args), command
    except ValueError as exc:
        parser.error(str(exc))
        raise  # (parser.error exits)


def _import_torch() -> None:
    """What a forked worker finds loaded: torch and its gloo (PlatoonError without torch).
    Imported here, not above: numpy, which the data plane imports, must load after
    `prefork` set the workers' thread caps."""
    from .dataplane import load_torch
    load_torch()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m platoon.elastic.node``: parse the command line and `run_elastic_node`."""
    settings, command = read_arguments(argv)
    # its workers forked once torch is imported (before any thread starts): a joiner's
    # worker then finds torch loaded, where it took seconds beside the node's own import
    preforked = prefork(command, settings.node.workers, _import_torch)
    try:
        return run_elastic_node(command, settings, preforked=preforked)
    except PlatoonError as exc:
        print("platoon.elastic.node: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
