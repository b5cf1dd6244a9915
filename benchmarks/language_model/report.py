"""The language-model benchmark's report: tables, goals met or not, the docs page, the files."""

import json
import os

from .._util import ROOT
from ..time_to_accuracy.report import fmt, ratio

RESULTS = os.path.join(ROOT, "benchmarks", "results")
DOC = os.path.join(ROOT, "docs", "language-model.md")
COMMAND = "python -m benchmarks.language_model"

# The targets, 2 workers on the 2-core machine, ratios from one run.
GOAL_VS_DDP = 0.9        # platoon's best rule's time to target <= this x DDP's
GOAL_VS_SINGLE = 0.65    # ... and <= this x one process's
GOAL_STRAGGLER = 1.2     # with one of 2 workers slowed 2x <= this x its all-fast time
GOAL_KILL = 1.3          # with a worker SIGKILLed halfway <= this x its no-fault time


def stem(quick, kind=""):
    return "language_model" + ("_" + kind if kind else "") + ("_quick" if quick else "")


def _measure(report, name, phase="measure"):
    part = report["measured"] if phase == "measure" else (report.get("straggler") or {})
    return part.get("summary", {}).get(name, {}).get(phase, {})


def fastest(summary, prefix):
    """The method of `summary` (a run's measured methods) named `prefix`... with the
    shortest median time to target; None when none of them reached it."""
    times = {n: r.get("measure", {}).get("time_s") for n, r in summary.items()
             if n.startswith(prefix)}
    times = {n: t for n, t in times.items() if t is not None}
    return min(times, key=times.get) if times else None


def goals(report):
    """[(goal, measured, limit)]."""
    s = report["measured"]["summary"]
    best, ddp, single = fastest(s, "platoon_"), fastest(s, "ddp"), fastest(s, "single")
    t = lambda n, phase="measure": _measure(report, n, phase).get("time_s")  # noqa: E731
    out = [("best platoon rule (%s) vs the faster DDP (%s)" % (best, ddp),
            ratio(t(best), t(ddp)), GOAL_VS_DDP),
           ("best platoon rule vs the faster one process (%s)" % single,
            ratio(t(best), t(single)), GOAL_VS_SINGLE),
           ("best platoon rule with a 2x straggler vs all fast",
            ratio(t(best, "straggler"), t(best)), GOAL_STRAGGLER)]
    for row in (report.get("faults") or {}).get("rows", []):
        if row["method"].startswith("platoon"):
            out.append(("%s with --%s, worker SIGKILLed halfway, vs no fault" % (
                row["method"], row["recovery"]),
                        row.get("ratio"), GOAL_KILL))
    return out


def limits(report):
    """What each 2-process method's time is made of, against one process: time ratio =
    (steps to target ratio) x (time per step ratio). Two processes on two cores can at best
    halve the first and keep the second."""
    s = report["measured"]["summary"]
    best = fastest(s, "single")
    single = s.get(best, {}).get("measure", {})
    lines = ["What the times are made of, against %s (time ratio = steps ratio x time-per-step "
             "ratio; 2 processes on 2 cores at best 0.50x x 1.00x):" % best, ""]
    for name, row in s.items():
        m = row.get("measure", {})
        if name == best or not m.get("steps") or not single.get("steps"):
            continue
        lines.append("- %s: %.2fx the steps, %.2fx the time per step (%.1f ms, of which sync "
                     "%.2f ms): %.2fx the time." % (
                         name, m["steps"] / single["steps"],
                         single["steps_per_s"] / m["steps_per_s"], 1000 / m["steps_per_s"],
                         m.get("sync_ms_per_step") or 0.0,
                         ratio(m["time_s"], single["time_s"]) or float("nan")))
    return lines


def _tuning(report):
    """The tuning runs (seed 0, a separate recorded run), every grid value of every method,
    measured or not in this run."""
    t = report.get("tuning") or {}
    if not t.get("runs"):
        return ["No recorded tuning: every method took its grid's middle value."]
    meta = t.get("meta") or {}
    lines = ["The lr tuning (`%s --tune`, seed 0, %s, load average %.1f at start and %.1f at "
             "end; a run is capped at twice its method's best time so far): time to target "
             "(steps) for each lr; the chosen one, in bold, took the fewest steps (the time "
             "per step does not depend on the lr, and the seconds carry the load of the "
             "moment)." % (
                 COMMAND, meta.get("date", "?"), meta.get("load_start", 0.0),
                 meta.get("load_end", 0.0)), "",
             "| method | tuning runs |", "|---|---|"]
    by = {}
    for r in t["runs"]:
        by.setdefault(r["method"], []).append(r)
    left = [n for n in by if n not in report["measured"]["summary"]]
    if left:
        lines[0] += (" Tuned but not measured in this run (for time; `--methods` adds them): "
                     "%s." % ", ".join(left))
    for name, runs in by.items():
        cells = []
        for r in sorted(runs, key=lambda r: r["lr"]):
            text = ("lr %g: %.1f s (%d)" % (r["lr"], r["reached"][0], r["reached"][1])
                    if r["reached"] else "lr %g: %s" % (r["lr"], "failed" if r["error"] else
                                                         "not in %.0f s" % r["cap_s"]))
            bold = t["chosen"].get(name, {}).get("lr") == r["lr"]
            cells.append("**%s**" % text if bold else text)
        lines.append("| %s | %s |" % (name, "; ".join(cells)))
    return lines


def _generated(report):
    quick = report["meta"]["quick"]
    return ("<!-- generated from benchmarks/results/%s.json by `%s --render%s`; do not edit "
            "-->\n\n" % (stem(quick), COMMAND, " --quick" if quick else ""))


def markdown(report):
    return _generated(report) + _tables(report)


def _tables(report):
    meta, m, c = report["meta"], report["measured"], report["corpus"]
    d = m["dataset"]
    single_name, ddp_name = fastest(m["summary"], "single"), fastest(m["summary"], "ddp")
    single, ddp = _measure(report, single_name), _measure(report, ddp_name)
    lines = ["### Byte-level LSTM on the standard library's source, target %.2f bits per byte"
             % d["target"], "",
             "Embedding %d, LSTM %d, batch %d windows of %d bytes, SGD clipped at norm %g; "
             "text: %d files of Python %s's stdlib (%.1f MB; file list sha256 %s), %d KB of "
             "training text; scored on %d windows of %d bytes spread over %d KB of validation "
             "text (every tenth file). Evaluated every %d steps (evaluation time excluded); "
             "runs capped at %.0f s." % (
                 d["embed"], d["hidden"], d["batch"], d["bptt"], d["clip"], c["files"],
                 c["python"], c["corpus_bytes"] / 1e6, c["file_list_sha256"],
                 c["train_bytes"] // 1000, d.get("eval_windows", 0), d["eval_bptt"],
                 c["valid_bytes"] // 1000, d["eval_every"], m["cap_s"]), "",
             "| method | lr grid | lr | fixed | reached | median time | median steps per process "
             "| steps vs %s | time vs %s | time vs %s | steps/s per process "
             "| sync ms/step |" % (single_name, single_name, ddp_name),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    grids = report.get("tuning", {}).get("grids", {})
    for name, row in m["summary"].items():
        r = row.get("measure", {})
        fixed = {k: v for k, v in m["fixed"][name].items() if k != "rule"}
        grid = grids.get(name)
        lines.append("| %s | %s | %g | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s |" % (
            name, ", ".join("%g" % g["lr"] for g in grid) if grid else "not tuned",
            m["chosen"][name]["lr"],
            ", ".join("%s=%g" % kv for kv in sorted(fixed.items())) or "-",
            r.get("reached", 0), r.get("runs", 0), fmt(r.get("time_s"), "%.1f s"),
            fmt(r.get("steps"), "%.0f"), fmt(ratio(r.get("steps"), single.get("steps")),
                                             "%.2fx"),
            fmt(ratio(r.get("time_s"), single.get("time_s")), "%.2fx"),
            fmt(ratio(r.get("time_s"), ddp.get("time_s")), "%.2fx"),
            fmt(r.get("steps_per_s"), "%.1f"), fmt(r.get("sync_ms_per_step"), "%.2f")))
    lines += [""] + limits(report) + [""] + _tuning(report)
    st = report.get("straggler")
    if st:
        lines += ["", "With a 2x straggler (one of the two processes sleeps its measured step "
                  "time after each step; %d run(s) each):" % report["meta"].get(
                      "straggler_reps", 1), "",
                  "| method | time, straggler | time, all fast | ratio | steps per process "
                  "(rank 0) | reached |", "|---|---|---|---|---|---|"]
        for name, row in st["summary"].items():
            s = row.get("straggler", {})
            fast = _measure(report, name).get("time_s")
            lines.append("| %s | %s | %s | %s | %s | %d/%d |" % (
                name, fmt(s.get("time_s"), "%.1f s"), fmt(fast, "%.1f s"),
                fmt(ratio(s.get("time_s"), fast), "%.2fx"), fmt(s.get("steps"), "%.0f"),
                s.get("reached", 0), s.get("runs", 0)))
    faults = report.get("faults")
    if faults:
        lines += ["", faults["note"], "",
                  "| method | how it recovers | time with the kill | time without | ratio "
                  "| steps (rank 0) with, without | reached | restarts of the others |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in faults["rows"]:
            lines.append("| %s | %s | %s | %s | %s | %s, %s | %s | %s |" % (
                row["method"], row["how"], fmt(row.get("time_s"), "%.1f s"),
                fmt(row.get("base_s"), "%.1f s"), fmt(row.get("ratio"), "%.2fx"),
                fmt(row.get("steps"), "%d"), fmt(row.get("base_steps"), "%d"),
                "%s/%s" % (row.get("reached", "-"), row.get("runs", 1)),
                row.get("others_restarted", "-")))
    lines += ["", "### Goals", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for what, value, limit in goals(report):
        met = value is not None and value <= limit
        lines.append("| %s | %s | <= %.2fx | %s |" % (what, fmt(value, "%.2fx"), limit,
                                                      "met" if met else "**not met**"))
    lines += ["", "Commit %s, %s; %s, %d cores, torch %s; load average %.2f at start, %.2f at "
              "end; ran in %.0f s%s." % (meta["commit"], meta["date"], meta["cpu"],
                                        meta["cores"], meta["torch"], meta["load_start"],
                                        meta["load_end"], meta["seconds"],
                                        " (--quick)" if meta["quick"] else "")]
    phases = meta.get("phases")
    if phases:
        lines[-1] = lines[-1][:-1] + " (%s)." % ", ".join(
            "%s %.0f s" % (k[:-2].replace("_", " "), v) for k, v in phases.items())
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Language model: time to a target on real text

Back to the [README](../README.md). The quick benchmark on small classifiers is
[time to accuracy](time-to-accuracy.md); this one is the longer, realistic one.

What it trains: a byte-level LSTM language model (embedding 32, one LSTM layer of 256, a
256-way output; 0.37M parameters) on the Python standard library's own source, which every
machine has offline. The files are every `.py` under `sysconfig.get_paths()["stdlib"]`
outside tests, site-packages and a few non-library folders, in sorted order; every tenth file
is validation text. The Python version, the number of files and a digest of the list are
recorded with the results (another Python's stdlib is another corpus). Each step is a batch
of 16 windows of 64 bytes at random offsets (each process its own), plain torch SGD with the
gradient clipped at norm 1; the metric is bits per byte on 256 windows of 128 bytes spread
evenly over the validation text. The target, 2.2 bits per byte (one process of plain SGD
needs about 3,300 steps, a minute on one idle core), is late enough that a doubled batch
pays: DDP with 2 processes needs fewer steps per process than one process (the "steps vs"
column). At an early target a doubled batch buys nothing, and no data-parallel method can
win.

Methods, each with its lr tuned on a grid (three values or more, extended past any edge where
the best one fell; the lr column is the one chosen):

- **single**: one process; **single_momentum**: the same with momentum 0.9;
- **hogwild**: `model.share_memory()`, 2 `torch.multiprocessing` processes, lock-free;
- **ddp**: `DistributedDataParallel` over gloo, 2 processes (a batch of 32 per step);
  **ddp_momentum**: the same with momentum 0.9;
- **local_sgd**: torch's `PeriodicModelAverager`, period 4 (gloo, 2 processes);
- **platoon_***: platoon, 2 worker processes and a controller, syncing every 4 steps:
  `EASGD(0.45)` (the old recommendation), the same with momentum 0.9 in the workers'
  optimizer (EAMSGD, Zhang et al. 2015), `ASGD()`, `Downpour(SGD(0.2, momentum=0.9,
  nesterov=True))` and `DiLoCo(outer_lr=0.7)`.

The momentum variants are there because EAMSGD has momentum: a rule is compared with the
baselines given the same optimizer.

How it is timed: as [time to accuracy](time-to-accuracy.md) (the same harness): forked
single-threaded processes, the clock starts at a barrier after start-up, evaluation time is
excluded (every process pauses alike), all methods alternate within each repetition, medians
over 3 seeds that differ from the tuning seed. "steps" are one process's. The straggler runs
slow one of the two processes 2x (it sleeps its measured step time after every step). The
fault runs kill worker 1 with SIGKILL at half its method's median steps to target and
recover as each method's users would: platoon under the real `platoon-launcher` with
`--restart 1` (a replacement registers and takes the centre) and with `--keep-going` (the
controller's `handle_worker_death` returns and worker 0 goes on alone); DDP under `torchrun
--max-restarts 1`, every process restarted and resumed from the checkpoint rank 0 writes at
every evaluation (100 steps). Each fault case also runs without the kill, launched the same
way, on the same 3 seeds; the ratio of the medians is the fault's cost; the clock of worker 0
(rank 0) runs on across the restart.

What bounds the fault ratios. A method whose 2 processes need half one process's steps
(linear scaling; platoon's best rule here) needs the same total number of steps with a
straggler: with one process at half speed, 1.5 processes' worth of steps are made per unit of
time instead of 2, so at best 2/1.5 = 1.33x its all-fast time, unless the slow process's steps
count for more than the fast one's. A synchronous method (DDP) goes at the slow process's
pace: 2x. With one of the 2 killed halfway and not replaced (`--keep-going`), the second half
of the steps is made at half the rate: at best 1.5x. A replacement (`--restart`) costs its
start-up and the steps the killed worker took since its last sync.

**Run it.** The lr grid is a separate, recorded step (about 60 minutes on 2 cores; it
writes `benchmarks/results/language_model_tuning.json`, which the measured run reads; grid
values already in the record are not run again):

```bash
.venv/bin/python -m benchmarks.language_model --tune
```

The measured run, every method on 3 seeds, then the straggler and the kill-halfway runs on 3
seeds each (about 48 minutes on 2 cores: 29 for the methods, 6 for the straggler, 12 for the
kills):

```bash
.venv/bin/python -m benchmarks.language_model
```

The method comparison alone, in about 29 minutes, is `--straggler '' --faults none`;
`--quick`, a small model to an early target in about a minute, writes
`benchmarks/results/language_model_quick.*`.

It writes `benchmarks/results/language_model.json` (every run, with its trace) and `.md`, and
regenerates this page. Caveats: this is a 2-core machine shared with other work; absolute
seconds move with the load (given under the tables), so read the ratios of one run. An LSTM
step is sequential work; a larger model, or a GPU, changes the balance between computing and
syncing.

## Results

"""


def doc(report):
    """docs/language-model.md: how the benchmark works, then its tables."""
    return _generated(report) + DOC_HEAD + _tables(report)


def write(report, quick, out_dir, doc_path=DOC):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem(quick) + ".json"), "w") as f:
        f.write(json.dumps(report, indent=1) + "\n")
    with open(os.path.join(out_dir, stem(quick) + ".md"), "w") as f:
        f.write(markdown(report))
    if doc_path and not quick:
        with open(doc_path, "w") as f:
            f.write(doc(report))
