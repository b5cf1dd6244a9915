"""What the tests share that is not a fixture: the repository's paths, child processes whose
output is read line by line, the shared memory and processes a test may leave, a controller
that answers None, a bounded wait. (Fixtures are in conftest.py.)"""

import importlib.util
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from platoon import Controller
from platoon._os.environment import THREAD_VARIABLES
from platoon._os.process import job_segments, pid_alive, proc_stat

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROCS = os.path.join(HERE, "procs")
EXPERIMENTS = os.path.join(HERE, "experiments")
SHM = "/dev/shm"

# Runs that measure more than they check (a learning race, a second variant of a whole job
# already run in the suite): kept out of the default run so that the suite stays within its
# five minutes; `PLATOON_LONG_TESTS=1 python -m pytest` runs them too.
LONG_TESTS = os.environ.get("PLATOON_LONG_TESTS") == "1"


def long_run(why):
    """Marks a test that runs only with PLATOON_LONG_TESTS=1; `why`: what it costs."""
    return pytest.mark.skipif(not LONG_TESTS, reason="%s: set PLATOON_LONG_TESTS=1" % why)


def needs(*packages, reason):
    """Marks a test (or, as `pytestmark`, a file) that runs only where `packages` are
    installed; `reason` says how to install them. Unlike `pytest.importorskip` at a file's
    top, it imports nothing: every xdist worker collects every file, and importing Lightning
    there cost about 5 s of CPU in each."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason="%s (%s not installed)"
                              % (reason, ", ".join(missing)))


def platoon_segments():
    try:
        return {n for n in os.listdir(SHM) if n.startswith("platoon")}
    except FileNotFoundError:
        return set()


def orphaned_mpich_segments(since, older_than_s=1.0):
    """MPICH's shared memory (``/dev/shm/mpich_shm_*``) that no live process maps, made after
    `since` (a time.time()) and more than `older_than_s` ago: what an MPI rank killed before
    its node's ranks had all attached leaves (MPICH unlinks the segment only then). Younger
    ones may be a starting job's."""
    try:
        names = [n for n in os.listdir(SHM) if n.startswith("mpich_shm_")]
    except FileNotFoundError:
        return []
    now = time.time()
    paths = []
    for name in names:
        path = os.path.join(SHM, name)
        try:
            if since <= os.stat(path).st_mtime < now - older_than_s:
                paths.append(path)
        except FileNotFoundError:
            pass
    if not paths:
        return []
    mapped = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/maps" % entry) as f:
                    mapped.update(p for p in paths if p in f.read())
            except OSError:
                pass  # gone, or not ours to read
    return [p for p in paths if p not in mapped]


def child_pids():
    """Pids whose parent is this process (zombies included), or that live in the session of a
    process this session started (a forked child outliving its parent)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        found_stat = proc_stat(int(entry))
        if found_stat is None:
            continue
        if found_stat.ppid == me or (found_stat.session in SPAWNED and found_stat.state != "Z"):
            found.append(int(entry))
    return found


SPAWNED = set()  # pids of the processes this session started


def session_members(session):
    """Pids of the live (not zombie) processes in session `session`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found_stat = proc_stat(int(entry))
            if found_stat is not None and found_stat.session == session \
                    and found_stat.state != "Z":
                found.append(int(entry))
    return found


class Proc:
    """A child Python process whose output is collected line by line."""

    def __init__(self, args, env=None):
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                        OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        full_env.update(env or {})
        self.args = args
        self.popen = subprocess.Popen([sys.executable] + list(args), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=full_env, text=True,
                                      start_new_session=True)
        self.pid = self.popen.pid
        SPAWNED.add(self.pid)
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)  # end of output
            self._cond.notify_all()

    @property
    def output(self):
        return "\n".join(line for line in self.lines if line is not None)

    def wait_for_line(self, prefix, timeout=20.0):
        """The first output line starting with `prefix`; fails the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line is None:
                        pytest.fail("%s exited (code %s) before printing %r:\n%s" % (
                            self.args[0], self.popen.poll(), prefix, self.output))
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail("no line %r from %s within %.3g s:\n%s"
                                % (prefix, self.args[0], timeout, self.output))
                self._cond.wait(left)

    def wait_for_match(self, pattern, timeout=20.0, start=0):
        """(the re.Match, its line's index) of the first output line from index `start` on
        that matches regular expression `pattern`; fails the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._cond:
            while True:
                for index in range(start, len(self.lines)):
                    line = self.lines[index]
                    if line is None:
                        pytest.fail("%s exited (code %s) before printing a line matching %r:\n%s"
                                    % (self.args[0], self.popen.poll(), pattern, self.output))
                    match = regex.match(line)
                    if match:
                        return match, index
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail("no line matching %r from %s within %.3g s:\n%s"
                                % (pattern, self.args[0], timeout, self.output))
                self._cond.wait(left)

    def wait(self, timeout=30.0):
        """Exit code; fails the test (the process is killed in teardown) after `timeout` s."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("%s still running after %.3g s:\n%s" % (self.args[0], timeout, self.output))
        self._reader.join(5)
        return code

    def kill(self):
        """SIGKILL the process and everything in its session (a forked child outlives it)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered asynchronously: wait (bounded) until the session's other
        # processes, such as a forked child whose parent is gone, have died too.
        deadline = time.monotonic() + 5.0
        while session_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._reader.join(5)


class Nothing(Controller):
    """A controller that answers every request with None."""

    def handle_control(self, req, worker_id, req_info):
        return None


def wait_until(condition, timeout, what):
    """Poll `condition` (state owned by other processes: reaped pids, unlinked files, a
    handler installed) until it holds; fails the test, naming `what`, after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.3g s waiting for %s" % (timeout, what))
        time.sleep(0.02)  # bounded by the deadline


class Tolerant(Controller):
    """Carries on when a worker dies, remembering when it heard of it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.deaths = []

    def handle_control(self, req, worker_id, req_info):
        return None

    def handle_worker_death(self, worker_id, exit_info):
        self.deaths.append((worker_id, exit_info, time.monotonic()))


class TcpProxy:
    """Forwards 127.0.0.1:port to the controller; `reset()` aborts every connection with a
    TCP RST, as a network failure would. The listener stays, so ZeroMQ reconnects."""

    def __init__(self, target_port):
        self.target = target_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.conns = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            with self.lock:
                self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass

    def reset(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for conn in conns:
            # SO_LINGER on with a zero timeout: close() sends a RST
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def close(self):
        self.stopped.set()
        self.reset()
        self.listener.close()
        for t in self.threads:
            t.join(5)


def assert_golden(made, path):
    """`made` is what the golden file at `path` (tests/golden/) holds; WRITE_GOLDEN=1 writes
    it first (after a deliberate change: then read the diff)."""
    if os.environ.get("WRITE_GOLDEN"):
        with open(path, "w") as f:
            json.dump(made, f, indent=1)
            f.write("\n")
    with open(path) as f:
        assert made == json.load(f)


def garbled_minibatch(rng):
    """Frames of one random, usually malformed, minibatch message."""
    values = [0, -1, 3, 2 ** 63, 10 ** 30, 1.5, True, None, "3", [], {}, "\u00e9", "C", "F",
              "<f4", "|b1", "<c16"]
    dtypes = ["<f4", "<f8", "|u1", "<i8", "|b1", "<c8", "f", "?", "O", "|O", "V8", "U3", "M8",
              "<M8[s]", "(2)f4", "f4,f4", "\u00e9", "S", "a5", "[f4]", "int", "float64", "f4)",
              "(", "'", "\x00", "<f4 ", "c>", "e", "<f2", "g", "G", "<f16", "1f4", "f" * 16,
              "=" * 17, "l", "p", "P", "i16", "u0", "b", "h", "H"]
    kind = rng.randrange(6)
    if kind == 0:  # random bytes, random frame count
        return [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(0, 4))]
    if kind == 1:  # a valid header with bytes flipped
        header = bytearray(json.dumps([{"dtype": "<f4", "shape": [2, 3], "order": "C"}]).encode())
        for _ in range(rng.randrange(1, 4)):
            header[rng.randrange(len(header))] = rng.randrange(256)
        return [bytes(header), bytes(24)]
    specs = []
    for _ in range(rng.randrange(0, 4)):
        spec = {"dtype": rng.choice(dtypes + values),
                "shape": rng.choice([[rng.randrange(0, 4)], [2, 3], [], [0, 2 ** 63],
                                     [0, 10 ** 40], [-1], [1.0], [True], [2 ** 31] * 3,
                                     [0] * 40, [1] * 70, rng.choice(values)]),
                "order": rng.choice(["C", "F", "C", "A", "K", "", None, ["C"], 1])}
        if rng.random() < 0.2:
            del spec[rng.choice(list(spec))]
        specs.append(spec if rng.random() < 0.9 else rng.choice(values))
    header = json.dumps(specs if kind != 5 else {"x": specs}, ensure_ascii=rng.random() < 0.5)
    frames = [header.encode("utf-8", "surrogatepass")]
    for _ in range(len(specs) + rng.choice([0, 0, 0, -1, 1])):
        frames.append(bytes(rng.choice([0, 1, 4, 8, 12, 24, 48])))
    return frames


def run_all(workers, fn, timeout=20.0):
    """Run fn(worker) in one thread per worker; return the results in worker order."""
    results, errors = [None] * len(workers), []

    def body(k, w):
        try:
            results[k] = fn(w)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k, w)) for k, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker is stuck in a collective"
    if errors:
        raise errors[0]
    return results


def loaded_after(statement):
    """The modules loaded by `statement` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", statement + "\nimport sys\nprint(' '.join("
                          "sorted(sys.modules)))"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def job_processes(job_id):
    """Pids of live processes started for a job (they carry PLATOON_JOB_ID)."""
    needle = ("PLATOON_JOB_ID=%s" % job_id).encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    if needle in f.read().split(b"\0"):
                        if pid_alive(int(entry)):
                            found.append(int(entry))
            except OSError:
                pass
    return found


def launcher_cmd(*args):
    return [sys.executable, "-m", "platoon.launch.cli"] + list(args)


def run_launcher(args, tmp_path, env=None, timeout=120, script_args=None):
    """(exit code, output) of the launcher run with `args`, --log-dir tmp_path/logs, and
    `script_args` (if given) after --."""
    full_env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}  # caps: ours
    full_env.update(env or {})
    after = [] if script_args is None else ["--"] + list(script_args)
    proc = subprocess.run(args + ["--log-dir", str(tmp_path / "logs")] + after,
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    job = re.search(r"job ([0-9a-f]{16})", out)
    if job:  # whatever happened, the job's shared memory is gone once the launcher exits
        assert not job_segments(job.group(1)), out
    return proc.returncode, out


def job_id_of(output):
    match = re.search(r"job ([0-9a-f]{16})", output)
    assert match, output
    return match.group(1)


def assert_job_gone(job_id):
    wait_until(lambda: not job_processes(job_id), 15, "the job's processes to exit")
    assert not job_segments(job_id)


# The files started first, in this order (pytest.ini has xdist hand the files out in
# collection order: --dist loadfile --no-loadscope-reorder; conftest.py sorts them). Three
# xdist processes share 2 cores, so the files that keep a core busy (frameworks' imports,
# whole jobs; by their CPU, most first) alternate with the files that mostly wait (on
# timeouts, sleeping processes, shaped links; by their wall time, longest first), about a
# second of waiting files for every two of busy ones: a waiting file then runs beside two
# busy ones instead of leaving a core idle. The short files not listed fill the end, as
# collected. Measured in a quiet full run (CPU of the file's processes, wall time): a list
# of the longest files first, waiting ones among them, left the cores a fifth idle in the
# run's last minute.
# tests/package/test_suite_order.py checks that each listed file exists.
STARTED_FIRST = [
    "tests/integrations/test_upstream.py",               # 70 s of CPU in 89 s
    "tests/launch/test_launcher.py",                     # waits: 28 s of CPU in 66 s
    "tests/mpi/test_mpi.py",                             # 43 in 74
    "tests/frameworks/test_torch_sync.py",               # waits: 17 in 34
    "tests/integrations/test_huggingface.py",            # 22 in 34
    "tests/elastic/test_elastic_launcher.py",            # 20 in 28
    "tests/package/test_static_checks.py",               # waits: 9 in 20
    "tests/integrations/test_accelerate.py",             # 18 in 25
    "tests/elastic/test_lighthouse.py",                  # waits: 3 in 17
    "tests/elastic/test_elastic_netns.py",               # 16 in 28
    "tests/controller/test_faults.py",                   # waits: 3 in 16
    "tests/elastic/test_node.py",                        # 16 in 19
    "tests/benchmarking/test_slow_link.py",              # 14 in 13
    "tests/controller/test_controller.py",               # waits: 1 in 11
    "tests/integrations/test_lightning.py",              # 14 in 20
    "tests/elastic/test_dataplane.py",                   # waits: 4 in 10
    "tests/controller/test_checkpoint.py",               # 12 in 22
    "tests/rules/test_downpour.py",                      # waits: 4 in 9
    "tests/elastic/test_prefork.py",                     # 11 in 17
    "tests/transport/test_minibatch_delivery.py",        # waits: 2 in 8
    "tests/worker/test_exchange.py",                     # 11 in 21
    "tests/controller/test_registration.py",             # waits: 0.4 in 7
    "tests/benchmarking/test_language_model.py",         # 10 in 14
    "tests/elastic/test_lighthouse_limits.py",           # waits: 0.4 in 7
    "tests/launch/test_ssh_hosts.py",                    # 10 in 11
    "tests/elastic/test_store.py",                       # waits: 1.5 in 5
    "tests/benchmarking/test_porting_a_script.py",       # 7 in 11
    "tests/transport/test_security.py",                  # waits: 2 in 4
    "tests/benchmarking/test_transformer_benchmark.py",  # 6 in 9
    "tests/worker/test_worker.py",                       # waits: 1 in 4
    "tests/benchmarking/test_benchmarks.py",             # 6 in 9
    "tests/elastic/test_link.py",                        # waits: 0.1 in 3
    "tests/elastic/test_lighthouse_pace.py",             # waits: 0.1 in 3
    "tests/controller/test_fuzz_and_load.py",            # 5 in 4
    "tests/transport/test_minibatch_window.py",          # waits: 0.2 in 2
    "tests/collectives/test_collectives.py",             # waits: 0.2 in 2
    "tests/benchmarking/test_lighthouse_scale.py",       # waits: 0.7 in 2
]
