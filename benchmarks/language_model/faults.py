"""A worker SIGKILLed halfway to the target, recovered as each method's users would.

- platoon under the real launcher (`platoon-launcher benchmarks/language_model/lm`):
  `--restart 1` (a replacement worker registers and takes the centre) and `--keep-going`
  (the controller's `handle_worker_death` returns; the job goes on with one worker);
- DDP under `torchrun --max-restarts 1` (`python -m torch.distributed.run`), every process
  restarted, resuming from the checkpoint rank 0 writes at every evaluation.

Each method runs without the kill (launched the same way; for platoon one run serves both
flags, which differ only when a worker dies) and once per case with it, on each of 3 seeds,
so the ratio of the medians is the fault's cost. Worker 1 kills itself (SIGKILL) at half the
method's median steps to the target in the measured run; worker 0 (rank 0) evaluates and
keeps the clock: wall time from the barrier after start-up to the target, less its
evaluation time (for DDP the clock runs on across the restart: the restart's cost counts).
"""

import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from .._util import ROOT, SINGLE_THREAD_ENV

EXPERIMENT = os.path.join(ROOT, "benchmarks", "language_model", "lm")
DDP_SCRIPT = os.path.join(ROOT, "benchmarks", "language_model", "ddp_worker.py")


# -- inside the launched processes ----------------------------------------------------------

def read_config(argv):
    """The job's settings: the JSON file named by `--config PATH` in `argv`."""
    with open(argv[argv.index("--config") + 1]) as f:
        return json.load(f)


def problem_of(config):
    from .problem import Text
    return Text(**config["problem"])


class Progress:
    """Worker 0's (rank 0's) clock and trace, kept in a JSON-lines file so that a restarted
    process carries on with it: wall time since the first barrier, less evaluation time."""

    def __init__(self, path):
        self.path = path
        self.t0, self.eval_s = None, 0.0
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(x) for x in f if x.strip()]
            if lines:
                self.t0, self.eval_s = lines[0]["t0"], lines[-1]["eval_s"]

    def start(self):
        if self.t0 is None:
            self.t0 = time.time()

    def clock(self):
        return time.time() - self.t0 - self.eval_s

    def add(self, steps, metric, eval_s, **extra):
        clock = self.clock() - eval_s  # the clock at the evaluation's start
        self.eval_s += eval_s
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(t0=self.t0, clock_s=round(clock, 4), steps=steps,
                                    metric=round(metric, 4), eval_s=self.eval_s,
                                    pid=os.getpid(), **extra)) + "\n")
        return clock


def kill_self_once(config, steps, marker):
    """SIGKILL this process at `kill_at` steps unless an earlier incarnation already died."""
    if config.get("kill_at") and steps == config["kill_at"] and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


# -- the orchestrator -----------------------------------------------------------------------

def _env():
    return dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo",
                **SINGLE_THREAD_ENV)


def _run(cmd, workdir, timeout_s):
    with open(os.path.join(workdir, "output.log"), "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None


def _outcome(workdir, target):
    """(time to target, steps, distinct rank-0 pids) from the progress file."""
    path = os.path.join(workdir, "progress.jsonl")
    if not os.path.exists(path):
        return None, None, 0
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    pids = len({x["pid"] for x in lines})
    for x in lines:
        if x["metric"] <= target:
            return x["clock_s"], x["steps"], pids
    return None, None, pids


def one_case(method, recovery, problem, cfg, seed, kill_at, cap_s, log):
    """One job with `recovery` ("restart", "keep-going", "torchrun") and the kill at
    `kill_at` steps (0: no kill). Returns {time_s, steps, rank0_pids, rc, wall_s}."""
    workdir = tempfile.mkdtemp(prefix="lm-fault-")
    try:
        config = {"problem": dataclasses.asdict(problem), "cfg": cfg, "seed": seed,
                  "kill_at": kill_at, "cap_s": cap_s, "dir": workdir,
                  "progress": os.path.join(workdir, "progress.jsonl")}
        path = os.path.join(workdir, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        if recovery == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", "--max-restarts", "1", DDP_SCRIPT, "--config", path]
        else:
            cmd = [sys.executable, "-m", "platoon.launch.cli", EXPERIMENT, "-n", "2",
                   "--log-dir", os.path.join(workdir, "logs"), "-w", "--config " + path,
                   "--status-every-s", "60"]
            cmd += ["--restart", "1"] if recovery == "restart" else ["--keep-going"]
        wall = time.monotonic()
        rc = _run(cmd, workdir, cap_s + 120)
        wall = time.monotonic() - wall
        time_s, steps, pids = _outcome(workdir, problem.target)
        log("%s %s kill at %s: %s (rc %s, run %.1f s)" % (
            method, recovery, kill_at or "-", "%.2f s, %d steps" % (time_s, steps)
            if time_s is not None else "not reached", rc, wall))
        if time_s is None:
            with open(os.path.join(workdir, "output.log")) as f:
                log("output tail:\n" + f.read()[-3000:])
        return {"time_s": time_s, "steps": steps, "rank0_pids": pids, "rc": rc, "wall_s": wall,
                "killed": os.path.exists(os.path.join(workdir, "killed"))}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _median_time(runs):
    """The median time to target; a run that missed it counts as slower than any that
    reached it (None when the median itself missed)."""
    median = _median([r["time_s"] if r["time_s"] else float("inf") for r in runs])
    return None if median is None or median == float("inf") else median


def run_faults(problem, chosen, measured, log, seeds=(1, 2, 3)):
    """The kill-halfway cases for the fastest DDP (by measured time: plain or with
    momentum) and platoon's fastest rule, each seed once without the kill and once per case
    with it; the seeds are the outer loop, so the cases alternate. A case's ratio is its
    median time with the kill over the median without (a run that misses the target counts
    as slower than any that reaches it)."""
    from .methods import methods
    from .report import fastest
    summary = measured["summary"]
    table = methods()
    cases = []
    ddp, platoon_method = fastest(summary, "ddp"), fastest(summary, "platoon_")
    if ddp:
        cases.append((ddp, "torchrun"))
    if platoon_method:
        cases += [(platoon_method, "restart"), (platoon_method, "keep-going")]
    kill_at, cfgs = {}, {}
    for method, _ in cases:
        steps = summary.get(method, {}).get("measure", {}).get("steps")
        if not steps:
            log("%s: no measured steps to target, no fault run" % method)
            continue
        kill_at[method] = int(steps // 2)
        cfgs[method] = dict(table[method][1], **chosen[method])
    cases = [(m, r) for m, r in cases if m in kill_at]
    bases = {m: [] for m in kill_at}
    hits = {case: [] for case in cases}
    for seed in seeds:
        done = set()
        for method, recovery in cases:
            if method not in done:  # without a kill, --restart and --keep-going run alike
                done.add(method)
                bases[method].append(one_case(method, recovery, problem, cfgs[method], seed,
                                              0, measured["cap_s"], log))
            hits[(method, recovery)].append(one_case(method, recovery, problem, cfgs[method],
                                                     seed, kill_at[method], measured["cap_s"],
                                                     log))
    how = {"torchrun": "torchrun --max-restarts 1, all restarted from the last checkpoint",
           "restart": "platoon-launcher --restart 1: a replacement takes the centre",
           "keep-going": "platoon-launcher --keep-going: the survivor goes on alone"}
    rows = []
    for method, recovery in cases:
        hit, base = hits[(method, recovery)], bases[method]
        hit_s, base_s = _median_time(hit), _median_time(base)
        rows.append({"method": method, "recovery": recovery, "how": how[recovery],
                     "kill_at": kill_at[method], "time_s": hit_s, "base_s": base_s,
                     "ratio": hit_s / base_s if hit_s and base_s else None,
                     "steps": _median([r["steps"] for r in hit]),
                     "base_steps": _median([r["steps"] for r in base]),
                     "reached": sum(1 for r in hit if r["time_s"]), "runs": len(hit),
                     "others_restarted": "yes" if any(r["rank0_pids"] > 1 for r in hit)
                     else "no",
                     "per_seed": [{"seed": s, "time_s": h["time_s"], "base_s": b["time_s"]}
                                  for s, h, b in zip(seeds, hit, base)],
                     "runs_detail": {"fault": hit, "base": base}})
    note = ("With worker 1 SIGKILLed at half its method's median steps to target (seeds %s, "
            "alternating; medians; each case with the kill, each method also without, "
            "launched the same way: DDP under torchrun, platoon under platoon-launcher; see "
            "benchmarks/language_model/faults.py):" % ", ".join(map(str, seeds)))
    return {"note": note, "rows": rows, "seeds": list(seeds)}
