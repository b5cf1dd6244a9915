"""Workers forked from their node after it imported what they import: an elastic node's
worker then finds torch (seconds of imports, which its node needs anyway for gloo) loaded,
instead of importing it again beside its node on the same cores.

`prefork(command, count, preload)`, called in the node's main thread before any other
thread starts, imports (`preload`) once and forks `count` children, each waiting; `Workers`
starts each with its environment (`PreforkedWorker.start`). A started child runs its script
as ``python script.py`` (or ``python -m module``) would: its own ``__main__`` (for good: its
threads and atexit handlers see it too), ``__file__``, ``sys.argv``, ``sys.orig_argv`` and
``sys.path[0]``, its environment, fresh stdout and stderr on its own pipes (unbuffered with
PYTHONUNBUFFERED), logging, numpy's and torch's random states and torch's threads (if
loaded) as a new process has them, an uncaught exception printed and exit code 1, atexit
handlers and non-daemon threads run at its end. ``PLATOON_PREFORK=0`` starts workers as new
processes.
"""

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, List, Mapping, Optional, Sequence, Set, Tuple

from .._os.environment import THREAD_VARIABLES, JobEnvironment, device_variables
from .._os.process import die_with_parent, read_to_end
from ..errors import PlatoonError

_kept_streams: List[object] = []  # the node's stdio objects, never closed in a child


def script_of(command: Sequence[str]) -> Optional[Tuple[str, str]]:
    """("path", SCRIPT.py) or ("module", NAME) when `command` runs this Python (its path, or a
    name PATH finds beside it: ``python``, ``python3`` of its environment) on a script or a
    module, with no interpreter option; else None (such a worker is not forked)."""
    if len(command) < 2 or not _is_this_python(command[0]):
        return None
    if command[1] == "-m":
        return ("module", command[2]) if len(command) > 2 else None
    if command[1].endswith(".py") and not command[1].startswith("-"):
        return ("path", command[1])
    return None


def _is_this_python(program: str) -> bool:
    import shutil
    found = program if os.sep in program else shutil.which(program)
    if found is None:
        return False
    here = os.path.abspath(sys.executable)
    try:  # (in its folder: another environment's python may be the same file)
        return os.path.dirname(os.path.abspath(found)) == os.path.dirname(here) \
            and os.path.samefile(found, here)
    except OSError:
        return False


class PreforkedWorker(subprocess.Popen):  # type: ignore[type-arg]
    """A worker forked by `prefork`, waiting for `start`. A Popen in all a node uses: `pid`,
    `poll`, `wait`, `send_signal`, `terminate`, `kill`, `returncode`, `stdout`, `stderr`."""

    _child_created = False  # (Popen.__del__: nothing of Popen's own to clean up)

    def __init__(self, args: Sequence[str], pid: int, stdout_fd: int, stderr_fd: int,
                 go_fd: int, ports_fd: int, child_ports_fd: int) -> None:
        # not Popen.__init__: the process exists already
        self.args = list(args)
        self.pid = pid
        self.returncode: Optional[int] = None
        self.stdin = None
        self.stdout: IO[bytes] = open(stdout_fd, "rb")
        self.stderr: IO[bytes] = open(stderr_fd, "rb")
        self._output_fds = [stdout_fd, stderr_fd]
        self.ports_fd = ports_fd  # where its controller's ports are written (`await_ports`)
        self.child_ports_fd = child_ports_fd  # that pipe's read end, in the worker
        self._go_fd: Optional[int] = go_fd
        self._reaping = threading.Lock()

    def start(self, env: Mapping[str, str]) -> None:
        """Let the worker run its script with the environment `env` (once)."""
        if self._go_fd is None:
            raise RuntimeError("worker pid %d was started already" % self.pid)
        fd, self._go_fd = self._go_fd, None
        data = json.dumps({"env": dict(env)}).encode()
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # it is gone (its watcher says how)
            pass
        finally:
            os.close(fd)

    def give_up(self) -> None:
        """Never start it: it exits at once (its go pipe closed); reaped, pipes closed."""
        if self._go_fd is not None:
            os.close(self._go_fd)
            self._go_fd = None
        self.wait()
        os.close(self.ports_fd)
        self.forget()

    def forget(self) -> None:
        """Close its output pipes' objects (their fds too): once given up, or in a worker
        forked after it."""
        self.stdout.close()
        self.stderr.close()

    def parent_fds(self) -> List[int]:
        """The node's ends of this worker's pipes (open in the node, not in the worker)."""
        return self._output_fds + [self.ports_fd] \
            + ([] if self._go_fd is None else [self._go_fd])

    def poll(self) -> Optional[int]:
        return self._reap(block=False)

    def wait(self, timeout: Optional[float] = None) -> int:
        if timeout is None:
            code = self._reap(block=True)
            assert code is not None  # (a blocking waitpid returns its status)
            return code
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            code = self._reap(block=False)
            if code is not None:
                return code
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, left))
            delay = min(2 * delay, 0.05)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def _reap(self, block: bool) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        if not self._reaping.acquire(block):
            return None  # (another thread waits for it)
        try:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its status is lost (as Popen)
                    pid, status = self.pid, 0
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        finally:
            self._reaping.release()
        return self.returncode


def prefork(command: Sequence[str], count: int, preload: Callable[[], object]
            ) -> List[PreforkedWorker]:
    """`preload()` (imports), then fork `count` workers for `command`, each waiting for its
    `start`; [] where they are not forked (the command runs no Python script or module,
    `preload` raised ImportError or PlatoonError, or ``PLATOON_PREFORK=0``): `Workers` then
    starts them as new processes. Call it before any thread starts. Sets the workers' thread
    caps (`device_variables`) in this process's environment first: the libraries `preload`
    loads read them as they load."""
    script = script_of(command)
    if script is None or count < 1 or JobEnvironment.read("prefork").prefork == 0 \
            or not hasattr(os, "fork"):
        return []
    inherited = _open_fds()
    caps = device_variables("cpu", ["cpu"] * count, os.cpu_count() or 1, os.environ,
                            host_workers=count)
    os.environ.update((k, v) for k, v in caps.items() if k in THREAD_VARIABLES)
    try:
        preload()
    except (ImportError, PlatoonError):
        return []
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    workers: List[PreforkedWorker] = []
    for _ in range(count):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        ports_r, ports_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:  # (no memory, a process limit): new processes, as before
            for fd in (out_r, out_w, err_r, err_w, go_r, go_w, ports_r, ports_w):
                os.close(fd)
            for worker in workers:
                worker.give_up()
            logging.getLogger(__name__).warning(
                "could not fork the workers (%s): they start as new processes", exc)
            return []
        if pid == 0:
            keep = {go_r, ports_r}
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            # what a new process would not have: what this node inherited, the parent's
            # ends of its own pipes and of the workers forked before it (its go pipe's
            # other end held here, a worker would never see it closed)
            for worker in workers:  # (their objects closed: freed as the script ends, they
                worker.forget()  # would close what it opened under the same numbers since)
            for fd in inherited | {out_r, out_w, err_r, err_w, go_w, ports_w} \
                    | {fd for w in workers for fd in w.parent_fds()}:
                if fd > 2 and fd not in keep:
                    _close(fd)
            _run_when_started(script, list(command), go_r, parent)  # (never returns)
        for fd in (out_w, err_w, go_r, ports_r):
            os.close(fd)
        workers.append(PreforkedWorker(command, pid, out_r, err_r, go_w, ports_w, ports_r))
    return workers


def _run_when_started(script: Tuple[str, str], command: List[str], go_fd: int,
                      parent: int) -> None:
    """The forked child: wait for its environment, then run the script; exits (SystemExit,
    through the node's frames, so that Python ends it as it ends any script)."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    data = read_to_end(go_fd)
    os.close(go_fd)
    if not data:  # its node never started it
        os._exit(0)
    env = json.loads(data)["env"]
    os.environ.clear()
    os.environ.update(env)
    _as_a_new_process(bool(env.get("PYTHONUNBUFFERED")))
    kind, target = script
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = command  # (a script restarting itself execs its own command)
    if kind == "path":
        sys.argv = command[1:]
        sys.path[0] = os.path.dirname(os.path.realpath(target))  # (the real file's folder)
    else:
        sys.argv = [target] + command[3:]
        sys.path[0] = os.getcwd()
    try:
        _run(kind, target)
    except SystemExit:
        raise
    except BaseException:
        kind_, exc, tb = sys.exc_info()
        here = {__file__, getattr(sys.modules.get("runpy"), "__file__", None)}
        while tb is not None and tb.tb_frame.f_code.co_filename in here:
            tb = tb.tb_next
        if exc is not None:
            exc.__traceback__ = tb  # (what Python prints)
        sys.excepthook(kind_, exc, tb)  # type: ignore[arg-type]
        if isinstance(exc, KeyboardInterrupt):  # raised on, printed: Python then ends it by
            sys.excepthook = _printed  # SIGINT (once its threads and atexit handlers ran)
            raise
        sys.exit(1)
    sys.exit(0)


def _printed(*args: object) -> None:
    """sys.excepthook for an uncaught exception printed already (without the node's frames)."""


def _run(kind: str, target: str) -> None:
    """Run the script at `target` (kind "path"), or the module `target`, as ``__main__``, a
    new module that stays ``__main__`` once its body has ended (its threads, atexit)."""
    import builtins
    import types
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    if kind == "module":
        import runpy  # python -m's own runner (run_module would put the node's back)
        runpy._run_module_as_main(target)  # type: ignore[attr-defined]  # noqa: SLF001
        return
    from importlib.machinery import SourceFileLoader
    path = os.path.join(os.getcwd(), target)  # (as Python makes it absolute: not normalized)
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = SourceFileLoader("__main__", path)
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _as_a_new_process(unbuffered: bool) -> None:
    """What a new Python process would have, where the node's state differs: stdout and
    stderr (on the child's pipes), logging without the node's handlers, numpy's random
    state of its own, torch's threads as its environment caps them."""
    _kept_streams.extend([sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__])
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=getattr(old, "errors", None) or "strict",
            line_buffering=(name == "stderr" and not unbuffered), write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, "__%s__" % name, stream)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # (a new process seeds it at random)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _open_fds() -> Set[int]:
    """This process's open file descriptors (not the one listing them)."""
    import fcntl
    try:
        listed = {int(name) for name in os.listdir("/proc/self/fd")}
    except OSError:
        return set()
    open_now = set()
    for fd in listed:
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            open_now.add(fd)
        except OSError:
            pass
    return open_now


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


__all__ = ["PreforkedWorker", "prefork", "script_of"]
