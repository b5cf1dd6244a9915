"""Training with platoon on the digits MLP: scaling (Normal | 1 worker | 2 workers) and
time to a target test accuracy, each process single-threaded.

Times run from a common start (after start-up, data loading and, for platoon,
registration and a barrier) to the last worker's end; process start-up is
left out of every column alike.
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


def _run_job(mode, data, workers, steps, target, seed):
    """Run one job; returns (wall seconds to the end or to the target, best accuracy,
    CPU seconds of the slowest process)."""
    with Children() as children:
        if mode == "normal":  # one process, or several independent ones (no platoon)
            procs = [children.start("train", "normal", "-", data, k, workers, steps, target,
                                    seed) for k in range(workers)]
        else:
            ctl = children.start("train_controller", workers)
            address = ctl.line("ADDR")[0]
            procs = [children.start("train", "platoon", address, data, k, workers, steps,
                                    target, seed) for k in range(workers)]
        results = [[float(v) for v in p.line("RESULT", timeout=240)] for p in procs]
        for p in procs:
            p.wait(30)
        if mode != "normal":
            ctl.wait(30)
    start = min(r[0] for r in results)
    if target:
        reached = [r[2] for r in results if r[2] > 0]
        end = min(reached) if reached else float("nan")
    else:
        end = max(r[1] for r in results)
    return end - start, max(r[3] for r in results), max(r[4] for r in results)


def scaling(data, steps):
    """Wall time of `steps` minibatches in all: plain SGD, platoon with 1 and 2 workers, and
    two independent plain processes (the most two processes get from this machine)."""
    rows = {}
    for name, mode, workers in (("normal", "normal", 1), ("1 worker", "platoon", 1),
                                ("2 workers", "platoon", 2),
                                ("2 independent processes", "normal", 2)):
        wall, acc, cpu = _run_job(mode, data, workers, steps // workers, 0.0, 0)
        rows[name] = {"seconds": wall, "accuracy": acc, "cpu_seconds": cpu}
    base = rows["normal"]["seconds"]
    for row in rows.values():
        row["speedup"] = base / row["seconds"]
    return rows


def time_to_accuracy(data, target, seeds, max_steps):
    """Median seconds until the test accuracy reaches `target`: SGD vs 2-worker EASGD."""
    out = {}
    for name, mode, workers in (("sgd", "normal", 1), ("easgd_2", "platoon", 2)):
        times = [_run_job(mode, data, workers, max_steps, target, seed)[0] for seed in seeds]
        out[name] = {"seconds": float(np.median(times)), "runs": times}
    out["speedup"] = out["sgd"]["seconds"] / out["easgd_2"]["seconds"]
    out["target"] = target
    return out


# -- children --

def train_controller(workers):
    from platoon import Controller

    class Stopper(Controller):
        stop = False

        def handle_control(self, req, worker_id, req_info):
            if req == "reached":
                self.stop = True
            return "stop" if self.stop else "train"

    with Stopper(control_port=0, num_workers=int(workers), transport="ipc") as ctl:
        print("ADDR %s" % ctl.control_address, flush=True)
        ctl.serve(timeout_s=300)


def train(mode, address, data, worker_id, workers, steps, target, seed):
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
        worker.barrier()
    mlp.sgd_step([p.copy() for p in params], xtr[:BATCH], ytr[:BATCH], LR)  # warm up
    reached, best = 0.0, 0.0
    cpu_start = time.process_time()
    start = time.monotonic()
    for step in range(1, steps + 1):
        idx = rng.integers(0, len(xtr), BATCH)
        mlp.sgd_step(params, xtr[idx], ytr[idx], LR)
        if step % SYNC_EVERY:
            continue
        if worker is not None:
            worker.sync_params()
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
        if worker is not None and worker.send_req("next") == "stop":
            break
    end = time.monotonic()
    cpu = time.process_time() - cpu_start
    if not target:
        best = mlp.accuracy(params, xte, yte)
    print("RESULT %.6f %.6f %.6f %.4f %.6f" % (start, end, reached, best, cpu), flush=True)
    if worker is not None:
        worker.close()
