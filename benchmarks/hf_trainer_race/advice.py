"""Why the lr advice transfers or not (issue 47): the Trainer race's GPT-2 for a short horizon,
every run to the schedule's end, one after another, each with the load as it started.

usage: python -m benchmarks.hf_trainer_race.advice [--plan NAME] [--seeds 1,2] [--out PATH]
                                                   [--prior PATHS] [--report [--only PLANS]
                                                   [--targets LOSSES] [--versus PLAN]
                                                   [--workload stand-in|prose] [--seeds S]]

Plans: `lr` (item 1: platoon's EASGD with AdamW at 1x and 2x the lr, without and with a 5%
warm-up, one process and DDP at 1x as references), `diloco` (item 3: DiLoCo's outer
SGD(0.7, Nesterov 0.9) at several sync intervals and inner lrs); from 2026-11-30 (the record
advice_2026-11-30.json, read with PRIOR) `three_seeds`, `prose_lr` and `prose` (a second
workload, prose.py), `gain`, `prose_gain` and their winners (what raises platoon's per-step
gain); from 2026-12-01 (advice_2026-12-01.json, the earlier two read as PRIOR) `fair_ddp`
(DDP at 1.5x), `combo` (EASGD every 2 at 1.5x), `prose_every2`, `average_every2`,
`prose_average_lr`, `alpha` and the seeds 4-5 plans `combo_seeds`, `prose_combo_seeds`. Each
run goes to the end of its horizon (no target stops it), so steps to any target
and the final eval loss come from its trace; runs already in OUT or PRIOR (same method,
settings, seed) are not run again. Steps, not
seconds: the machine is shared, so seconds are recorded but claim nothing.
"""

import argparse
import json
import os
import statistics
import sys

from .__main__ import RESULTS, crossing_step, run_once

HORIZON = 1200  # the outside workload's: 1,200 steps per process
PROBLEM = {"target": 0.0, "eval_every": 50, "horizon": HORIZON, "cap_s": 900.0}
ONE = 1.2e-2  # one process's best lr on the race (hf_trainer_race_tuning.json)
PAPER = {"outer_lr": 0.7, "outer_momentum": 0.9}
AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0}
# prose.py: the second workload, on a schedule of half the steps (600 a process: the
# machine was loaded 8-16 when it ran, so each run took 2x-4x its unloaded time)
PROSE = {"corpus": "docstrings", "model": "wide", "horizon": 600}
PROSE_LR = 1.5e-3  # one process's best on it (plan prose_lr, seed 1: final eval loss)
PROSE_TARGETS = (2.6, 2.5, 2.4)  # fixed before DDP and platoon ran: one process, 2.38 at 600
TARGETS = (2.3, 2.05, 1.95)  # eval loss, nats per byte: early, the outside workload's, late
EASGD_CELLS = [("platoon_easgd", {"lr": lr, "warmup": w}) for w in (0.0, 0.05)
               for lr in (ONE, 2 * ONE)]
PLANS = {
    "lr": EASGD_CELLS
    + [("single", {"lr": ONE, "warmup": 0.0}), ("ddp", {"lr": ONE, "warmup": 0.0})],
    "lr_platoon": EASGD_CELLS,
    "edge": [("platoon_easgd", {"lr": lr, "warmup": 0.0}) for lr in (ONE / 4, ONE / 2)]
    + [("single", {"lr": ONE / 2, "warmup": 0.0})],
    "references": [(m, {"lr": ONE, "warmup": 0.05}) for m in ("single", "ddp")],
    "edge_platoon": [("platoon_easgd", {"lr": ONE / 2, "warmup": 0.0})],
    "diloco_average": [("platoon_diloco", {"outer_lr": 1.0, "outer_momentum": 0.0, "lr": ONE,
                                           "sync_every": 100, "warmup": 0.05})],
    # 2026-11-30: the cells the advice rests on at 3 seeds (item 1 of the follow-up)
    "three_seeds": [(m, {"lr": ONE, "warmup": 0.05}) for m in ("single", "ddp", "platoon_easgd")],
    # a workload the tuning never saw: one process's lr tuned on it (as a user would), then
    # the three methods at that lr, the advice as written (5% warm-up, one process's lr)
    # (1.5e-3, then 7.5e-4, added while the grid's lowest was its best)
    "prose_lr": [("single", dict(PROSE, lr=lr, warmup=0.05))
                 for lr in (3e-3, 6e-3, ONE, 1.5e-3, 7.5e-4)],
    "prose": [(m, dict(PROSE, lr=PROSE_LR, warmup=0.05))
              for m in ("single", "ddp", "platoon_easgd")],
    # what could raise platoon's per-step gain (item 2 of the issue) at one process's lr
    # (ASGD: each push adds the worker's whole change, no centre to drag; every 2: half the
    # drift between syncs; 1.5x the lr: (p+1)/p, the speed EASGD's centre loses, restored)
    "gain": [("platoon_asgd", {"lr": ONE, "warmup": 0.05}),
             ("platoon_easgd", {"lr": ONE, "warmup": 0.05, "sync_every": 2}),
             ("platoon_easgd", {"lr": ONE * 1.5, "warmup": 0.05})],
    "gain_winner": [("platoon_easgd", {"lr": ONE, "warmup": 0.05, "sync_every": 2})],
    # the same on the second workload, and twice one process's lr (the advice before 11-29)
    "prose_gain": [("platoon_asgd", dict(PROSE, lr=PROSE_LR, warmup=0.05)),
                   ("platoon_easgd", dict(PROSE, lr=PROSE_LR, warmup=0.05, sync_every=2)),
                   ("platoon_easgd", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05)),
                   ("platoon_easgd", dict(PROSE, lr=PROSE_LR * 2, warmup=0.05))],
    "prose_gain_winner": [("platoon_easgd", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05))],
    # 2026-12-01 (record advice_2026-12-01.json): DDP's lr tuned too (it has twice one
    # process's batch: it may gain from 1.5x as platoon does), on both workloads
    "fair_ddp": [("ddp", {"lr": ONE * 1.5, "warmup": 0.05}),
                 ("ddp", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05))],
    # the two halves of the 11-30 candidates together: a sync every 2 steps at 1.5x the lr
    "combo": [("platoon_easgd", {"lr": ONE * 1.5, "warmup": 0.05, "sync_every": 2}),
              ("platoon_easgd", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05, sync_every=2))],
    # every 2 at one process's lr on prose (seed 1 on 11-30, in prose_gain)
    "prose_every2": [("platoon_easgd", dict(PROSE, lr=PROSE_LR, warmup=0.05, sync_every=2))],
    # no centre to drag: a plain asynchronous average (DiLoCo at outer lr 1, no momentum: each
    # push moves the centre by the worker's change / p, the worker takes the centre), every 2
    "average_every2": [("platoon_diloco", dict(PROSE, **AVERAGE, lr=PROSE_LR,
                                               warmup=0.05, sync_every=2)),
                       ("platoon_diloco", dict(AVERAGE, lr=ONE, warmup=0.05, sync_every=2))],
    # the same at 1.5x (does the average, which has no centre to drag, need the higher lr
    # as well?), prose first; and the combination's borderline cell, prose, at more seeds
    "prose_average_lr": [("platoon_diloco", dict(PROSE, **AVERAGE, lr=PROSE_LR * 1.5,
                                                 warmup=0.05, sync_every=2))],
    "average_lr": [("platoon_diloco", dict(AVERAGE, lr=ONE * 1.5, warmup=0.05,
                                           sync_every=2))],
    "prose_combo_seeds": [("ddp", dict(PROSE, lr=PROSE_LR, warmup=0.05)),
                          ("platoon_easgd", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05,
                                                 sync_every=2))],
    "combo_seeds": [("ddp", {"lr": ONE, "warmup": 0.05}),
                    ("platoon_easgd", {"lr": ONE * 1.5, "warmup": 0.05, "sync_every": 2})],
    # the combination with a weaker pull, alpha 0.6 / p (the default 0.9 / p): a centre that
    # averages the workers over a longer window, prose first
    "alpha": [("platoon_easgd", dict(PROSE, lr=PROSE_LR * 1.5, warmup=0.05, sync_every=2,
                                     alpha=0.3)),
              ("platoon_easgd", {"lr": ONE * 1.5, "warmup": 0.05, "sync_every": 2,
                                 "alpha": 0.3})],
    "diloco": [("platoon_diloco", dict(PAPER, lr=ONE, sync_every=100, warmup=0.05)),
               ("platoon_diloco", dict(PAPER, lr=ONE * 0.1 / 0.7, sync_every=20, warmup=0.05)),
               ("platoon_diloco", dict(PAPER, lr=ONE, sync_every=20, warmup=0.05))],
}


def _rounded(settings):
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in settings.items()}


def _key(method, settings, *seed):
    """A run's identity in a record: method, settings (floats rounded as recorded), seed."""
    return json.dumps([method, _rounded(settings)] + list(seed), sort_keys=True)


def _trace(run):
    """The job's trace: of its ranks' (each evaluated the centre at its own steps), the one
    that ended lowest."""
    traces = [rank["trace"] for rank in run["ranks"] if rank["trace"]]
    return min(traces, key=lambda t: t[-1][2]) if traces else []


def _cell(run):
    return "%s %s" % (run["method"], ", ".join(
        ("%s %g" if isinstance(v, (int, float)) else "%s %s") % (k.replace("_", " "), v)
        for k, v in sorted(run["settings"].items())))


def _steps(value):
    return "%.0f" % value if value is not None else "-"


def _workload(settings):
    """What a run trained on (corpus, model, horizon): the cells a reference compares with."""
    return tuple(settings.get(k) for k in ("corpus", "model", "horizon"))


def _median_steps(group, target):
    """The median over a cell's seeds of steps to `target`, a seed that did not reach it
    counted as never; None where the median is never (half the seeds or more did not)."""
    crossings = [crossing_step(r, target) for r in group]
    median = statistics.median(float("inf") if c is None else c for c in crossings)
    return median if median != float("inf") else None


def markdown(runs, targets=TARGETS, reference=()):
    """Per cell (method and settings) the medians over its seeds: steps per process to each
    target (interpolated between evaluations; a seed that did not reach it counts as never,
    "-": the median is never), each as a
    multiple of the median of the `reference` runs on the same workload where given, the
    eval loss at step 600 and at the end; then every run with its load."""
    cells, references = {}, {}
    for run in runs:
        cells.setdefault(_cell(run), []).append(run)
    for run in reference:
        references.setdefault(_workload(run["settings"]), []).append(run)

    def steps(group, target):
        median = _median_steps(group, target)
        versus = references.get(_workload(group[0]["settings"]))
        base = _median_steps(versus, target) if versus else None
        return _steps(median) + (" (%.2fx)" % (median / base) if median and base else "")

    head = " | ".join("steps to %g" % t for t in targets)
    lines = ["| method, settings | seeds | %s | eval loss at 600 | final eval loss |" % head,
             "|---|---|%s---|---|" % ("---|" * len(targets))]
    for cell, group in cells.items():
        at600 = [dict((step, loss) for step, _, loss in _trace(r)).get(600) for r in group]
        lines.append("| %s | %s | %s | %s | %s |" % (
            cell, ",".join(str(r["seed"]) for r in group), " | ".join(
                steps(group, t) for t in targets),
            "%.3f" % statistics.median(a for a in at600 if a is not None)
            if any(a is not None for a in at600) else "-",
            "%.3f" % statistics.median(_trace(r)[-1][2] for r in group)))
    lines += ["", "Every run (load: the 1-minute load average as it started, and as it ended "
              "where recorded (runs from 2026-11-30 on), 2 cores shared with other work; wall: "
              "the whole job, evaluations included):", "",
              "| method, settings | seed | load | wall | %s | final eval loss |" % head,
              "|---|---|---|---|%s---|" % ("---|" * len(targets))]
    for run in runs:
        load = "%.1f" % run["load_before"] + (
            " / %.1f" % run["load_after"] if "load_after" in run else "")
        lines.append("| %s | %d | %s | %.0f s | %s | %.3f |" % (
            _cell(run), run["seed"], load, run["wall_s"],
            " | ".join(_steps(crossing_step(run, t)) for t in targets), _trace(run)[-1][2]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_trainer_race.advice",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--plan", default="lr", choices=sorted(PLANS))
    parser.add_argument("--seeds", default=None,
                        help="the seeds to run (default 1,2); with --report, the seeds to "
                             "report (default all recorded)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "advice_2026-12-01.json"),
                        help="the record new runs are added to")
    parser.add_argument("--prior", default=",".join(
        os.path.join(RESULTS, "advice_2026-11-%d.json" % day) for day in (29, 30)),
                        help="earlier records (comma-separated): their runs are not run "
                             "again and are reported with OUT's ('' for none)")
    parser.add_argument("--report", action="store_true",
                        help="only print the markdown tables of the runs recorded in PRIOR "
                             "and OUT")
    parser.add_argument("--targets", default=",".join("%g" % t for t in TARGETS),
                        help="--report's eval losses (comma-separated)")
    parser.add_argument("--only", default="",
                        help="--report only the cells of these plans (comma-separated)")
    parser.add_argument("--workload", choices=("stand-in", "prose"), default=None,
                        help="--report only the runs on this workload")
    parser.add_argument("--versus", default="",
                        help="--report each cell's steps also as a multiple of those of the "
                             "DDP cell of this plan on the same workload (e.g. fair_ddp)")
    args = parser.parse_args(argv)
    prior, runs = [], []
    for path in args.prior.split(",") if args.prior else []:
        if os.path.exists(path) and path != args.out:
            with open(path) as f:
                prior += json.load(f)
    if os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)
    if args.report:
        runs = prior + runs

        def of(plans, method=None):
            wanted = {_key(m, s) for plan in plans.split(",") for m, s in PLANS[plan]
                      if method in (None, m)}
            return [r for r in runs if _key(r["method"], r["settings"]) in wanted]

        if args.seeds:
            runs = [r for r in runs if r["seed"] in {int(s) for s in args.seeds.split(",")}]
        if args.workload:
            corpus = "docstrings" if args.workload == "prose" else None
            runs = [r for r in runs if r["settings"].get("corpus") == corpus]
        reference = of(args.versus, "ddp") if args.versus else []
        print(markdown(of(args.only) if args.only else runs,
                       [float(t) for t in args.targets.split(",")], reference))
        return 0
    done = {_key(r["method"], r["settings"], r["seed"]) for r in prior + runs}
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    for seed in [int(s) for s in (args.seeds or "1,2").split(",")]:
        for method, settings in PLANS[args.plan]:
            if _key(method, settings, seed) in done:
                continue
            settings = _rounded(settings)
            inner = {k: v for k, v in settings.items() if k != "horizon"}
            problem = dict(PROBLEM, horizon=settings.get("horizon", HORIZON))
            run = run_once(method, inner, seed, -1, problem, log)
            run["settings"] = settings
            run["load_after"] = round(os.getloadavg()[0], 2)
            run["plan"] = args.plan
            losses = [t[2] for rank in run["ranks"] for t in rank["trace"]]
            log("   final eval loss %s" % (losses[-1] if losses else "-"))
            runs.append(run)
            with open(args.out, "w") as f:
                json.dump(runs, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
