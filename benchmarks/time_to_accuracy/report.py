"""The benchmark's report: goals met or not, the Markdown tables, the docs page, the files."""

import json
import os
import re

from .._util import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
DOC = os.path.join(ROOT, "docs", "time-to-accuracy.md")
COMMAND = "python -m benchmarks.time_to_accuracy"

# The goals this benchmark checks (docs/time-to-accuracy.md shows met / not met).
GOAL_VS_SINGLE = 0.55   # best platoon mode's time <= this x the best-tuned single process
GOAL_VS_HOGWILD = 1.0   # ... and <= this x Hogwild's
GOAL_STRAGGLER = 1.2    # platoon with a 2x straggler <= this x its all-fast time


def fmt(value, spec="%.2f", none="-"):
    """`value` formatted by `spec`, or `none` for None."""
    return none if value is None else spec % value


def ratio(a, b):
    """a / b, or None when either is unknown (or b is 0)."""
    return None if a is None or b is None or not b else a / b


def goals(result):
    """[(goal, measured, met)] for one dataset's result."""
    s = result["summary"]
    t = {name: row.get("measure", {}).get("time_s") for name, row in s.items()}
    modes = [n for n in s if n.startswith("platoon_") and t[n] is not None]
    out = []
    best_mode = min(modes, key=lambda n: t[n]) if modes else None
    vs_single = ratio(t.get(best_mode), t.get("single"))
    vs_hog = ratio(t.get(best_mode), t.get("hogwild"))
    name = result["dataset"]["name"]
    out.append(("%s: best platoon mode (%s) vs best-tuned single process" % (name, best_mode),
                vs_single, GOAL_VS_SINGLE))
    out.append(("%s: best platoon mode vs Hogwild" % name, vs_hog, GOAL_VS_HOGWILD))
    if best_mode:
        slow = s[best_mode].get("straggler", {}).get("time_s")
        out.append(("%s: %s with a 2x straggler vs all fast" % (name, best_mode),
                    ratio(slow, t[best_mode]), GOAL_STRAGGLER))
    return out


def limits(result):
    """Lines saying what each platoon mode's time is made of, against the single process:
    time ratio ~ (steps to target ratio) x (time per step ratio)."""
    s = result["summary"]
    single = s.get("single", {}).get("measure", {})
    lines = []
    for name, row in s.items():
        m = row.get("measure", {})
        if not name.startswith("platoon_") or not m.get("steps") or not single.get("steps"):
            continue
        step_ms = 1000 / m["steps_per_s"]
        lines.append(
            "- %s: %.2fx the single process's steps to target (per process, 2 processes), "
            "%.2fx its time per step (%.2f ms, of which sync %.2f ms; lock wait %.3f ms and "
            "hold %.3f ms per sync): %.2fx its time." % (
                name, m["steps"] / single["steps"], single["steps_per_s"] / m["steps_per_s"],
                step_ms, m["sync_ms_per_step"] or 0.0, m["lock_wait_ms_per_sync"] or 0.0,
                m["lock_hold_ms_per_sync"] or 0.0,
                ratio(m["time_s"], single["time_s"]) or float("nan")))
    return lines


def _generated(report):
    """The first line of every page rendered from a record."""
    stem = "time_to_accuracy_quick" if report["meta"]["quick"] else "time_to_accuracy"
    return ("<!-- generated from benchmarks/results/%s.json by `%s --render%s`; do not edit "
            "-->\n\n" % (stem, COMMAND, " --quick" if report["meta"]["quick"] else ""))


def markdown(report):
    """The results' tables, goals and run conditions, as benchmarks/results/*.md holds them."""
    return _generated(report) + _tables(report)


def _tables(report):
    meta = report["meta"]
    lines = []
    for result in report["datasets"]:
        d = result["dataset"]
        s = result["summary"]
        single = s.get("single", {}).get("measure", {}).get("time_s")
        hog = s.get("hogwild", {}).get("measure", {}).get("time_s")
        lines += ["### %s: MLP %s-%d-%d-10, batch %d, target %.0f%% test accuracy" % (
            d["name"], 64 if d["name"] == "digits" else 40, d["hidden"], d["hidden"],
            d["batch"], 100 * d["target"]), "",
            "Evaluated every %d steps (evaluation time excluded); each run capped at %.1f s "
            "(%.0f s on an idle machine, times the load average per core at the start, %.2f)."
            % (d["eval_every"], result["cap_s"], d["cap_s"], result["load_factor"]), "",
            "| method | grid | chosen | reached | median time | median steps | vs single "
            "| vs Hogwild | steps/s per process | sync ms/step | setup s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in s.items():
            m = row.get("measure", {})
            grid = result["grids"][name]
            key = sorted(grid[0])[0]
            fixed = result["fixed"][name]
            lines.append("| %s | %s=%s%s | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s |" % (
                name, key, ", ".join("%g" % g[key] for g in grid),
                "".join("; %s=%g" % kv for kv in sorted(fixed.items())),
                "%g" % result["chosen"][name][key], m.get("reached", 0), m.get("runs", 0),
                fmt(m.get("time_s"), "%.2f s"), fmt(m.get("steps"), "%.0f"),
                fmt(ratio(m.get("time_s"), single), "%.2fx"),
                fmt(ratio(m.get("time_s"), hog), "%.2fx"),
                fmt(m.get("steps_per_s"), "%.0f"), fmt(m.get("sync_ms_per_step"), "%.2f"),
                fmt(m.get("setup_s"), "%.2f")))
        lines += [""] + limits(result)
        lines += ["", "With a 2x straggler (one of the two processes sleeps its step time "
                  "after each step):", "",
                  "| method | median time, straggler | median time, all fast | ratio | reached |"
                  " lock wait ms/sync |",
                  "|---|---|---|---|---|---|"]
        for name, row in s.items():
            st = row.get("straggler")
            if not st:
                continue
            fast = row.get("measure", {}).get("time_s")
            lines.append("| %s | %s | %s | %s | %d/%d | %s |" % (
                name, fmt(st["time_s"], "%.2f s"), fmt(fast, "%.2f s"),
                fmt(ratio(st["time_s"], fast), "%.2fx"), st["reached"], st["runs"],
                fmt(st.get("lock_wait_ms_per_sync"), "%.2f")))
        lines.append("")
    lines += ["### Goals", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for result in report["datasets"]:
        for what, value, limit in goals(result):
            met = value is not None and value <= limit
            lines.append("| %s | %s | <= %.2fx | %s |" % (what, fmt(value, "%.2fx"), limit,
                                                          "met" if met else "**not met**"))
    lines += ["", "Commit %s, %s; %s, %d cores; load average %.2f at start, %.2f at end; "
              "ran in %.0f s%s." % (meta["commit"], meta["date"], meta["cpu"], meta["cores"],
                                    meta["load_start"], meta["load_end"], meta["seconds"],
                                    " (--quick)" if meta["quick"] else "")]
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Time to accuracy against the alternatives

Back to the [README](../README.md).

How long each way of training one model on this machine's cores takes to reach a target test
accuracy, measured in one run in which all methods alternate:

- **single**: one process of plain torch SGD;
- **hogwild**: `model.share_memory()` and 2 `torch.multiprocessing` processes, lock-free;
- **ddp**: `DistributedDataParallel` over gloo, 2 processes;
- **local_sgd**: local SGD with torch's `PeriodicModelAverager` (gloo, 2 processes, period 4);
- **platoon_easgd**, **platoon_downpour_nesterov**, **platoon_diloco**: platoon, 2 worker
  processes and a controller process, `EASGD(alpha)`,
  `Downpour(SGD(server_lr, momentum=0.9, nesterov=True))` and
  `DiLoCo(outer_lr, momentum=0.9, nesterov=True)`, synced every 4 steps; the workers' own
  optimizer is plain torch SGD, their torch parameters shared with the centre as numpy views.

Each method's learning rate is tuned over a grid of three values on one seed (a tuning run is
capped at twice the best time its method has reached so far, plus 0.5 s); the chosen value is
then measured on new seeds. platoon's modes tune their workers' learning rate too, with
EASGD's alpha at 0.9/p = 0.45, Downpour's centre at SGD(0.2, Nesterov momentum 0.9) and
DiLoCo's outer lr at 0.7; the grids are in the tables. Every process is single-threaded. The
clock starts when all of a method's processes are ready (start-up is the "setup" column) and
excludes test evaluations, which every process makes alike. "steps" are the minibatch steps of
one process (in the 2-process methods, each process takes about as many). The straggler runs
slow one of the two processes 2x by sleeping its measured step time after every step.

**Run it** (designed for under 5 minutes on an idle 2-core machine; how long this run took,
and under what load, is under the tables; `--quick` is a shorter smoke version that writes
`benchmarks/results/time_to_accuracy_quick.*`):

```bash
python3 -m venv .venv && .venv/bin/pip install -q -e '.[bench]' \\
  && .venv/bin/python -m benchmarks.time_to_accuracy
```

Caveats: the baselines use plain SGD, as a user switching from one process would; only
Downpour's centre has momentum (a single process with momentum was not measured). On this
shared machine absolute times move 2-5x with the load (see the load average under the tables):
read the ratios, measured in one run with every method alternating, not the seconds.

Reading the lines under each table: a platoon mode's time to target is about its steps to
target (per process) times its time per step. Two processes on two cores can at best halve
the first (0.5x the single process's) and keep the second (1.0x); the lines say how far each
mode is from that, and how much of a step is sync (lock hold and wait from `Worker.sync_stats`).

It writes `benchmarks/results/time_to_accuracy.json` (every run, with its accuracy trace) and
`time_to_accuracy.md`, and regenerates this page from them. The targets: the best platoon mode
at most %.2fx the time of the best-tuned single process and at most %.2fx Hogwild's, on
MNIST-1D and on digits with H=1024; with a 2x straggler, platoon at most %.2fx its all-fast
time.

## Results

""" % (GOAL_VS_SINGLE, GOAL_VS_HOGWILD, GOAL_STRAGGLER)


def doc(report):
    """docs/time-to-accuracy.md: how the benchmark works, then its tables."""
    return _generated(report) + DOC_HEAD + _tables(report)


def write(report, quick, out_dir, doc_path=DOC):
    """The JSON and its Markdown under `out_dir`; for a full run also the docs page."""
    os.makedirs(out_dir, exist_ok=True)
    stem = "time_to_accuracy_quick" if quick else "time_to_accuracy"
    text = json.dumps(report, indent=1)
    # Lists of numbers (the traces' points) on one line each.
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]",
                  lambda m: "[%s]" % ", ".join(v.strip() for v in m.group(1).split(",")), text)
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(markdown(report))
    if doc_path and not quick:
        with open(doc_path, "w") as f:
            f.write(doc(report))

