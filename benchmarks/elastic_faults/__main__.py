"""`python -m benchmarks.elastic_faults`: the schedule, the runs, the report (see the package)."""

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import sys
import time

from ..record import cpu_model, git_commit
from ..slow_link import link as slow_link
from ..slow_link.methods import learning_rates
from . import __doc__ as PACKAGE_DOC
from .race import MEMBERS, Settings, run_member
from .report import COMMAND, RESULTS, markdown, stem, write
from .schedule import fault_schedule

FAULT_SEED = 33  # every member, every repetition: the same faults
EVERY_S, DOWN_S, JITTER_S = 60.0, 10.0, 5.0


def schedule_text(schedule):
    return ", ".join("%s at %.0f s (back at %.0f s)" % (f.node, f.kill_s, f.restart_s)
                     for f in schedule) or "none before the cap"


def main(argv=None):
    parser = argparse.ArgumentParser(prog=COMMAND, description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the language model's QUICK problem (a smoke run)")
    parser.add_argument("--members", default=",".join(MEMBERS),
                        help="comma-separated members: " + ", ".join(MEMBERS))
    parser.add_argument("--reps", type=int, default=1, help="repetitions (seeds 1..N)")
    parser.add_argument("--cap-s", type=float, default=None,
                        help="seconds a run may take before it counts as not reaching the "
                        "target (default 300; --quick 60)")
    parser.add_argument("--target", type=float, default=None,
                        help="bits per byte to reach (default: the problem's)")
    parser.add_argument("--link", default="100mbit", choices=sorted(slow_link.RATES))
    parser.add_argument("--every-s", type=float, default=EVERY_S,
                        help="a fault about this often (default %g)" % EVERY_S)
    parser.add_argument("--down-s", type=float, default=None,
                        help="a killed node starts again this much later (default %g; "
                        "--script --quick: 3)" % DOWN_S)
    parser.add_argument("--script", action="store_true",
                        help="the joiner's start-up on an ordinary script instead: "
                        "examples/lm/train.py under platoon.elastic.node, node c killed "
                        "--kill-at-s in (see benchmarks/elastic_faults/script.py)")
    parser.add_argument("--kill-at-s", type=float, default=None,
                        help="--script: node c is killed this long in (default 40; --quick 15)")
    parser.add_argument("--schedule", action="store_true",
                        help="only print the fault schedule")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the .md from the .json")
    args = parser.parse_args(argv)
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    if args.render:
        with open(os.path.join(args.out, stem(args.quick, args.every_s) + ".json")) as f:
            report = json.load(f)
        write(report, args.out)
        print(markdown(report))
        return 0
    members = [m for m in args.members.split(",") if m]
    unknown = [m for m in members if m not in MEMBERS]
    if unknown:
        parser.error("unknown member(s) %s: choose from %s" % (", ".join(unknown),
                                                              ", ".join(MEMBERS)))
    if args.script:
        return _script(args, log, argv)
    args.down_s = DOWN_S if args.down_s is None else args.down_s
    cap_s = args.cap_s if args.cap_s is not None else (60.0 if args.quick else 300.0)
    try:
        schedule = fault_schedule(FAULT_SEED, cap_s, args.every_s, args.down_s,
                                  min(JITTER_S, args.every_s / 12))
    except ValueError as exc:
        parser.error(str(exc))
    log("faults (seed %d): %s" % (FAULT_SEED, schedule_text(schedule)))
    if args.schedule:
        return 0
    why = slow_link.missing()
    if why:
        print("elastic_faults: skipped: %s" % why, flush=True)
        return 0
    from platoon._os.process import find_mpiexec
    mpiexec = find_mpiexec()
    skipped = []
    for name in list(members):
        kind = MEMBERS[name].kind
        if kind == "torchft" and importlib.util.find_spec("torchft") is None:
            members.remove(name)
            skipped.append("%s (torchft is not installed: pip install torchft==0.2.0)" % name)
        if kind == "mpi" and (mpiexec is None or importlib.util.find_spec("mpi4py") is None):
            members.remove(name)
            skipped.append("%s (no mpiexec or mpi4py: pip install -e '.[mpi]')" % name)
    for line in skipped:
        log("skipped: " + line)
    for name in slow_link.remove_stale():
        log("removed the namespace %s of an earlier run" % name)
    from ..language_model.methods import FULL, QUICK
    problem = dataclasses.asdict(QUICK if args.quick else FULL)
    if args.target is not None:
        problem["target"] = args.target
    settings = Settings()
    # platoon's workers: the lr tuned for EAMSGD workers (the slow-link benchmark's
    # platoon_diloco_int8); torchft's inner steps are one process's own between syncs: the lr
    # tuned for one process with momentum (its record holds none for torchft on this model)
    lrs = learning_rates()
    cfg = {"lr": lrs["platoon_diloco_int8"], "momentum": 0.9, "rule": "easgd",
           "alpha": 0.45, "tau": 4}
    torchft_cfg = {"lr": lrs["single"], "momentum": 0.9, "outer_lr": settings.outer_lr,
                   "outer_momentum": settings.outer_momentum,
                   "sync_every": settings.sync_every}

    def _terminate(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    command = " ".join([COMMAND] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                              else argv)])
    started = time.monotonic()
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": os.getloadavg()[0],
            "quick": args.quick, "cap_s": cap_s, "reps": args.reps,
            "seeds": ", ".join(str(s) for s in range(1, args.reps + 1)),
            "link": args.link.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s"),
            "every_s": args.every_s, "down_s": args.down_s, "fault_seed": FAULT_SEED,
            "schedule": [dataclasses.asdict(f) for f in schedule],
            "schedule_text": schedule_text(schedule), "cfg": cfg,
            "torchft_cfg": torchft_cfg, "command": command}
    runs = []
    from .report import summarise

    def record():
        """The report of the runs so far (written after each run: a run cut short keeps
        what was measured)."""
        step_times = [r.get("step_s") for r in runs if r.get("step_s")]
        meta.update(load_end=os.getloadavg()[0], seconds=time.monotonic() - started,
                    step_s=sorted(step_times)[len(step_times) // 2] if step_times else None)
        report = {"meta": meta, "problem": problem, "settings": dataclasses.asdict(settings),
                  "members": {n: MEMBERS[n].note for n in members}, "skipped": skipped,
                  "summary": summarise(runs), "runs": runs}
        return report, write(report, args.out)
    for rep in range(args.reps):  # the repetitions outside: members alternate
        for i, name in enumerate(members):
            log("[%d/%d] %s (seed %d) ..." % (rep * len(members) + i + 1,
                                              args.reps * len(members), name, rep + 1))
            member_cfg = torchft_cfg if MEMBERS[name].kind == "torchft" else cfg
            row = run_member(name, problem, member_cfg, settings, schedule, rep + 1, cap_s,
                             slow_link.rate_bits(args.link), mpiexec, log, "r%d%d" % (rep, i))
            if "error" not in row:
                log("%s: %s, steps %s (useful %s, goodput %s), %.1f MB, joiners %s, "
                    "steps/s %s" % (
                        name, "%.1f s" % row["time_s"] if row["reached"] else
                        "not reached (best %s)" % row["best_metric"], row["steps"],
                        row["useful_steps"], "%.2f" % row["goodput"] if row["goodput"] else "-",
                        row["bytes_total"] / 1e6,
                        [(j["first_contribution_s"], j["worker_started_s"],
                          j["worker_loaded_s"]) for j in row["joiners"]],
                        ", ".join("%s %s" % (n, "-" if r["steps_per_s"] is None
                                             else "%.1f" % r["steps_per_s"])
                                  for n, r in row["nodes"].items())))
            runs.append(row)
            record()
    report, base = record()
    print()
    print(markdown(report))
    log("wrote %s.json and %s.md" % (base, base))
    failed = [r for r in runs if "error" in r]
    if failed:
        print("elastic_faults: %d run(s) FAILED: %s" % (len(failed), "; ".join(
            "%s: %s" % (r["member"], r["error"]) for r in failed)), file=sys.stderr, flush=True)
        return 1
    return 0


def _script(args, log, argv):
    """`--script`: the joiner's chain on examples/lm/train.py (`script`)."""
    why = slow_link.missing()
    if why:
        print("elastic_faults: skipped: %s" % why, flush=True)
        return 0
    for name in slow_link.remove_stale():
        log("removed the namespace %s of an earlier run" % name)
    from . import script

    def _terminate(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": os.getloadavg()[0],
            "quick": args.quick, "reps": args.reps,
            "link": args.link.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s"),
            "command": " ".join([COMMAND] + [shlex.quote(a) for a in (
                sys.argv[1:] if argv is None else argv)])}
    return script.main(args, log, meta)


if __name__ == "__main__":
    sys.exit(main())
