"""`python -m benchmarks.hf_trainer_race`: tune (--tune), measure, report (see the package)."""

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from .._util import SINGLE_THREAD_ENV
from ..record import cpu_model, git_commit
from . import __doc__ as PACKAGE_DOC

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
SCRIPT = os.path.join(HERE, "race_trainer.py")
PROCESSES = 2  # DDP's ranks and platoon's workers
# lr grids around the transformer benchmark's best points (benchmarks/results/transformer.md:
# one process and DDP 1.2e-2, platoon's EASGD 2.4e-2). DiLoCo: first the paper's outer
# SGD(0.7, Nesterov 0.9) every 20 or 50 inner steps (every 4 diverged in the transformer
# benchmark, with torchft's); asynchronous, it reached no target here (its centre's eval loss
# swung 2.5-4.6), so then without outer momentum (outer lr 1: each push moves the centre by
# its 1/p share, an asynchronous model average) every 4 or 20, DelayedNesterov (the
# momentum once per p pushes: synchronous DiLoCo's step) every 20, and less outer momentum
# or a smaller outer lr every 20, or the paper's settings every 4.
GRID = [{"lr": 6e-3}, {"lr": 1.2e-2}, {"lr": 2.4e-2}]
HIGHER = [{"lr": 1.2e-2}, {"lr": 2.4e-2}, {"lr": 4.8e-2}]
AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0}
DILOCO = [dict(g, sync_every=k) for k in (20, 50) for g in GRID] + [
    dict(AVERAGE, lr=1.2e-2, sync_every=4), dict(AVERAGE, lr=2.4e-2, sync_every=4),
    dict(AVERAGE, lr=1.2e-2, sync_every=20), {"lr": 1.2e-2, "sync_every": 20,
                                              "delayed_nesterov": 1},
    {"lr": 1.2e-2, "sync_every": 20, "outer_lr": 0.7, "outer_momentum": 0.5},
    {"lr": 1.2e-2, "sync_every": 20, "outer_lr": 0.35, "outer_momentum": 0.9},
    {"lr": 1.2e-2, "sync_every": 4, "outer_lr": 0.7, "outer_momentum": 0.9}]
METHODS = {"single": GRID, "ddp": GRID, "platoon_easgd": HIGHER, "platoon_diloco": DILOCO}
STRAGGLER = ("ddp", "platoon_easgd", "platoon_diloco")
# The target eval loss (nats per byte; 1.6 is 2.31 bits per byte). Checked once (2026-11-28,
# not a timing: the machine was loaded, 1-minute load 7): one process at lr 1.2e-2 evaluated
# 2.41 at step 100, 1.97 at 600, 1.77 at 1,000 and 1.586 at 1,800, its first point under the
# target, after 141 s of training (about 0.06 s a step unloaded: well over a minute).
TARGET = 1.6
QUICK = {"target": 10.0, "eval_every": 2, "horizon": 40, "cap_s": 30.0}


def command(method, settings, out_dir, seed, slow_rank, problem):
    """The argv that runs `method` once: one process, torchrun's DDP, or a platoon job."""
    args = [out_dir, "--method", method, "--seed", str(seed), "--slow-rank", str(slow_rank)]
    for key in ("target", "eval_every", "horizon", "cap_s"):
        args += ["--" + key.replace("_", "-"), str(problem[key])]
    for key, value in sorted(settings.items()):
        args += ["--" + key.replace("_", "-"), str(value)]
    if problem.get("quick"):
        args.append("--quick")
    if method == "single":
        return [sys.executable, SCRIPT] + args
    if method == "ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(PROCESSES), SCRIPT] + args
    return [sys.executable, "-m", "platoon.launch.cli", "-n", str(PROCESSES), "--log-dir",
            os.path.join(out_dir, "platoon-logs"), SCRIPT, "--"] + args


def _run(cmd, cwd, env, timeout_s):
    """`cmd` in its own session; past `timeout_s` its whole group is stopped (SIGTERM, then
    SIGKILL 10 s later)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        out += "\n(stopped after %.0f s)" % timeout_s
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def run_once(method, settings, seed, slow_rank, problem, log):
    """Run `method` once; its ranks' records, when it reached the target (the first rank to
    see it: platoon's centre is the job's), the load as it started."""
    out_dir = tempfile.mkdtemp(prefix="hf-race-")
    cmd = command(method, settings, out_dir, seed, slow_rank, problem)
    load, began = os.getloadavg()[0], time.monotonic()
    env = dict(os.environ, PYTHONPATH=ROOT, **SINGLE_THREAD_ENV)
    try:
        done = _run(cmd, out_dir, env, problem["cap_s"] * 2 + 300)
        ranks = []
        for path in sorted(glob.glob(os.path.join(out_dir, "rank*.json"))):
            with open(path) as f:
                ranks.append(json.load(f))
        result = {"method": method, "settings": settings, "seed": seed, "slow_rank": slow_rank,
                  "load_before": round(load, 2), "wall_s": round(time.monotonic() - began, 1),
                  "returncode": done.returncode, "ranks": ranks}
        if done.returncode != 0 or not ranks:
            result["error"] = (done.stdout + done.stderr)[-3000:]
        reached = [r["reached"] for r in ranks if r.get("reached")]
        result["reached"] = min(reached) if reached else None
        result["steps"] = max((r["steps"] for r in ranks), default=0)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    log("%s %s seed %d%s: %s (load %.1f)" % (
        method, settings, seed, ", rank %d slowed 2x" % slow_rank if slow_rank >= 0 else "",
        "target at %.1f s, step %d" % tuple(result["reached"]) if result["reached"]
        else "error" if "error" in result else "target not reached", load))
    return result


def _median(values):
    return float(statistics.median(values)) if values else None


def summarise(runs):
    """Per method and phase: runs, reached, median time and steps to the target."""
    out = {}
    for r in runs:
        phase = "straggler" if r["slow_rank"] >= 0 else "measure"
        row = out.setdefault(r["method"], {}).setdefault(phase, {"runs": 0, "reached": 0,
                                                                 "times": [], "steps": []})
        row["runs"] += 1
        if r["reached"]:
            row["reached"] += 1
            row["times"].append(r["reached"][0])
            row["steps"].append(r["reached"][1])
    for phases in out.values():
        for row in phases.values():
            row["time_s"], row["steps"] = _median(row.pop("times")), _median(row["steps"])
    return out


def markdown(report):
    """The table per method (ratios to one process and to DDP), the straggler table, then
    every run with the load as it started."""
    summary, chosen = report["summary"], report["chosen"]
    ddp = (summary.get("ddp", {}).get("measure") or {}).get("time_s")
    single = (summary.get("single", {}).get("measure") or {}).get("time_s")
    lines = ["| method | settings | reached | time to target | steps (per process) | "
             "vs one process | vs DDP |", "|---|---|---|---|---|---|---|"]
    for name, phases in summary.items():
        m = phases.get("measure")
        if not m:
            continue
        t = m["time_s"]
        lines.append("| %s | %s | %d/%d | %s | %s | %s | %s |" % (
            name, ", ".join("%s %g" % (k.replace("_", " "), v) for k, v in
                            sorted(chosen[name].items())), m["reached"], m["runs"],
            "%.1f s" % t if t else "-", "%.0f" % m["steps"] if m["steps"] else "-",
            "%.2fx" % (t / single) if t and single else "-",
            "%.2fx" % (t / ddp) if t and ddp else "-"))
    slow = {n: p["straggler"] for n, p in summary.items() if "straggler" in p}
    if slow:
        ddp_slow = (slow.get("ddp") or {}).get("time_s")
        lines += ["", "With one process slowed 2x:", "",
                  "| method | reached | time to target | steps | vs DDP slowed |",
                  "|---|---|---|---|---|"]
        for name, m in slow.items():
            t = m["time_s"]
            lines.append("| %s | %d/%d | %s | %s | %s |" % (
                name, m["reached"], m["runs"], "%.1f s" % t if t else "-",
                "%.0f" % m["steps"] if m["steps"] else "-",
                "%.2fx" % (t / ddp_slow) if t and ddp_slow else "-"))
    lines += ["", "Every run (load: the 1-minute load average as it started, 2 cores):", "",
              "| method | seed | slowed | load | time to target | steps |",
              "|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append("| %s | %d | %s | %.1f | %s | %s |" % (
            r["method"], r["seed"], "rank %d" % r["slow_rank"] if r["slow_rank"] >= 0 else "-",
            r["load_before"], "%.1f s" % r["reached"][0] if r["reached"] else
            ("error" if "error" in r else "not reached"),
            r["reached"][1] if r["reached"] else r["steps"]))
    meta = report["meta"]
    lines += ["", "Target eval loss %g (nats per byte); lr %s; commit %s, %s, %s, %d "
              "repetition(s), %.0f s in all." % (
                  report["problem"]["target"], "tuned (--tune)" if report["problem"].get(
                      "lr_tuned") else "each grid's middle, NOT tuned", meta["commit"],
                  meta["date"], meta["cpu"], meta["reps"], meta["seconds"])]
    return "\n".join(lines)


def crossing_step(run, target):
    """The step at which `run` crossed `target`, interpolated between the two evaluations
    around it (evaluations come every 100 steps: two lrs often reach it at the same one);
    None if it did not. The job's: the earliest of its ranks'."""
    steps = []
    for rank in run["ranks"]:
        previous = None
        for step, _, loss in rank["trace"]:
            if loss <= target:
                if previous is None or previous[1] <= loss:
                    steps.append(float(step))
                else:
                    before, above = previous
                    steps.append(before + (step - before) * (above - target) / (above - loss))
                break
            previous = (step, loss)
    return min(steps) if steps else None


def best_point(runs, target):
    """Of a method's grid runs, the settings with the fewest steps to the target (by the
    interpolated crossing: by steps, not seconds, which the machine's load sways)."""
    def fewest_steps(run):
        crossed = crossing_step(run, target)
        return (crossed is None, crossed or 0.0)
    return min(runs, key=fewest_steps)["settings"]


def tune(methods, problem, path, log):
    """Every method's grid on seed 0; the point with the fewest steps to the target. Points
    already in `path` (an earlier --tune's) are kept, not run again; it is written after each
    method."""
    tuned = {}
    if os.path.exists(path):
        with open(path) as f:
            tuned = json.load(f)
    for name in methods:
        done = {json.dumps(r["settings"], sort_keys=True): r
                for r in tuned.get(name, {}).get("runs", [])}
        runs = [done.get(json.dumps(point, sort_keys=True)) or
                run_once(name, point, 0, -1, problem, log) for point in METHODS[name]]
        tuned[name] = {"chosen": best_point(runs, problem["target"]), "runs": runs}
        with open(path, "w") as f:
            json.dump(tuned, f, indent=1)
    return tuned


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_trainer_race",
                                     description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--tune", action="store_true",
                        help="only tune every method's lr on its grid (seed 0) and record it")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated methods (default: all)")
    parser.add_argument("--reps", type=int, default=3, help="measured seeds per method")
    parser.add_argument("--straggler-reps", type=int, default=None,
                        help="seeds of each 2x-straggler run (default: --reps)")
    parser.add_argument("--target", type=float, default=None, help="eval loss, nats per byte")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="seconds of training after which a run stops short of the target")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model, a few steps, an easy target: the harness only")
    parser.add_argument("--render", action="store_true",
                        help="only write the .md again from the recorded .json and tuning "
                             "(after a grid was extended)")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    args = parser.parse_args(argv)
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    picked = [n for n in args.methods.split(",") if n]
    if set(picked) - set(METHODS):
        parser.error("unknown method(s) %s; choose from %s" % (
            ", ".join(sorted(set(picked) - set(METHODS))), ", ".join(METHODS)))
    problem = dict(QUICK, quick=True) if args.quick else \
        {"target": TARGET, "eval_every": 100, "horizon": 3200, "cap_s": 600.0}
    for key in ("target", "cap_s"):
        if getattr(args, key) is not None:
            problem[key] = getattr(args, key)
    os.makedirs(args.out, exist_ok=True)
    tuning_path = os.path.join(args.out, "hf_trainer_race_tuning.json")
    started = time.monotonic()
    if args.tune:
        tune(picked, problem, tuning_path, log)
        return
    if args.render:
        with open(os.path.join(args.out, "hf_trainer_race.json")) as f:
            report = json.load(f)
        with open(tuning_path) as f:
            write_markdown(args.out, report, json.load(f), echo=True)
        return
    chosen = {n: METHODS[n][len(METHODS[n]) // 2] for n in picked}  # the grid's middle
    tuning = {}
    if os.path.exists(tuning_path):
        with open(tuning_path) as f:
            tuning = json.load(f)
        chosen.update({n: t["chosen"] for n, t in tuning.items() if n in chosen})
    else:
        log("no %s: each method runs its grid's middle point (run --tune first)" % tuning_path)
    problem["lr_tuned"] = os.path.exists(tuning_path)
    straggler_reps = args.reps if args.straggler_reps is None else args.straggler_reps
    plan = [(n, 1 + rep, -1) for rep in range(args.reps) for n in picked]  # methods alternate
    plan += [(n, 1 + rep, 1) for rep in range(straggler_reps) for n in picked if n in STRAGGLER]
    runs = []
    for number, (name, seed, slow_rank) in enumerate(plan, 1):
        runs.append(run_once(name, chosen[name], seed, slow_rank, problem, log))
        write_report(args.out, problem, chosen, runs, started, args.reps, straggler_reps,
                     complete=number == len(plan), echo=number == len(plan), tuning=tuning)


def best_loss(run):
    """The lowest eval loss any rank of `run` saw ("-" if none)."""
    losses = [loss for rank in run["ranks"] for _, _, loss in rank["trace"]]
    return "%.3g" % min(losses) if losses else "-"


def tuning_table(tuning, target):
    """Every grid point's steps to the target on seed 0 (the evaluation that saw it, and the
    crossing interpolated between evaluations; else its best eval loss), its seconds and the
    load as it started."""
    lines = ["| method | settings | chosen | steps to target (interpolated) | seconds | load |",
             "|---|---|---|---|---|---|"]
    for name, tuned in tuning.items():
        for run in tuned["runs"]:
            crossed = crossing_step(run, target)
            lines.append("| %s | %s | %s | %s | %s | %.1f |" % (
                name, ", ".join("%s %g" % (k.replace("_", " "), v)
                                for k, v in sorted(run["settings"].items())),
                "yes" if run["settings"] == tuned["chosen"] else "",
                "%d (%.0f)" % (run["reached"][1], crossed) if run["reached"] else
                "not reached (best %s)" % best_loss(run), "%.1f s" % run["reached"][0]
                if run["reached"] else "-",
                run["load_before"]))
    return "\n".join(lines)


def write_report(out, problem, chosen, runs, started, reps, straggler_reps, complete, echo,
                 tuning=None):
    """hf_trainer_race.{json,md} with the runs so far (after each run: a run cut short still
    leaves its record, marked incomplete)."""
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "reps": reps,
            "straggler_reps": straggler_reps, "seconds": time.monotonic() - started,
            "complete": complete}
    report = {"meta": meta, "problem": problem, "chosen": chosen, "runs": runs,
              "summary": summarise(runs)}
    with open(os.path.join(out, "hf_trainer_race.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_markdown(out, report, tuning, echo)


def write_markdown(out, report, tuning, echo=False):
    """hf_trainer_race.md from `report` (the .json's), with the tuning table of `tuning`."""
    text = markdown(report)
    if tuning:
        text += ("\n\nThe lr tuning (`--tune`: each grid on seed 0, the fewest steps to the "
                 "target chosen, by the interpolated crossing):\n\n"
                 + tuning_table(tuning, report["problem"]["target"]))
    if not report["meta"]["complete"]:
        text += "\n\nINCOMPLETE: %d run(s) so far." % len(report["runs"])
    if echo:
        print()
        print(text)
    with open(os.path.join(out, "hf_trainer_race.md"), "w") as f:
        f.write("# The Hugging Face Trainer race: time to target\n\nWritten by `python -m "
                "benchmarks.hf_trainer_race`.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
