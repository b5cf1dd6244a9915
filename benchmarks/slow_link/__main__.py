"""`python -m benchmarks.slow_link`: plan, estimate, run, report (see the package)."""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from ..record import cpu_model, git_commit
from . import __doc__ as PACKAGE_DOC
from . import link as netns
from .methods import (
    METHODS,
    default_cap_s,
    define,
    estimate_s,
    learning_rates,
    model_bytes_of,
    pairs,
    unsupported,
)
from .report import COMMAND, RESULTS, markdown, stem, summarise, write
from .workloads import WORKLOADS, optimizer_settings


def _names(text):
    return None if text is None else [n for n in text.split(",") if n]


def _prerequisites(plan):
    """Why this plan cannot run here (None when it can)."""
    if any(link != "none" for _, link in plan):
        why = netns.missing()
        if why:
            return why
    try:
        import torch  # noqa: F401
    except ImportError:
        return "no torch: pip install -e '.[bench]'"
    if any(METHODS[m].kind == "platoon" for m, _ in plan):
        from platoon._os.process import find_mpiexec
        if find_mpiexec() is None:
            return "no mpiexec beside python or on PATH: pip install -e '.[mpi]'"
        try:
            from mpi4py import MPI  # noqa: F401
        except ImportError as exc:
            return "mpi4py cannot be imported (%s): pip install -e '.[mpi]'" % exc
    return None


def platoon_help():
    """What `python -m platoon.mpi --help` says (the options this checkout has)."""
    return subprocess.run([sys.executable, "-m", "platoon.mpi", "--help"], capture_output=True,
                          text=True, timeout=60).stdout


def main(argv=None):
    parser = argparse.ArgumentParser(prog=COMMAND, description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the language model's QUICK problem (a smoke run)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="lstm",
                        help="lstm: the language model's LSTM with SGD and momentum (default); "
                        "transformer: the transformer benchmark's GPT with AdamW")
    parser.add_argument("--links", default=None,
                        help="comma-separated links: none (one host), 10mbit, 100mbit, 1gbit")
    parser.add_argument("--methods", default=None,
                        help="comma-separated methods (default: the default plan): "
                        + ", ".join(METHODS))
    parser.add_argument("--define", action="append", default=[], metavar="NAME=OPTIONS",
                        help="a platoon method of your own: its python -m platoon.mpi options "
                        '(e.g. "platoon_int8_fast=--tie-every-s 0.25 --tie-compress int8"); '
                        "then name it in --methods")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="seconds a run may train before it counts as not reaching the "
                        "target (default 240; --quick 45)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions (seeds 1..N)")
    parser.add_argument("--estimate", action="store_true",
                        help="only print the plan and its estimated duration")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the .md from the .json")
    args = parser.parse_args(argv)
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    if args.render:
        with open(os.path.join(args.out, stem(args.quick, args.workload) + ".json")) as f:
            report = json.load(f)
        write(report, args.quick, args.out)
        print(markdown(report))
        return 0
    try:
        for spec in args.define:
            define(spec)
        plan = pairs(_names(args.methods), _names(args.links))
    except ValueError as exc:
        parser.error(str(exc))
    workload = WORKLOADS[args.workload]
    try:
        problem = workload.problem(args.quick)
    except ValueError as exc:
        parser.error(str(exc))
    cap_s = args.cap_s if args.cap_s is not None else default_cap_s(args.quick)
    model_bytes = model_bytes_of(problem)
    why = _prerequisites(plan)
    if why:
        print("slow_link: skipped: %s" % why, flush=True)
        return 0
    if netns.missing() is None:
        for name in netns.remove_stale():
            log("removed the namespace %s of an earlier run" % name)
    helptext, skipped = platoon_help(), []
    for name, link in list(plan):
        missing = unsupported(METHODS[name], helptext)
        if missing:
            plan.remove((name, link))
            skipped.append("%s over %s (python -m platoon.mpi has no %s in this checkout)"
                           % (name, link, ", ".join(missing)))
    for line in skipped:
        log("skipped: " + line)
    total = args.reps * sum(estimate_s(m, lk, cap_s, model_bytes, args.quick) for m, lk in plan)
    log("plan: %d run(s) x %d repetition(s): %s" % (len(plan), args.reps,
                                                    ", ".join("%s@%s" % p for p in plan)))
    log("estimated duration: about %.0f minutes (%.0f s), runs capped at %.0f s"
        % (total / 60, total, cap_s))
    if args.estimate or not plan:
        return 0
    lrs = learning_rates(workload)
    optimizer = optimizer_settings(workload)
    from platoon._os.process import find_mpiexec
    mpiexec = find_mpiexec()

    def _terminate(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    command = " ".join([COMMAND] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                              else argv)])
    started, load_start = time.monotonic(), os.getloadavg()[0]
    import torch
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": load_start,
            "quick": args.quick, "workload": workload.name,
            "workload_text": workload.description, "optimizer": optimizer,
            "torch": torch.__version__, "cap_s": cap_s, "reps": args.reps,
            "model_bytes": model_bytes, "estimate_s": total, "command": command}
    runs = []
    for rep in range(args.reps):  # the repetitions outside: methods and links alternate
        for i, (name, link) in enumerate(plan):
            done = rep * len(plan) + i
            left = total * (1 - done / (args.reps * len(plan)))
            log("[%d/%d, about %.0f min left] %s over %s (seed %d, lr %g) ..." % (
                done + 1, args.reps * len(plan), left / 60, name, link, rep + 1, lrs[name]))
            load = os.getloadavg()[0]
            row = run_one_logged(name, link, problem, dict(optimizer, lr=lrs[name]), cap_s,
                                 rep + 1, mpiexec, model_bytes, log, "r%dx%d" % (rep, i))
            row["load_before"] = load  # the 1-minute load average as the run started
            runs.append(row)
    meta.update(load_end=os.getloadavg()[0], seconds=time.monotonic() - started)
    from dataclasses import asdict
    report = {"meta": meta, "problem": asdict(problem),
              "methods": {n: "%s (%s)" % (m.note, " ".join(m.options)) if m.options else m.note
                          for n, m in METHODS.items() if n in {p[0] for p in plan}},
              "skipped": skipped,
              "summary": summarise(runs, {n: m.one_host for n, m in METHODS.items()}),
              "runs": runs}
    print()
    print(markdown(report))
    base = write(report, args.quick, args.out)
    log("wrote %s.json and %s.md" % (base, base))
    failed = [r for r in runs if "error" in r]
    if failed:
        print("slow_link: %d run(s) FAILED: %s" % (len(failed), "; ".join(
            "%s over %s: %s" % (r["method"], r["link"], r["error"]) for r in failed)),
            file=sys.stderr, flush=True)
        return 1
    return 0


def run_one_logged(name, link, problem, optimizer, cap_s, seed, mpiexec, model_bytes, log,
                   tag):
    from .jobs import run_one
    row = run_one(name, link, problem, optimizer, cap_s, seed, mpiexec, model_bytes, log, tag)
    if "error" not in row:
        log("%s over %s: %s, steps %s, bytes sent %s, compute share %s (run %.0f s)" % (
            name, link, "%.1f s" % row["time_s"] if row["reached"] else
            "not reached in %.0f s (best %s)" % (cap_s, row["best_metric"]),
            row["steps"], row.get("bytes_window"),
            ", ".join("%.2f" % c for c in row["compute_share"] if c is not None),
            row["wall_s"]))
    return row


if __name__ == "__main__":
    sys.exit(main())
