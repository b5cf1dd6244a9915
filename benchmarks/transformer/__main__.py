"""`python -m benchmarks.transformer`: tune (--tune), measure, report (see the package)."""

import argparse
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import time

from ..language_model.__main__ import _tuned, tune
from ..record import cpu_model, git_commit
from ..time_to_accuracy.harness import prewarm
from ..time_to_accuracy.tuning import tune_and_measure
from . import __doc__ as PACKAGE_DOC
from .methods import FULL, methods

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
STRAGGLER = ("ddp", "platoon_easgd", "platoon_easgd_every2")


def markdown(report):
    """The measured table: per method its lr, runs that reached the target, median time and
    steps (per process) to it, and both as ratios to DDP's; then the straggler runs."""
    meta, measured = report["meta"], report["measured"]
    lines = ["| method | lr | reached | time to target | steps | vs DDP time | steps/s |",
             "|---|---|---|---|---|---|---|"]
    summary = measured["summary"]
    ddp = (summary.get("ddp") or {}).get("measure", {}).get("time_s")
    for name, row in summary.items():
        m = row.get("measure", {})
        t = m.get("time_s")
        point = measured["chosen"][name]
        lines.append("| %s | %s | %s/%s | %s | %s | %s | %s |" % (
            name, "%g" % point["lr"] + "".join(", %s %s" % (k.replace("_", " "), v)
                                              for k, v in point.items() if k != "lr"),
            m.get("reached"), m.get("runs"),
            "%.1f s" % t if t else "-", "%.0f" % m["steps"] if m.get("steps") else "-",
            "%.2fx" % (t / ddp) if t and ddp else "-",
            "%.1f" % m["steps_per_s"] if m.get("steps_per_s") else "-"))
    straggler = report.get("straggler")
    if straggler:
        lines += ["", "With one process slowed 2x:", "",
                  "| method | reached | time to target | steps (rank 0) | vs DDP time |",
                  "|---|---|---|---|---|"]
        rows = straggler["summary"]
        ddp_slow = (rows.get("ddp") or {}).get("straggler", {}).get("time_s")
        for name, row in rows.items():
            m = row.get("straggler", {})
            t = m.get("time_s")
            lines.append("| %s | %s/%s | %s | %s | %s |" % (
                name, m.get("reached"), m.get("runs"), "%.1f s" % t if t else "-",
                "%.0f" % m["steps"] if m.get("steps") else "-",
                "%.2fx" % (t / ddp_slow) if t and ddp_slow else "-"))
    loads = [r["load_before"] for part in (measured, straggler or {}) for r in part.get("runs", [])
             if "load_before" in r]
    if loads:
        lines += ["", "Load average (1 minute) as each run started: %.1f-%.1f, median %.1f "
                  "(2 cores; a run's own processes count in the next run's figure)."
                  % (min(loads), max(loads), sorted(loads)[len(loads) // 2])]
    lines += ["", "Target %.2f bits per byte; commit %s, %s, %s, torch %s, load %.1f -> %.1f, "
              "%d repetition(s), %.0f s in all." % (
                  report["problem"]["target"], meta["commit"], meta["date"], meta["cpu"],
                  meta["torch"], meta["load_start"], meta["load_end"], meta["reps"],
                  meta["seconds"])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transformer",
                                     description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--tune", action="store_true",
                        help="only tune every method's lr on its grid (seed 0) and record it")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods to measure or tune (default: all)")
    parser.add_argument("--reps", type=int, default=3, help="measured seeds per method")
    parser.add_argument("--straggler-reps", type=int, default=None,
                        help="seeds of each 2x-straggler run (default: --reps)")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="seconds a run may train before it stops short of the target")
    parser.add_argument("--target", type=float, default=None, help="bits per byte")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="steps between evaluations (default 100; a short smoke run: fewer)")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    args = parser.parse_args(argv)
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    problem = FULL
    if args.cap_s is not None:
        problem = dataclasses.replace(problem, cap_s=args.cap_s)
    if args.target is not None:
        problem = dataclasses.replace(problem, target=args.target)
    if args.eval_every is not None:
        problem = dataclasses.replace(problem, eval_every=args.eval_every)
    table = methods()
    picked = [n for n in args.methods.split(",") if n] if args.methods else list(table)
    if set(picked) - set(table):
        parser.error("unknown method(s) %s; choose from %s" % (
            ", ".join(sorted(set(picked) - set(table))), ", ".join(table)))
    table = {n: table[n] for n in table if n in picked}
    if "torchft_diloco" in table and importlib.util.find_spec("torchft") is None:
        del table["torchft_diloco"]
        log("skipped torchft_diloco: torchft is not installed (pip install torchft==0.2.0)")
    ctx = multiprocessing.get_context("fork")
    import torch
    prewarm()
    started = time.monotonic()
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": os.getloadavg()[0],
            "torch": torch.__version__}
    tuning_path = os.path.join(args.out, "transformer_tuning.json")
    if args.tune:
        tune(ctx, problem, table, tuning_path, meta, started, log)
        return
    chosen, tuning = _tuned(tuning_path, table, log)
    fixed = {n: (world, dict(f), [chosen[n]]) for n, (world, f, _) in table.items()}
    measured = tune_and_measure(ctx, problem, fixed, False, args.reps, 0, log)
    slow = {n: v for n, v in fixed.items() if n in STRAGGLER}
    straggler_reps = args.reps if args.straggler_reps is None else args.straggler_reps
    straggler = (tune_and_measure(ctx, problem, slow, False, 0, straggler_reps, log)
                 if slow and straggler_reps else None)
    meta.update(load_end=os.getloadavg()[0], seconds=time.monotonic() - started,
                reps=args.reps, straggler_reps=straggler_reps)
    report = {"meta": meta, "problem": dataclasses.asdict(problem), "corpus": problem.corpus,
              "tuning": tuning, "measured": measured, "straggler": straggler}
    text = markdown(report)
    print()
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "transformer.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "transformer.md"), "w") as f:
        f.write("# Transformer (AdamW): time to target\n\nWritten by `python -m "
                "benchmarks.transformer`.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
