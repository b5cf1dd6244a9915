"""Fixtures for tests with real processes, sockets and shared memory, all bounded and cleaned."""

import compileall
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

# One OpenBLAS thread in the suite's processes, set before numpy loads here: each of the
# thousands of short processes the suite starts otherwise spins up a BLAS thread pool as it
# imports numpy (0.13 s of CPU instead of 0.06 on 2 cores), which none of them needs: the
# tests phase took 267-271 s with it, 278-282 s without (quiet, fresh clones). The launcher's
# jobs in the tests keep their own caps (`helpers.run_launcher` removes the suite's).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest

from platoon import Worker
from platoon._centre.shmem import segment_owner

from helpers import (
    PROCS,
    SHM,
    SPAWNED,
    STARTED_FIRST,
    Nothing,
    Proc,
    child_pids,
    orphaned_mpich_segments,
    platoon_segments,
)

# The launcher finds no GPU in the suite's jobs, on any machine: `-n 2` then means two CPU
# workers, as on a machine without GPUs (with one, the launcher would place both on the
# GPU). A test of GPU planning sets PLATOON_ASSUME_GPUS itself, or removes it to look at
# the machine's GPUs.
os.environ.setdefault("PLATOON_ASSUME_GPUS", "-1")
SUITE_STARTED = time.time()  # MPICH segments older than the suite are not the suite's


# What the suite's processes import, compiled once before they start (see pytest_sessionstart),
# by two processes at once: the first imports torch and the frameworks on it; the second,
# meanwhile, what they import that needs no torch (some 40% of the bytecode: SymPy, SciPy,
# the matplotlib that torchmetrics imports, ...), so that the first finds it compiled
FRAMEWORKS = (("numpy", "torch", "torch.distributed", "torch._dynamo", "transformers.trainer",
               "accelerate", "lightning", "pytorch_lightning"),
              ("zmq", "mpi4py", "sympy", "scipy.optimize", "matplotlib.pyplot", "huggingface_hub",
               "jinja2", "rich", "jsonargparse"))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """In the main process, before xdist starts its workers: let the suite's processes write
    bytecode, and write it for the repository's modules and for what they import.

    The README's command installs with ``pip --no-compile``: pip would compile all of
    torch, transformers and Lightning (14,000 files, some 30 s of the install on 2 cores)
    where the suite imports about 4,000 of them. Here two processes import those once (a
    core each, while this one compiles the repository), so their bytecode is written before
    the suite's processes race to compile them, and each process writes what else it
    compiles. Where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, every
    one of the suite's thousands of processes would otherwise compile what it imports
    again (platoon's modules alone: 0.07 s of CPU each)."""
    if hasattr(session.config, "workerinput"):
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    importers = []
    if not _compiled("torch"):  # (once: a later run finds torch's bytecode)
        for names in FRAMEWORKS:
            imports = "".join("try:\n    import %s\nexcept Exception:\n    pass\n" % name
                              for name in names)  # (what fails is compiled where it is used)
            importers.append(subprocess.Popen(
                [sys.executable, "-c", imports], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in ("platoon", "tests", "benchmarks", "examples"):
        compileall.compile_dir(os.path.join(root, folder), quiet=2, workers=1)
    for importer in importers:
        try:
            importer.wait(timeout=300)
        except subprocess.TimeoutExpired:
            importer.kill()  # the suite's processes compile what it had not
            importer.wait()


def _compiled(package):
    """Whether `package` is missing or its __init__ has bytecode for this interpreter."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return True
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def pytest_collection_modifyitems(session, config, items):
    """The files of helpers.STARTED_FIRST first, in its order (pytest.ini has xdist keep it);
    the others after them, as collected (each file's tests keep their order)."""
    rank = {path: index for index, path in enumerate(STARTED_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves shared memory of this process or of one it started, or a
    child running. (Segments of other owners belong to a suite running beside this one.)
    MPICH's segments made meanwhile that no process maps any more (a rank the test killed
    left them) are removed."""
    before, began = platoon_segments(), time.time()
    yield
    leaked = []
    for name in sorted(platoon_segments() - before):
        owner = segment_owner(os.path.join(SHM, name))
        if owner == os.getpid() or owner in SPAWNED:
            leaked.append(name)
            os.unlink(os.path.join(SHM, name))
    children = child_pids()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # gone already, or not our child (the kill was enough)
    for path in orphaned_mpich_segments(began):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # removed by the other xdist worker
    assert not leaked, "test leaked shared memory: %s" % leaked
    assert not children, "test left child processes running: %s" % children


def pytest_sessionfinish(session, exitstatus):
    """At the end of the run (in its main process, once the xdist workers are done): unlink
    MPICH's segments made during the suite that no process maps any more and that no test's
    `no_leaks` removed (under a second old at its end), saying so. MPICH's files, not
    platoon's, but the suite leaves /dev/shm as it found it (segments from before the suite
    are left)."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the main process looks once all are done
    removed = []
    for path in orphaned_mpich_segments(SUITE_STARTED):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass  # removed by another process of this run
    if removed:
        text = ("removed %d MPICH shared-memory segment(s) that no process maps, left by MPI "
                "ranks the tests killed: %s" % (len(removed), ", ".join(sorted(removed))))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")  # after xdist's progress line, which it does not end
            reporter.write_line(text)
        else:
            warnings.warn(text, stacklevel=1)


@pytest.fixture
def procs():
    """Start helper scripts from tests/procs as real processes; all are killed at teardown."""
    started = []

    def start(script, *args, env=None):
        proc = Proc([os.path.join(PROCS, script)] + [str(a) for a in args], env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


class Serving:
    """A controller serving in a background thread of the test process."""

    def __init__(self, ctl, timeout):
        self.ctl = ctl
        self.error = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._thread.start()

    def _run(self, timeout):
        try:
            self.ctl.serve(timeout_s=timeout)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout=30.0):
        self._thread.join(timeout)
        if self._thread.is_alive():
            pytest.fail("controller still serving after %.3g s" % timeout)
        if self.error is not None:
            raise self.error


@pytest.fixture
def serve():
    """serve(ctl, timeout=20) runs ctl.serve in a thread; teardown waits for it and closes ctl."""
    servings = []

    def start(ctl, timeout=20.0):
        serving = Serving(ctl, timeout)
        servings.append(serving)
        return serving

    yield start
    for serving in servings:
        serving._thread.join(25)
        serving.ctl.close()


@pytest.fixture
def raw_client():
    """raw_client(ctl, kind=zmq.DEALER): a bare ZeroMQ socket connected to the controller."""
    import zmq

    ctx = zmq.Context()

    def connect(ctl, kind=zmq.DEALER):
        sock = ctx.socket(kind)
        sock.linger = 0
        sock.rcvtimeo = 5000
        sock.connect("tcp://127.0.0.1:%d" % ctl.control_port)
        return sock

    yield connect
    ctx.destroy(linger=0)


class RawDataSocket:
    """A bare ZeroMQ ROUTER standing in for a controller's data socket: `send(frames)` queues
    a message, sent (as is) to the worker once it has asked for a minibatch."""

    def __init__(self, ctx):
        import zmq

        self._router = ctx.socket(zmq.ROUTER)
        self._router.linger = 0
        self.port = self._router.bind_to_random_port("tcp://127.0.0.1")
        address = "inproc://raw-data-%d" % id(self)
        self._queue = ctx.socket(zmq.PAIR)
        self._queue.linger = 0
        self._queue.bind(address)
        inbox = ctx.socket(zmq.PAIR)
        inbox.linger = 0
        inbox.connect(address)
        self._thread = threading.Thread(target=self._run, args=(inbox,), daemon=True)
        self._thread.start()

    def _run(self, inbox):
        import zmq

        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(inbox, zmq.POLLIN)
        identity, pending = None, []
        try:
            while True:
                events = dict(poller.poll(30000))
                if not events:
                    return  # bounded: a test using this fixture fails on its own timeouts
                if self._router in events:
                    identity = self._router.recv_multipart()[0]  # a request: who to answer
                if inbox in events:
                    frames = inbox.recv_multipart()
                    if frames == [b"stop"]:
                        return
                    pending.append(frames)
                while identity is not None and pending:
                    self._router.send_multipart([identity] + pending.pop(0))
        finally:
            inbox.close(0)

    def send(self, frames):
        self._queue.send_multipart(frames)

    def close(self):
        self._queue.send(b"stop")
        self._thread.join(10)
        assert not self._thread.is_alive(), "raw data socket thread did not stop"


@pytest.fixture
def raw_data_socket():
    """A RawDataSocket on a free port, for feeding workers garbage minibatches."""
    import zmq

    ctx = zmq.Context()
    feed = RawDataSocket(ctx)
    try:
        yield feed
    finally:
        feed.close()
        ctx.destroy(linger=0)


@pytest.fixture
def one_worker(serve):
    """A controller serving in a thread and one worker of it, in this process."""
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    w = Worker(ctl.control_port, timeout_s=10)
    yield ctl, w
    w.close()
    serving.join()
