"""Worker start-up in fresh processes, against a bare interpreter and a bare `import numpy, zmq`.

Each round runs, alternating: `python -c pass`, `python -c "import numpy, zmq"`,
`python -c "import platoon; platoon.Worker"`, and a worker process for a small and
a large model, each against a controller of its own started beforehand (not timed).
The worker prints monotonic stamps (one clock for every process on Linux), so its
phases are timed from the parent's `Popen`: imports, `Worker()` to registered, a
control round trip (the baseline of registration), `init_shared_params` (the
centre attached) and the first `sync_params`. The controller's check of a
registering worker's pid is timed in this process against a real connection.

Every process reads compiled bytecode, as from an installed package (pip compiles
numpy's, zmq's and platoon's at install): the processes share a bytecode cache of
this run's own (PYTHONPYCACHEPREFIX, bytecode writing on even where
PYTHONDONTWRITEBYTECODE is set), filled by a first round that is not counted.
Otherwise an editable checkout compiles platoon's sources in every process (about
25 ms here), while numpy and zmq load theirs compiled.

`python -m benchmarks.bench_startup [--rounds N] [--before DIR]` prints the table;
with --before, the platoon at DIR (a checkout's root) is measured in the same rounds,
controller included.
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from ._util import ROOT, SINGLE_THREAD_ENV

SMALL = 26_000       # the digits MLP, about 26K float32
LARGE = 25_000_000   # 100 MB of float32

# The worker process: stamps after imports, Worker(), a ping, init_shared_params, a sync.
WORKER = """\
import sys, time
import numpy as np
from platoon import EASGD, Worker
imported = time.monotonic()
w = Worker(sys.argv[1], timeout_s=60)
registered = time.monotonic()
w.send_req("ping")
pinged = time.monotonic()
params = [np.zeros(int(sys.argv[2]), np.float32)]
made = time.monotonic()
w.init_shared_params(params, EASGD(0.5))
attached = time.monotonic()
w.sync_params()
synced = time.monotonic()
print("STAMPS", imported, registered, pinged, made, attached, synced, flush=True)
w.close()
"""

# Targets of `rows` (ratio at most): a small model's worker syncs first within half as long
# again as a bare numpy and zmq take to import.
TARGETS = {"start-up: process start to first sync, 26K float32, vs python -c "
           "'import numpy, zmq'": 1.5}

IMPORTS = {"pass": "pass", "numpy_zmq": "import numpy, zmq",
           "platoon": "import platoon; platoon.Worker"}


# The controller of one worker process: answers any request with its information.
CONTROLLER = """\
from platoon import Controller
class Ping(Controller):
    def handle_control(self, req, worker_id, req_info):
        return req_info
with Ping(control_port=0, num_workers=1) as ctl:
    print("ADDR", ctl.control_address, flush=True)
    ctl.serve()
"""


def _env(src, bytecode):
    """The environment of the processes measuring the platoon at `src` (None: this checkout),
    with the bytecode cache `bytecode` (see the module docstring); they run in a neutral
    directory, so the current one does not shadow it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=src or ROOT,
               PYTHONPYCACHEPREFIX=bytecode, **SINGLE_THREAD_ENV)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(args, env, **kwargs):
    return subprocess.run([sys.executable] + args, env=env, cwd=tempfile.gettempdir(),
                          timeout=120, **kwargs)


def _interpreter(code, env):
    """(wall, CPU) seconds from Popen to exit of `python -c code`: CPU time (user + system)
    suffers less from waiting for a core on a loaded machine."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tempfile.gettempdir(),
                            stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError("python -c %r failed (code %d)" % (code, proc.returncode))
    return wall, usage.ru_utime + usage.ru_stime


def _worker(n, env):
    """The phases (seconds) of one worker process of `n` float32 against its own controller."""
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER], env=env, text=True,
                           cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                           start_new_session=True)
    try:
        line = ctl.stdout.readline()
        if not line.startswith("ADDR"):
            raise RuntimeError("startup controller exited (code %s) before listening"
                               % ctl.wait(30))
        address = line.split()[1]
        start = time.monotonic()
        out = _run(["-c", WORKER, address, str(n)], env, capture_output=True, text=True)
        ended = time.monotonic()
        ctl.wait(30)
    finally:
        if ctl.poll() is None:
            os.killpg(ctl.pid, signal.SIGKILL)
            ctl.wait()
        ctl.stdout.close()
    lines = [line for line in out.stdout.splitlines() if line.startswith("STAMPS")]
    if out.returncode != 0 or not lines:
        raise RuntimeError("startup worker failed (code %s): %s" % (out.returncode,
                                                                    out.stderr[-2000:]))
    imported, registered, pinged, made, attached, synced = map(float, lines[0].split()[1:])
    return {"imports": imported - start, "register": registered - imported,
            "round_trip": pinged - registered, "attach": attached - made,
            "first_sync": synced - attached, "to_first_sync": synced - start - (made - pinged),
            "process": ended - start}


# Raw pyzmq's first contact in a fresh process (its first context, a DEALER connected to an
# echoing ROUTER in another process, a first round trip: what a worker's registration
# does); then the controller's check of a registering peer's pid (`check_peer`, through the
# kernel) on a real TCP connection from this process, and a raw round trip on it (best
# seconds per call); then a raw centre attach (below).
RAW = """\
import os, socket, sys, time
import zmq
start = time.perf_counter()
ctx = zmq.Context()
fresh = ctx.socket(zmq.DEALER)
fresh.linger = 0
fresh.connect("tcp://127.0.0.1:%s" % sys.argv[2])
fresh.send(b"hello")
fresh.recv()
first = time.perf_counter() - start
fresh.close()
from platoon._controller.registry import check_peer
router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
router.linger = dealer.linger = 0
port = router.bind_to_random_port("tcp://127.0.0.1")
dealer.connect("tcp://127.0.0.1:%d" % port)
info = {"pid": os.getpid(), "host": socket.gethostname()}
dealer.send(b"hello")
identity, frame = router.recv_multipart(copy=False)
def check():
    check_peer(info, frame, "tcp", port, 0)
def round_trip():
    dealer.send(b"ping")
    router.send_multipart(router.recv_multipart())
    dealer.recv()
best = [float("inf")] * 2
for _ in range(5):
    for i, fn in enumerate((check, round_trip)):
        start = time.perf_counter()
        for _ in range(200):
            fn()
        best[i] = min(best[i], (time.perf_counter() - start) / 200)
print("PID", *best, first)
# The floor of attaching a centre of n float32: a new segment (allocated, as the controller
# does), mapped, and fresh parameters copied in (as the first worker does).
import mmap, sys, numpy as np, posix_ipc
n = int(sys.argv[1])
start = time.perf_counter()
shm = posix_ipc.SharedMemory(None, posix_ipc.O_CREX, size=4 * n)
try:
    os.posix_fallocate(shm.fd, 0, 4 * n)
    mapped = mmap.mmap(shm.fd, 4 * n)
    np.frombuffer(mapped, np.float32)[...] = np.zeros(n, np.float32)
    print("ATTACH", time.perf_counter() - start)
    mapped.close()
finally:
    shm.close_fd()
    shm.unlink()
router.close()
dealer.close()
ctx.term()
"""


# The other end of RAW's first contact: a ROUTER that echoes.
ECHO = """\
import zmq
router = zmq.Context().socket(zmq.ROUTER)
router.linger = 0
print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
router.send_multipart(router.recv_multipart())
"""


def raw(env, n):
    """(pid check, raw round trip, raw first contact, raw attach of `n` float32) in seconds,
    in a fresh process (see RAW), against an echo process started beforehand."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], env=env, cwd=tempfile.gettempdir(),
                            stdout=subprocess.PIPE, text=True)
    try:
        port = echo.stdout.readline().strip()
        if not port:
            raise RuntimeError("startup echo exited (code %s) before listening" % echo.wait(30))
        out = _run(["-c", RAW, str(n), port], env, check=True, capture_output=True, text=True)
        echo.wait(30)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.wait()
        echo.stdout.close()
    words = out.stdout.split()
    return tuple(float(words[i]) for i in (1, 2, 3, 5))


def startup(rounds=7, large=LARGE, sources=(None,)):
    """Median seconds of each start-up figure over `rounds` alternating rounds, for each
    platoon in `sources` (None: this checkout's; a path: PYTHONPATH for the processes)."""
    with tempfile.TemporaryDirectory(prefix="platoon-bench-bytecode-") as bytecode:
        # round 0 compiles every module into the cache: not counted
        samples = _rounds(rounds + 1, large, sources, bytecode)
    samples = {key: values[1:] for key, values in samples.items()}
    results = []
    for src in sources:
        r = {key: statistics.median(values) for (s, key), values in samples.items()
             if s in (src, "")}
        r.update(rounds=rounds, small=SMALL, large=large)
        results.append(r)
    return results[0] if sources == (None,) else results


def _rounds(rounds, large, sources, bytecode):
    """{(source, figure): [seconds, one per round]} of `rounds` alternating rounds."""
    samples = {}
    for _ in range(rounds):
        for key in ("pass", "numpy_zmq"):  # the baselines: no platoon, so once a round
            wall, cpu = _interpreter(IMPORTS[key], _env(None, bytecode))
            samples.setdefault(("", key), []).append(wall)
            samples.setdefault(("", key + "_cpu"), []).append(cpu)
        for src in sources:
            env = _env(src, bytecode)
            wall, cpu = _interpreter(IMPORTS["platoon"], env)
            samples.setdefault((src, "platoon"), []).append(wall)
            samples.setdefault((src, "platoon_cpu"), []).append(cpu)
            for label, n in (("small", SMALL), ("large", large)):
                for phase, value in _worker(n, env).items():
                    samples.setdefault((src, "%s_%s" % (label, phase)), []).append(value)
            for key, value in zip(("pid_check", "raw_round_trip", "raw_first_contact",
                                   "raw_attach"), raw(env, large)):
                samples.setdefault((src, key), []).append(value)
    return samples


def rows(r):
    """(what, measured, baseline, ratio) of a `startup` result; times in ms."""
    def ms(s):
        return "%.1f ms" % (s * 1e3)
    out = [("start-up: python -c 'import numpy, zmq' vs python -c pass", ms(r["numpy_zmq"]),
            ms(r["pass"]), r["numpy_zmq"] / r["pass"]),
           ("start-up: python -c 'import platoon; platoon.Worker' vs 'import numpy, zmq'",
            ms(r["platoon"]), ms(r["numpy_zmq"]), r["platoon"] / r["numpy_zmq"]),
           ("start-up: the same imports, CPU time (user + system)", ms(r["platoon_cpu"]),
            ms(r["numpy_zmq_cpu"]), r["platoon_cpu"] / r["numpy_zmq_cpu"])]
    for label in ("small", "large"):
        n = r[label]
        what = "%s float32" % ("%dK" % (n // 1000) if n < 10**6 else "%dM" % (n // 10**6))
        if label == "small":
            out += [("start-up: Worker() to registered vs raw pyzmq's first contact (context, "
                     "connect, first round trip)", ms(r["small_register"]),
                     ms(r["raw_first_contact"]),
                     r["small_register"] / r["raw_first_contact"])]
        out += [("start-up: init_shared_params (centre attach), %s, vs a control round trip"
                 % what, ms(r[label + "_attach"]), ms(r["small_round_trip"]),
                 r[label + "_attach"] / r["small_round_trip"]) if label == "small" else
                ("start-up: init_shared_params (centre attach), %s, vs raw: new segment "
                 "allocated, mapped, filled" % what, ms(r[label + "_attach"]),
                 ms(r["raw_attach"]), r[label + "_attach"] / r["raw_attach"]),
                ("start-up: process start to first sync, %s, vs python -c "
                 "'import numpy, zmq'" % what, ms(r[label + "_to_first_sync"]),
                 ms(r["numpy_zmq"]), r[label + "_to_first_sync"] / r["numpy_zmq"])]
    out.append(("start-up: the controller's pid check of a registering worker vs a raw "
                "pyzmq round trip", "%.0f µs" % (r["pid_check"] * 1e6),
                "%.0f µs" % (r["raw_round_trip"] * 1e6), r["pid_check"] / r["raw_round_trip"]))
    return out


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_startup")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--large", type=int, default=LARGE)
    parser.add_argument("--before", metavar="DIR", help="also measure the platoon at DIR")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    sources = (None,) if not args.before else (os.path.abspath(args.before), None)
    got = startup(args.rounds, args.large, sources)
    got = [got] if isinstance(got, dict) else got
    for src, r in zip(sources, got):
        print("\n%s (median of %d rounds)" % (src or "this checkout", r["rounds"]))
        for what, value, base, ratio in rows(r):
            print("| %s | %s | %s | %.2fx |" % (what, value, base, ratio))
        print("phases, ms: " + ", ".join("%s %.1f" % (k, v * 1e3) for k, v in sorted(r.items())
                                         if isinstance(v, float)))
    print("\nload average %.2f at start, %.2f at end" % (load, os.getloadavg()[0]))


if __name__ == "__main__":
    for _name, _value in SINGLE_THREAD_ENV.items():
        os.environ.setdefault(_name, _value)
    main()
