"""Training with platoon on the digits MLP: scaling (Normal | 1 worker | 2 workers | 2
independent processes) and time to a target test accuracy, each process single-threaded.

Every process of a job loads its data, warms up and (for platoon) shares its
parameters, then says READY and waits; the parent starts all of them at once
with a "go" line. Times run from the earliest start to the last worker's end,
so process start-up, imports and registration are outside every column alike.
The columns are measured in alternation, round after round, so that load from
elsewhere hits them alike; each column's figure is its best round.
"""

import time

import numpy as np

from . import mlp
from ._util import Children

SIZES = (64, 1024, 1024, 10)
BATCH = 64
LR = 0.2  # near the best for plain SGD here as for EASGD
SYNC_EVERY = 10
TARGET_ACCURACY = 0.98
COLUMNS = (("normal", "normal", 1), ("1 worker", "platoon", 1), ("2 workers", "platoon", 2),
           ("2 independent processes", "normal", 2))
FIELDS = ("start", "end", "reached", "accuracy", "cpu", "sync", "request", "lock_wait")


class _Job:
    """The processes of one column, started once; `run()` times one round of them."""

    def __init__(self, children, mode, data, workers, steps, target, seed):
        self.procs = []
        address = "-"
        if mode == "platoon":
            ctl = children.start("train_controller", workers)
            address = ctl.line("ADDR")[0]
            self.controller = ctl
        else:
            self.controller = None
        self.procs = [children.start("train", mode, address, data, k, workers, steps, target,
                                     seed) for k in range(workers)]
        self.target = target

    def ready(self):
        for p in self.procs:
            p.line("READY", timeout=120)

    def run(self):
        """One round, from a common go to the last end: a dict of the measured figures."""
        for p in self.procs:
            p.send("go")
        results = [dict(zip(FIELDS, (float(v) for v in p.line("RESULT", timeout=240))))
                   for p in self.procs]
        start = min(r["start"] for r in results)
        if self.target:
            reached = [r["reached"] for r in results if r["reached"] > 0]
            end = min(reached) if reached else float("nan")
        else:
            end = max(r["end"] for r in results)
        slowest = max(results, key=lambda r: r["end"])
        return {"seconds": end - start, "accuracy": max(r["accuracy"] for r in results),
                "cpu_seconds": max(r["cpu"] for r in results),
                "sync_seconds": slowest["sync"], "request_seconds": slowest["request"],
                "lock_wait_seconds": slowest["lock_wait"],
                "start_spread_seconds": max(r["start"] for r in results) - start,
                "end_spread_seconds": max(r["end"] for r in results) - min(
                    r["end"] for r in results)}

    def finish(self):
        for p in self.procs:
            p.wait(30)
        if self.controller is not None:
            self.controller.wait(30)


def scaling(data, steps, rounds):
    """Wall time of `steps` minibatches in all: plain SGD, platoon with 1 and 2 workers, and
    two independent plain processes (the most two processes get from this machine).

    The four jobs are started once and run `rounds` rounds in alternation (the order
    rotating each round); each column keeps its best round by wall time, with that
    round's other figures. Returns {"rows": {column: figures}, "runs": {column: [seconds
    of every round]}}.
    """
    with Children() as children:
        jobs = {name: _Job(children, mode, data, workers, steps // workers, 0.0, 0)
                for name, mode, workers in COLUMNS}
        for job in jobs.values():
            job.ready()
        names = [name for name, _, _ in COLUMNS]
        runs = {name: [] for name in names}
        best = {}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                row = jobs[name].run()
                runs[name].append(row["seconds"])
                if name not in best or row["seconds"] < best[name]["seconds"]:
                    best[name] = row
        for job in jobs.values():
            job.finish()
    base = best["normal"]["seconds"]
    for row in best.values():
        row["speedup"] = base / row["seconds"]
    return {"rows": best, "runs": runs}


def _run_once(mode, data, workers, steps, target, seed):
    with Children() as children:
        job = _Job(children, mode, data, workers, steps, target, seed)
        job.ready()
        row = job.run()
        job.finish()
    return row["seconds"]


def time_to_accuracy(data, target, seeds, max_steps):
    """Median seconds until the test accuracy reaches `target`: SGD vs 2-worker EASGD,
    alternating the two for each seed (and which goes first)."""
    times = {"sgd": [], "easgd_2": []}
    methods = [("sgd", "normal", 1), ("easgd_2", "platoon", 2)]
    for i, seed in enumerate(seeds):
        for name, mode, workers in (methods if i % 2 == 0 else methods[::-1]):
            times[name].append(_run_once(mode, data, workers, max_steps, target, seed))
    out = {name: {"seconds": float(np.median(t)), "runs": t} for name, t in times.items()}
    out["speedup"] = out["sgd"]["seconds"] / out["easgd_2"]["seconds"]
    out["target"] = target
    return out


# -- children --

def stopping_controller(**kwargs):
    """A Controller answering "train" to every request until one worker says "reached",
    then "stop"."""
    from platoon import Controller

    class Stopper(Controller):
        stop = False

        def handle_control(self, req, worker_id, req_info):
            if req == "reached":
                self.stop = True
            return "stop" if self.stop else "train"

    return Stopper(**kwargs)


def train_controller(workers):
    with stopping_controller(control_port=0, num_workers=int(workers), transport="ipc") as ctl:
        print("ADDR %s" % ctl.control_address, flush=True)
        ctl.serve()  # until the workers are done: they end when the parent closes stdin


def train(mode, address, data, worker_id, workers, steps, target, seed):
    """Child: after READY, train `steps` minibatches for each "go" line on stdin (going on
    from where the last round stopped) and print RESULT with the figures in FIELDS."""
    import sys
    worker_id, workers, steps, seed = int(worker_id), int(workers), int(steps), int(seed)
    target = float(target)
    xtr, ytr, xte, yte = mlp.load_digits_split(data)
    xtr, ytr = xtr[worker_id::workers], ytr[worker_id::workers]
    params = mlp.init_params(SIZES, seed)
    rng = np.random.default_rng(1000 * seed + worker_id)
    worker = None
    if mode == "platoon":
        from platoon import EASGD, Worker
        worker = Worker(address, timeout_s=120)
        worker.init_shared_params(params, EASGD(0.9 / workers))
    mlp.sgd_step([p.copy() for p in params], xtr[:BATCH], ytr[:BATCH], LR)  # warm up
    clock = time.perf_counter
    print("READY", flush=True)
    while sys.stdin.readline():
        reached, best = 0.0, 0.0
        sync_s = request_s = 0.0
        wait_before = worker.sync_stats.lock_wait_s if worker is not None else 0.0
        cpu_start = time.process_time()
        start = time.monotonic()
        for step in range(1, steps + 1):
            idx = rng.integers(0, len(xtr), BATCH)
            mlp.sgd_step(params, xtr[idx], ytr[idx], LR)
            if step % SYNC_EVERY:
                continue
            if worker is not None:
                t = clock()
                worker.sync_params()
                sync_s += clock() - t
            if target and (worker is None or worker.worker_id == 0):
                if worker is None:
                    model = params
                else:  # the centre, copied under its lock so no sync is half-way
                    worker.lock(timeout_s=60)
                    model = [c.copy() for c in worker.shared_params]
                    worker.unlock()
                best = max(best, mlp.accuracy(model, xte, yte))
                if best >= target:
                    reached = time.monotonic()
                    if worker is None:
                        break
                    worker.send_req("reached")
            if worker is not None:
                t = clock()
                stop = worker.send_req("next") == "stop"
                request_s += clock() - t
                if stop:
                    break
        end = time.monotonic()
        cpu = time.process_time() - cpu_start
        if not target:
            best = mlp.accuracy(params, xte, yte)
        wait = worker.sync_stats.lock_wait_s - wait_before if worker is not None else 0.0
        print("RESULT " + " ".join("%.6f" % v for v in (
            start, end, reached, best, cpu, sync_s, request_s, wait)), flush=True)
    if worker is not None:
        worker.close()
