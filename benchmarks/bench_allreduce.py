"""all_reduce latency and bandwidth: platoon's Worker.all_reduce against raw mpi4py Allreduce.

usage: python benchmarks/bench_allreduce.py [--iters N] [--rounds R] [--json]

(`python -m benchmarks --only allreduce` runs `suite`: 2 workers on one node against
mpi4py's Allreduce with 2 ranks and a numpy sum of the same arrays, at 1K, 1M and 10M
float32.) This script:

Runs, in this one invocation, in alternation for R rounds (the order rotating each
round, so that load from elsewhere hits every setup alike):
  mpi4py      mpiexec -n 2: Comm.Allreduce between two ranks (the floor for two nodes)
  1 node      one controller, 2 workers: shared memory only, no MPI
  2 nodes     mpiexec -n 2 python -m platoon.mpi --workers W: W workers per node
for 1 float32 (latency) and 1M float32 (4 MB: time and algorithm bandwidth, bytes per second
of result). Each figure is the median over --iters calls after a warm-up, and then the
median of that over the rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from platoon._os.process import find_mpiexec

SIZES = {"1 float": 1, "1M floats": 1 << 20}
SUITE_SIZES = {"1K": 1_000, "1M": 1_000_000, "10M": 10_000_000}
HERE = os.path.abspath(__file__)


def _sizes(spec):
    """{label: count} from "label=count,..." (a child's --sizes), or the defaults."""
    if not spec:
        return SIZES
    return {label: int(count) for label, count in (part.split("=") for part in spec.split(","))}


def _iters(n, iters):
    """Calls to time for n elements: `iters` at 1M, more for less, at least 10."""
    return max(10, min(20 * iters, int(iters * 1_000_000 / max(n, 1))))


def timed(fn, iters):
    for _ in range(max(3, iters // 10)):
        fn()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def raw_mpi(iters, sizes=None):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = {}
    for label, n in _sizes(sizes).items():
        buf, result = np.ones(n, np.float32), np.empty(n, np.float32)
        comm.Barrier()
        out[label] = timed(lambda buf=buf, result=result: comm.Allreduce(buf, result, MPI.SUM),
                           _iters(n, iters) if sizes else iters)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def platoon_worker(iters, sizes=None):
    from platoon import Worker
    with Worker(timeout_s=60) as w:
        out = {}
        for label, n in _sizes(sizes).items():
            buf, result = np.ones(n, np.float32), np.empty(n, np.float32)
            w.barrier()
            out[label] = timed(lambda buf=buf, result=result: w.all_reduce(buf, "sum", out=result),
                               _iters(n, iters) if sizes else iters)
        if w.global_rank == 0:
            print("RESULT " + json.dumps(out), flush=True)


def result_of(output):
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit("no result in:\n" + output)


def run(cmd, env=None):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit("%s failed:\n%s" % (" ".join(cmd), proc.stdout))
    return result_of(proc.stdout)


def one_node(iters, workers=2, sizes=None):
    from platoon import Controller
    with Controller(control_port=0, num_workers=workers) as ctl:
        thread = threading.Thread(target=ctl.serve, kwargs={"timeout": 600}, daemon=True)
        thread.start()
        env = dict(os.environ, PLATOON_CONTROL_PORT=str(ctl.control_port),
                   PLATOON_NUM_WORKERS=str(workers))
        extra = ["--sizes", sizes] if sizes else []
        procs = [subprocess.Popen([sys.executable, HERE, "--worker", "--iters", str(iters)]
                                  + extra, env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(workers)]
        outputs = [p.communicate(timeout=600)[0] for p in procs]
        thread.join(60)
    return result_of("".join(outputs))


def _child_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATOON_")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return env


def numpy_sum(n, iters):
    """Median seconds of np.add of two arrays of n float32 into a third: the memory traffic
    of reducing 2 workers' arrays, with no communication at all."""
    a, b = np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    out = np.empty_like(a)
    return timed(lambda: np.add(a, b, out=out), _iters(n, iters))


def suite(rounds=3, iters=50, sizes=SUITE_SIZES):
    """all_reduce (float32 sum) of 2 workers on one node (shared memory, no MPI) against
    mpi4py's Allreduce with 2 ranks under mpiexec and a numpy sum of 2 arrays in one
    process (the memory limit), at each of `sizes`: the three alternate for `rounds`
    rounds (order rotating); each figure is the median time per call over a run (`iters`
    calls at 1M, more for smaller sizes), then the best run. Seconds by setup and size;
    mpi4py's are None without mpiexec (pip install -e '.[mpi]')."""
    spec = ",".join("%s=%d" % item for item in sizes.items())
    mpiexec = find_mpiexec()
    setups = {
        "platoon": lambda: one_node(iters, 2, spec),
        "numpy_sum": lambda: {label: numpy_sum(n, iters) for label, n in sizes.items()},
    }
    if mpiexec is not None:
        setups["mpi4py"] = lambda: run([mpiexec, "-n", "2", sys.executable, HERE, "--raw",
                                        "--iters", str(iters), "--sizes", spec], _child_env())
    names = list(setups)
    best = {name: {label: float("inf") for label in sizes} for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got = setups[name]()
            for label in sizes:
                best[name][label] = min(best[name][label], got[label])
    return {label: {"n": n, "platoon_s": best["platoon"][label],
                    "numpy_sum_s": best["numpy_sum"][label],
                    "mpi4py_s": best["mpi4py"][label] if mpiexec else None}
            for label, n in sizes.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every setup, alternated (median over them)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)  # label=count,... (children)
    args = parser.parse_args()
    if args.raw:
        return raw_mpi(args.iters, args.sizes)
    if args.worker:
        return platoon_worker(args.iters, args.sizes)
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("no mpiexec: pip install -e '.[mpi]'")
    env = _child_env()
    iters = ["--iters", str(args.iters)]
    setups = {
        "mpi4py Allreduce, 2 ranks": lambda: run(
            [mpiexec, "-n", "2", sys.executable, HERE, "--raw"] + iters, env),
        "platoon, 1 node x 2 workers (no MPI)": lambda: one_node(args.iters),
        "platoon, 2 nodes x 1 worker": lambda: run(
            [mpiexec, "-n", "2", sys.executable, "-m", "platoon.mpi", "--workers", "1", "--",
             HERE, "--worker"] + iters, env),
        "platoon, 2 nodes x 2 workers": lambda: run(
            [mpiexec, "-n", "2", sys.executable, "-m", "platoon.mpi", "--workers", "2", "--",
             HERE, "--worker"] + iters, env),
    }
    names = list(setups)
    runs = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(setups[name]())
    rows = {name: {label: statistics.median(run_[label] for run_ in runs[name])
                   for label in SIZES} for name in names}
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    nbytes = 4 * SIZES["1M floats"]
    print("%-40s %14s %14s %12s" % ("all_reduce (float32 sum)", "1 float", "1M floats",
                                    "1M: GB/s"))
    for name, r in rows.items():
        print("%-40s %11.1f us %11.2f ms %12.2f" % (name, r["1 float"] * 1e6,
                                                    r["1M floats"] * 1e3,
                                                    nbytes / r["1M floats"] / 1e9))


if __name__ == "__main__":
    main()
