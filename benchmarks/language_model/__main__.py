"""`python -m benchmarks.language_model`: tune (--tune), measure, report (see the package)."""

import argparse
import dataclasses
import json
import multiprocessing
import os
import time

from ..record import cpu_model, git_commit
from ..time_to_accuracy.harness import prewarm
from ..time_to_accuracy.tuning import tune_and_measure
from . import __doc__ as PACKAGE_DOC
from .methods import FULL, MEASURED, QUICK, methods
from .report import COMMAND, RESULTS, fastest, markdown, stem, write


def _tuned(path, table, log):
    """Each method's recorded lr (the grid's middle value where none is recorded), and what
    the record says of the tuning (its grids, date, load)."""
    record = {"chosen": {}, "grids": {}}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    else:
        log("no recorded tuning in %s: every method takes its grid's middle value" % path)
    chosen = {n: record["chosen"].get(n, grid[len(grid) // 2])
              for n, (_, _, grid) in table.items()}
    # every tuning run, short: what each grid value reached on seed 0
    runs = [{"method": r["method"], "lr": r["cfg"]["lr"], "reached": r.get("reached"),
             "cap_s": r["cap_s"], "error": "error" in r} for r in record.get("runs", [])]
    about = {"grids": record["grids"], "chosen": record["chosen"], "runs": runs,
             "meta": record.get("meta")}
    return chosen, about


def choose_by_steps(runs, table):
    """Each method's grid point (its lr, and whatever else its grid varies) with the fewest
    steps to target over its tuning runs (then the shortest time; if none reached it, the
    grid's middle value). Steps, not seconds: the
    time per step does not depend on the lr, and on a shared machine the seconds carry the
    load of the moment."""
    chosen = {}
    for name, (_, _, grid) in table.items():
        hit = [r for r in runs if r["method"] == name and r.get("reached")]
        best = min(hit, key=lambda r: (r["reached"][1], r["reached"][0]), default=None)
        keys = {k for point in grid for k in point} or {"lr"}
        chosen[name] = ({k: best["cfg"][k] for k in sorted(keys) if k in best["cfg"]} if best
                        else grid[len(grid) // 2])
    return chosen


def tune(ctx, problem, table, path, meta, started, log):
    """Tune every method of `table` on its grid and record it in `path`, keeping what the
    record already holds: grid values already run there (seed 0) are not run again, so a
    grid can be extended, or a method added, without rerunning the rest."""
    previous = {"chosen": {}, "grids": {}, "runs": []}
    if os.path.exists(path):
        with open(path) as f:
            previous = json.load(f)
    def done(name, point):
        return any(r["method"] == name and all(r["cfg"].get(k) == v for k, v in point.items())
                   for r in previous["runs"])
    todo = {n: (world, fixed, [g for g in grid if not done(n, g)])
            for n, (world, fixed, grid) in table.items()}
    todo = {n: v for n, v in todo.items() if v[2]}
    result = (tune_and_measure(ctx, problem, todo, True, 0, 0, log) if todo
              else {"runs": []})
    runs = previous["runs"] + result["runs"]
    meta.update(load_end=os.getloadavg()[0], seconds=time.monotonic() - started)
    grids = dict(previous["grids"])
    for name, (_, _, grid) in table.items():
        old = [g for g in grids.get(name, []) if g not in grid]
        grids[name] = sorted(old + grid, key=lambda g: sorted(g.items()))
    earlier = previous.get("earlier_meta", []) + ([previous["meta"]] if "meta" in previous
                                                  else [])
    record = {"meta": meta, "earlier_meta": earlier,
              "corpus": getattr(problem, "corpus", previous.get("corpus")),
              "chosen": dict(previous["chosen"], **choose_by_steps(runs, table)),
              "grids": grids, "runs": runs}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    for name in table:
        log("%s: lr %g" % (name, record["chosen"][name]["lr"]))


def main(argv=None):
    parser = argparse.ArgumentParser(prog=COMMAND, description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small model to an early target, 1 repetition (smoke test)")
    parser.add_argument("--tune", action="store_true",
                        help="only tune every method's lr on its grid (seed 0) and record it")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods to measure or tune (default: all)")
    parser.add_argument("--reps", type=int, default=None,
                        help="measured repetitions (seeds) per method (default 3; --quick 1)")
    parser.add_argument("--straggler", default="fastest",
                        help="methods run with a 2x straggler: comma-separated patterns, "
                        "'fastest' (the faster DDP and platoon's fastest rule) or '' (none)")
    parser.add_argument("--straggler-reps", type=int, default=None,
                        help="seeds of each straggler run (default 3; --quick 1)")
    parser.add_argument("--faults", default="all", help="'all' or 'none': the kill-halfway runs")
    parser.add_argument("--fault-reps", type=int, default=None,
                        help="seeds of each kill-halfway case (default 3; --quick 1)")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="seconds a run may train before it stops short of the target "
                             "(default: the problem's)")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the .md and the docs page from the JSON")
    args = parser.parse_args(argv)
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    if args.render:
        with open(os.path.join(args.out, stem(args.quick) + ".json")) as f:
            report = json.load(f)
        write(report, args.quick, args.out)
        print(markdown(report))
        return
    problem = QUICK if args.quick else FULL
    if args.cap_s is not None:
        problem = dataclasses.replace(problem, cap_s=args.cap_s)
    table = methods()
    picked = ([n for n in args.methods.split(",") if n] if args.methods is not None
              else list(table) if args.tune else MEASURED)
    if set(picked) - set(table):
        parser.error("unknown method(s) %s; choose from %s" % (
            ", ".join(sorted(set(picked) - set(table))), ", ".join(table)))
    table = {n: table[n] for n in table if n in picked}
    ctx = multiprocessing.get_context("fork")  # children inherit torch, already imported
    import torch
    prewarm()
    started, load_start = time.monotonic(), os.getloadavg()[0]
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": load_start,
            "quick": args.quick, "torch": torch.__version__}
    tuning_path = os.path.join(args.out, stem(args.quick, "tuning") + ".json")
    if args.tune:
        tune(ctx, problem, table, tuning_path, meta, started, log)
        return
    chosen, tuning = _tuned(tuning_path, table, log)
    fixed = {n: (world, dict(f), [chosen[n]]) for n, (world, f, _) in table.items()}
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    measured = tune_and_measure(ctx, problem, fixed, False, reps, 0, log)
    patterns = args.straggler
    if patterns == "fastest":
        patterns = ",".join(fastest(measured["summary"], p) or "" for p in ("ddp", "platoon_"))
    slow = _matching(patterns, fixed)
    straggler_reps = args.straggler_reps if args.straggler_reps is not None else reps
    phases = {"methods_s": time.monotonic() - started}
    straggler = (tune_and_measure(ctx, problem, slow, False, 0, straggler_reps, log)
                 if slow and straggler_reps else None)
    phases["straggler_s"] = time.monotonic() - started - phases["methods_s"]
    faults = None
    if args.faults == "all":
        from .faults import run_faults
        fault_reps = args.fault_reps if args.fault_reps is not None else reps
        faults = run_faults(problem, chosen, measured, log,
                            seeds=tuple(range(1, fault_reps + 1)))
        phases["faults_s"] = time.monotonic() - started - sum(phases.values())
    meta.update(load_end=os.getloadavg()[0], seconds=time.monotonic() - started, reps=reps,
                straggler_reps=straggler_reps, phases=phases)
    report = {"meta": meta, "corpus": problem.corpus, "tuning": tuning, "measured": measured,
              "straggler": straggler, "faults": faults}
    print()
    print(markdown(report))
    write(report, args.quick, args.out)


def _matching(patterns, table):
    import fnmatch
    pats = [p for p in patterns.split(",") if p]
    return {n: v for n, v in table.items()
            if v[0] > 1 and any(fnmatch.fnmatch(n, p) for p in pats)}


if __name__ == "__main__":
    main()
