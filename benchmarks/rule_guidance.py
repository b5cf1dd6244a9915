"""Which sync rule, and which settings, reach a target accuracy first with 2 workers?

Trains the digits MLP (benchmarks/mlp.py, 64-512-512-10, plain SGD inner steps,
lr 0.1, batch 32, each worker on its half of the training set) with 2 worker
processes under EASGD, ASGD, Downpour(SGD nesterov), DiLoCo and DelayedNesterov
over a small grid of alpha / sync period tau / outer lr, plus one plain SGD
process as the baseline. Worker 0 measures the centre's test accuracy every 8 of
its steps; a run ends when it reaches the target. Reports, per setting, the
median over seeds of worker 0's steps and of the seconds (from a barrier after
start-up) to the target, settings in alternation so load hits all alike. Steps
are the firmer measure: seconds depend on the two workers getting a core each.

usage: python -m benchmarks.rule_guidance [--seeds 3] [--first-seed 0] [--target 0.98] [--quick]
       [--json PATH]
(22 settings x 3 seeds: about 2 minutes on 2 idle cores, 3-4 under load; --quick: 1 seed,
8 settings, 25 s)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from ._util import ROOT, SINGLE_THREAD_ENV

SIZES = (64, 512, 512, 10)
BATCH = 32
INNER_LR = 0.1
EVAL_EVERY = 8
MAX_STEPS = 4000  # per worker: a setting that has not reached the target by then fails

# (label, rule, settings, sync period tau)
GRID = [("SGD, 1 process", "sgd", {}, 0)]
for _tau in (4, 16):
    GRID += [("EASGD alpha=%g" % a, "easgd", {"alpha": a}, _tau)
             for a in ((0.45, 0.25, 0.9) if _tau == 4 else (0.45, 0.9))]
    GRID += [("ASGD", "asgd", {}, _tau),
             ("Downpour(SGD(0.2, 0.9, nesterov))", "downpour", {"lr": 0.2}, _tau)]
    GRID += [("DiLoCo outer_lr=%g" % lr, "diloco", {"outer_lr": lr}, _tau)
             for lr in (0.4, 0.7, 1.0)]
    GRID += [("DelayedNesterov outer_lr=%g" % lr, "dn", {"outer_lr": lr}, _tau)
             for lr in (0.4, 0.7, 1.0)]
QUICK = {("SGD, 1 process", 0), ("EASGD alpha=0.45", 4), ("ASGD", 4),
         ("Downpour(SGD(0.2, 0.9, nesterov))", 4), ("DiLoCo outer_lr=0.7", 16),
         ("DelayedNesterov outer_lr=0.7", 16), ("DiLoCo outer_lr=1", 4),
         ("DelayedNesterov outer_lr=1", 4)}


def make_rule(kind, settings):
    import platoon
    if kind == "easgd":
        return platoon.EASGD(settings["alpha"])
    if kind == "asgd":
        return platoon.ASGD()
    if kind == "downpour":
        return platoon.Downpour(platoon.SGD(settings["lr"], momentum=0.9, nesterov=True))
    if kind == "diloco":
        return platoon.DiLoCo(settings["outer_lr"])
    if kind == "dn":
        return platoon.DelayedNesterov(settings["outer_lr"])
    raise ValueError("unknown rule %r" % kind)


# -- the worker (a child process) --

def worker_main(address, data, kind, settings, tau, seed, target):
    import numpy as np

    from . import mlp
    xtr, ytr, xte, yte = mlp.load_digits_split(data)
    params = mlp.init_params(SIZES, seed)
    worker = None
    if kind != "sgd":
        from platoon import Worker
        worker = Worker(address, timeout_s=60)
        wid, n = worker.worker_id, worker.num_workers
        xtr, ytr = xtr[wid::n], ytr[wid::n]
        worker.init_shared_params(params, make_rule(kind, settings))
        worker.barrier()
        me = wid
    else:
        me = 0
    rng = np.random.default_rng(1000 * seed + me)
    mlp.sgd_step([p.copy() for p in params], xtr[:BATCH], ytr[:BATCH], INNER_LR)  # warm up
    start = time.monotonic()
    reached, steps, best = 0.0, 0, 0.0
    for step in range(1, MAX_STEPS + 1):
        idx = rng.integers(0, len(xtr), BATCH)
        mlp.sgd_step(params, xtr[idx], ytr[idx], INNER_LR)
        steps = step
        if worker is not None and step % tau == 0:
            worker.sync_params()
            if worker.send_req("next") == "stop":
                break
        if me == 0 and step % EVAL_EVERY == 0:
            if worker is None:
                model = params
            else:  # the centre, copied under its lock so that no sync is half-way
                with worker.lock(timeout_s=60):
                    model = [c.copy() for c in worker.shared_params]
            best = max(best, mlp.accuracy(model, xte, yte))
            if best >= target:
                reached = time.monotonic() - start
                if worker is not None:
                    worker.send_req("reached")
                break
    print("RESULT %d %d %.6f %.4f" % (me, steps, reached, best), flush=True)
    if worker is not None:
        worker.close()


# -- the driver --

def run_one(kind, settings, tau, seed, target, data):
    """One run; returns (worker 0's steps, seconds to the target or None, best accuracy)."""
    from .bench_training import stopping_controller

    workers = 1 if kind == "sgd" else 2
    env = dict(os.environ, PYTHONUNBUFFERED="1", **SINGLE_THREAD_ENV)
    spec = json.dumps([kind, settings, tau, seed, target])
    ctl = serving = None
    address = "-"
    if kind != "sgd":
        ctl = stopping_controller(control_port=0, num_workers=workers, transport="ipc")
        address = ctl.control_address
        serving = threading.Thread(target=ctl.serve, kwargs={"timeout_s": 120}, daemon=True)
        serving.start()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.rule_guidance", "--child",
                               address, data, spec], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, start_new_session=True)
             for _ in range(workers)]
    try:
        results = {}
        for p in procs:
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError("worker of %s %s exited with %s:\n%s"
                                   % (kind, settings, p.returncode, out))
            for line in out.splitlines():
                if line.startswith("RESULT"):
                    me, steps, reached, best = line.split()[1:]
                    results[int(me)] = (int(steps), float(reached) or None, float(best))
        if serving is not None:
            serving.join(30)
        return results[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        if ctl is not None:
            ctl.close()


def median(values):
    values = sorted(values)
    if any(v is None for v in values):
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--quick", action="store_true", help="1 seed, a smaller grid")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        address, data, spec = args.child
        kind, settings, tau, seed, target = json.loads(spec)
        worker_main(address, data, kind, settings, tau, seed, target)
        return
    from . import mlp
    grid = [g for g in GRID if not args.quick or (g[0], g[3]) in QUICK]
    seeds = range(args.first_seed, args.first_seed + (1 if args.quick else args.seeds))
    runs = {i: [] for i in range(len(grid))}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "digits.npz")
        mlp.load_digits_split(data)
        for seed in seeds:  # settings in alternation, one seed at a time
            for i, (_label, kind, settings, tau) in enumerate(grid):
                runs[i].append(run_one(kind, settings, tau, seed, args.target, data))
    rows = []
    for i, (label, _kind, _settings, tau) in enumerate(grid):
        steps = median([r[0] if r[1] is not None else None for r in runs[i]])
        secs = median([r[1] for r in runs[i]])
        rows.append({"rule": label, "tau": tau, "steps": steps, "seconds": secs,
                     "runs": runs[i]})
    base, base_steps = rows[0]["seconds"], rows[0]["steps"]
    rows.sort(key=lambda r: (r["steps"] is None, r["steps"] or 0, r["seconds"] or 0))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print("time to %.1f%% test accuracy, digits MLP %s, inner SGD lr %g batch %d, 2 workers; "
          "median of %d seed(s); load average %s; %.0f s in all"
          % (100 * args.target, "-".join(map(str, SIZES)), INNER_LR, BATCH, len(seeds),
             " ".join(load), time.monotonic() - began))
    print("| rule | tau | steps per worker | seconds | steps vs 1 process | time vs 1 process |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["seconds"] is None:
            print("| %s | %s | not reached in %d | | | |"
                  % (r["rule"], r["tau"] or "-", MAX_STEPS))
            continue
        print("| %s | %s | %d | %.2f | %.2fx | %.2fx |" % (
            r["rule"], r["tau"] or "-", r["steps"], r["seconds"],
            r["steps"] / base_steps if base_steps else float("nan"),
            r["seconds"] / base if base else float("nan")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "load": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
