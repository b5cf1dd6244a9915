"""A node runner's parts, whichever way its node is linked to the others (``python -m
platoon.mpi``: a rank of a fixed world; ``python -m platoon.elastic.node``: a node that comes
and goes): its controller, run until it has served (`run_controller`, `serve_then_finish`),
its workers, started as the controller starts and watched (`Workers`), their output relayed
in whole lines, each attributed (`relay_lines`: ``[node-NAME/workerK] ...``), its command
line's worker command (`parse_node_arguments`) and its one-line messages (`say`)."""

import argparse
import importlib
import importlib.util
import json
import logging
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from .._os.argv import join_option_values
from .._os.environment import JobEnvironment, device_variables, without_job_variables
from .._os.process import die_with_parent, read_announcement, stop
from ..device import find_gpus, in_turn
from ..errors import PlatoonError
from . import reaper
from .prefork import PreforkedWorker

if TYPE_CHECKING:  # the controller's parts (numpy, pyzmq) load once the workers started
    from .._controller.services import NodeLinkProtocol

log = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT_S = 3.0  # between SIGTERM and SIGKILL when stopping workers
MAX_LINE = 64 * 1024  # bytes of a worker's line relayed in one piece (a longer one: in several)
RELAY_DRAIN_S = 2.0  # after a worker exits, for its last lines (a child it left may hold its pipe)

# A node's controller: a script (``file.py``), ``module:Class`` / ``file.py:Class``, a class,
# or None (platoon.Controller).
ControllerSpec = Union[str, type, None]


def node_devices(count: int) -> List[str]:
    """Each of this node's `count` workers' device, as the launcher plans them with -n: the
    node's visible GPUs in turn (several workers may share one), else "cpu"."""
    return in_turn(count, find_gpus()[0])


def say(line: str) -> None:
    """`line` on stderr in one write (the nodes share mpiexec's terminal: print writes the
    newline apart, and another node's line could join this one)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def relay_lines(source: IO[bytes], sink_fd: int, prefix: bytes, lock: threading.Lock) -> None:
    """Copy `source`'s lines to the file descriptor `sink_fd` until its end, each whole (a last
    line without its newline gets one; one longer than `MAX_LINE` goes in pieces, each a line)
    and led by `prefix`, in one write under `lock`: the workers of a node share its stdout, and
    a line written in parts (print writes the newline apart) would be cut by another's. Once
    `sink_fd` fails (a closed terminal), the lines are read on and dropped, so that the worker
    never blocks on a full pipe."""
    writable = True
    with source:
        for line in iter(lambda: source.readline(MAX_LINE), b""):
            if not writable:
                continue
            data = prefix + line + (b"" if line.endswith(b"\n") else b"\n")
            with lock:
                try:
                    while data:
                        data = data[os.write(sink_fd, data):]
                except OSError:
                    writable = False


def _hold_port(host: str) -> socket.socket:
    """A TCP socket bound (SO_REUSEADDR, not listening) to a free port of `host`: no other
    process gets that port, yet a listener with SO_REUSEADDR (zmq's) can bind it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host if host not in ("*", "") else "0.0.0.0", 0))
    except OSError:
        sock.close()
        raise
    return sock


def _kill_with_parent() -> None:
    """Child side of Popen: SIGKILL this process when the thread that started it dies."""
    die_with_parent(signal.SIGKILL)


def load_controller_class(spec: Optional[str]) -> type:
    """``module:Class`` or ``path/file.py:Class`` to the class (None or "": platoon.Controller);
    raises PlatoonError."""
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
        found: type = getattr(module, name)
        return found
    except (ImportError, OSError, AttributeError) as exc:
        raise PlatoonError("cannot load controller %r: %s" % (spec, exc)) from None


def run_controller(controller: ControllerSpec, controller_args: Sequence[str],
                   link: "NodeLinkProtocol", host: str, serve_timeout: Optional[float]) -> None:
    """Run this node's controller with `link` as its node link, until it has served: a
    controller script (``file.py``, run as ``__main__`` with `controller_args`; its Controller
    takes the link, `offered`) or a class (or ``module:Class`` / ``file.py:Class``,
    default platoon.Controller), created and served."""
    from .._controller.handoff import offered
    if isinstance(controller, str) and controller.endswith(".py"):
        sys.argv = [controller] + list(controller_args)
        sys.path.insert(0, os.path.dirname(os.path.abspath(controller)))
        with offered(link):  # the script's Controller takes it (`node_link_for`)
            runpy.run_path(controller, run_name="__main__")
    else:
        cls = controller if isinstance(controller, type) else load_controller_class(controller)
        with cls(host=host, node_link=link) as ctl:
            ctl.serve(timeout_s=serve_timeout)


class Workers:
    """Starts this node's `count` workers running `argv` at once, while its controller starts,
    and hands them the controller's ports once it announces them on `ready_fd` (within
    `ready_timeout_s`; each worker waits for them in `Worker()`), each with `env` plus its own
    ``PLATOON_*`` settings and thread caps (`host_workers`: the workers of every node on
    this machine, among whom its cores are divided), registered with the node's reaper
    (`reaper_fd`); calls `fail(message)` as soon as one fails (the node's end; platoon.mpi's:
    the whole job's). Each worker's stdout and stderr reach the node's own in whole lines,
    led by ``[LABEL/workerK] `` (`relay_lines`; `label` names the node: ``node-0``,
    ``node-NAME``), as the launcher shows a one-host job's. Runs in its own thread, which
    lives as long as the workers (they die with it: PR_SET_PDEATHSIG). Workers forked ahead
    (`preforked`, one per worker: `platoon.node.prefork`) are started instead of new
    processes."""

    def __init__(self, argv: Sequence[str], count: int, host: str, ready_fd: int,
                 reaper_fd: int, fail: Callable[[str], None], ready_timeout_s: float,
                 env: Mapping[str, str], host_workers: int, label: str,
                 preforked: Sequence["PreforkedWorker"] = ()) -> None:
        self.argv, self.count, self.host, self.label = list(argv), count, host, label
        self._preforked = list(preforked)
        self.host_workers = host_workers
        self.ready_fd, self.reaper_fd = ready_fd, reaper_fd
        self._fail = fail
        self.ready_timeout_s, self.env = ready_timeout_s, dict(env)
        # the controller's ports, held (bound, not listening) until it announces them: its
        # workers start with them before it serves, and no other process takes them meanwhile
        self._held = [_hold_port(host) for _ in ("control", "data")]
        self.ports = {"control_port": self._held[0].getsockname()[1],
                      "data_port": self._held[1].getsockname()[1]}
        os.environ.update(JobEnvironment(**self.ports).to_env())  # for this node's controller
        self.procs: List["subprocess.Popen[bytes]"] = []
        self.started = threading.Event()
        self.finished = threading.Event()
        self.error: Optional[BaseException] = None
        self._relays: Dict[int, List[threading.Thread]] = {}  # by worker pid
        self._restarting: Set[int] = set()  # pids of workers stopped to start them again
        self._write_lock = threading.Lock()  # one line at a time on the node's stdout/stderr
        self.thread = threading.Thread(target=self._run, name="platoon-workers", daemon=True)
        self.thread.start()

    def _spawn(self, ports: Optional[List[int]], given: Mapping[str, Any]
               ) -> List[threading.Thread]:
        """Start the workers with the controller's ports `given`, each watched by a thread
        (returned); with `ports` (a list), each also gets a pipe on which the ports it
        announces come (`await_ports`), its write end added to `ports`."""
        watchers = []
        devices = node_devices(self.count)
        for index, device in enumerate(devices):
            env = without_job_variables(self.env, "control_port", "data_port")
            env.update(JobEnvironment(worker_index=index, host=self.host, device=device,
                                      **given).to_env())
            env.update(device_variables(device, devices, os.cpu_count() or 1, self.env,
                                        host_workers=self.host_workers))
            env.setdefault("PYTHONUNBUFFERED", "1")  # its lines as they come (a pipe)
            if ports is not None and self._preforked:
                proc: "subprocess.Popen[bytes]" = self._start_forked(env, ports)
            else:
                proc = self._start_new(env, ports)
            reaper.watch(self.reaper_fd, proc.pid)
            self.procs.append(proc)
            self._relay(proc, index)
            watchers.append(threading.Thread(target=self._watch, args=(proc,), daemon=True))
            watchers[-1].start()
        return watchers

    def _start_forked(self, env: Dict[str, str], ports: List[int]) -> PreforkedWorker:
        """Start the next worker forked ahead, with `env`; its ports pipe added to `ports`."""
        forked = self._preforked.pop(0)
        ports.append(forked.ports_fd)
        env.update(JobEnvironment(ports_fd=forked.child_ports_fd).to_env())
        forked.start(env)
        return forked

    def _start_new(self, env: Dict[str, str], ports: Optional[List[int]]
                   ) -> "subprocess.Popen[bytes]":
        """Start a worker as a new process with `env`; with `ports`, a pipe for its ports,
        whose write end is added to `ports`."""
        pass_fds: Tuple[int, ...] = ()
        if ports is not None:
            read_end, write_end = os.pipe()
            ports.append(write_end)
            env.update(JobEnvironment(ports_fd=read_end).to_env())
            pass_fds = (read_end,)
        try:
            return subprocess.Popen(self.argv, env=env, preexec_fn=_kill_with_parent,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)

    def _run(self) -> None:
        ports: List[int] = []  # the write ends of the workers' pipes, until the ports go
        early: List["subprocess.Popen[bytes]"] = []
        try:
            # the workers start at once, while the controller starts (their imports, data and
            # model overlap its start-up), with the ports held for it
            watchers = self._spawn(ports, self.ports)
            early = list(self.procs)
            try:
                ready = read_announcement(self.ready_fd, self.ready_timeout_s)
            finally:
                os.close(self.ready_fd)
                self._release()
            if ready is None:
                return self._fail("the controller did not start serving within %.3g s (does "
                                  "the controller script call serve()?)" % self.ready_timeout_s)
            given = {"control_port": ready["control_port"],
                     "data_port": ready.get("data_port") or None}
            if given["control_port"] != self.ports["control_port"] or given["data_port"] \
                    not in (None, self.ports["data_port"]):
                # the controller listens elsewhere (its script chose its own ports): the
                # workers start again with those, as they see them in their environment
                log.info("%s: the controller listens on %s, not on the ports held for it: "
                         "its workers start again", self.label, given)
                self._restart(early, ports)
                watchers = self._spawn(None, given)
            line = json.dumps(given).encode() + b"\n"
            while ports:
                fd = ports.pop()
                try:
                    os.write(fd, line)
                except OSError:  # that worker is gone already: its watcher says so
                    pass
                finally:
                    os.close(fd)
            self.started.set()
            for w in watchers:
                w.join()
        except BaseException as exc:
            self.error = exc
            self._fail("could not start the workers: %s" % exc)
        finally:
            for fd in ports:  # never served: the workers waiting for ports see the pipe close
                os.close(fd)
            self._release()
            self.finished.set()

    def _release(self) -> None:
        """Let the held ports go (the controller has bound them, or never will)."""
        while self._held:
            self._held.pop().close()

    def _restart(self, early: List["subprocess.Popen[bytes]"], ports: List[int]) -> None:
        """Stop the workers started `early` (SIGKILL: none has registered: no controller
        served them yet) and close their pipes."""
        self._restarting.update(p.pid for p in early)
        for proc in early:
            proc.kill()
        for proc in early:
            proc.wait()
            self.procs.remove(proc)
        while ports:
            os.close(ports.pop())

    def _relay(self, proc: "subprocess.Popen[bytes]", index: int) -> None:
        """Relay worker `index`'s stdout and stderr to the node's (file descriptors 1 and 2,
        which the workers shared before), each line attributed."""
        prefix = b"[%s/worker%d] " % (self.label.encode(), index)
        relays = self._relays[proc.pid] = []
        for source, sink_fd in ((proc.stdout, 1), (proc.stderr, 2)):
            assert source is not None  # (piped)
            relay = threading.Thread(target=relay_lines,
                                     args=(source, sink_fd, prefix, self._write_lock),
                                     name="platoon-worker%d-output" % index, daemon=True)
            relay.start()
            relays.append(relay)

    def drain(self, timeout_s: float = RELAY_DRAIN_S, pids: Optional[List[int]] = None) -> None:
        """Wait (at most `timeout_s`) until the last lines of the workers (those of `pids`,
        if given) have been relayed."""
        deadline = time.monotonic() + timeout_s
        for pid, relays in list(self._relays.items()):
            if pids is None or pid in pids:
                for relay in relays:
                    relay.join(max(0.0, deadline - time.monotonic()))

    def _watch(self, proc: "subprocess.Popen[bytes]") -> None:
        code = proc.wait()
        if code != 0 and proc.pid not in self._restarting:
            self.drain(pids=[proc.pid])  # its last words (a traceback) before the node's
            self._fail("worker pid %d exited with code %d" % (proc.pid, code))


def serve_then_finish(workers: Workers, controller: ControllerSpec,
                      controller_args: Sequence[str], link: "NodeLinkProtocol", host: str,
                      serve_timeout: Optional[float], finish_timeout_s: float) -> None:
    """A node runner's middle (platoon.mpi's and an elastic node's): run its controller with
    `link` until the job ends, then stop `workers` still running `finish_timeout_s` later;
    PlatoonError when the controller never served them or one exited non-zero."""
    run_controller(controller, controller_args, link, host, serve_timeout)
    if not workers.started.is_set():
        raise PlatoonError("the controller returned before serving its workers")
    stop(workers.procs, WORKER_STOP_TIMEOUT_S, grace_s=finish_timeout_s, group=False)
    workers.drain()  # their last lines before the node's own
    failed = [p for p in workers.procs if p.returncode != 0]
    if failed:
        raise PlatoonError("worker pid %d exited with code %d"
                           % (failed[0].pid, failed[0].returncode))


def parse_node_arguments(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]
                         ) -> Tuple[argparse.Namespace, List[str]]:
    """(args, the worker command) of a node's command line (``... -- COMMAND``; a .py runs
    under this Python), with logging set to the job's level: the MPI node's and the elastic
    node's alike. An empty command is a parser error."""
    args = parser.parse_args(join_option_values(sys.argv[1:] if argv is None else argv,
                                                ["--controller-args"]))
    command: List[str] = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not command:
        parser.error("give the worker command after --")
    if command[0].endswith(".py"):
        command = [sys.executable] + command
    logging.basicConfig(level=(JobEnvironment.read("log_level").log_level or "WARNING").upper(),
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    return args, command


__all__ = ["WORKER_STOP_TIMEOUT_S", "ControllerSpec", "Workers", "load_controller_class",
           "node_devices", "parse_node_arguments", "relay_lines", "run_controller", "say",
           "serve_then_finish"]
