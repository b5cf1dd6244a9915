"""`python -m benchmarks.time_to_accuracy`: tune, measure, report (see the package's docstring)."""

import argparse
import json
import multiprocessing
import os
import time

from ..record import cpu_model, git_commit
from . import __doc__ as PACKAGE_DOC
from .harness import prewarm
from .methods import FULL, QUICK, methods
from .report import COMMAND, RESULTS, markdown, write
from .tuning import tune_and_measure


def main(argv=None):
    parser = argparse.ArgumentParser(prog=COMMAND, description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller models, lower targets, one repetition (smoke test)")
    parser.add_argument("--datasets", default="digits,mnist1d", help="comma-separated subset")
    parser.add_argument("--methods", default=",".join(methods()),
                        help="comma-separated subset of the methods")
    parser.add_argument("--reps", type=int, default=None,
                        help="measured repetitions per method (default 3; --quick 1)")
    parser.add_argument("--straggler-reps", type=int, default=None,
                        help="straggler repetitions per method (default: as --reps)")
    parser.add_argument("--no-tune", action="store_true",
                        help="take each grid's middle value (--quick does)")
    parser.add_argument("--out", default=RESULTS, help="directory for the .json and .md")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the .md and the docs page from the JSON")
    args = parser.parse_args(argv)
    if args.render:
        stem = "time_to_accuracy_quick" if args.quick else "time_to_accuracy"
        with open(os.path.join(args.out, stem + ".json")) as f:
            report = json.load(f)
        write(report, args.quick, args.out)
        print(markdown(report))
        return
    configs = {d.name: d for d in (QUICK if args.quick else FULL)}
    names = [n for n in args.datasets.split(",") if n]
    unknown = set(names) - set(configs)
    if unknown:
        parser.error("unknown dataset(s) %s; choose from %s" % (", ".join(sorted(unknown)),
                                                                 ", ".join(configs)))
    table = methods()
    picked = [n for n in args.methods.split(",") if n]
    if set(picked) - set(table):
        parser.error("unknown method(s) %s; choose from %s" % (
            ", ".join(sorted(set(picked) - set(table))), ", ".join(table)))
    table = {n: table[n] for n in table if n in picked}
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    straggler_reps = args.straggler_reps if args.straggler_reps is not None else reps
    tune = not (args.quick or args.no_tune)
    ctx = multiprocessing.get_context("fork")  # children inherit torch, already imported
    import torch
    prewarm()  # once here, before forking
    started, load_start = time.monotonic(), os.getloadavg()[0]
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    results = [tune_and_measure(ctx, configs[n], table, tune, reps, straggler_reps, log)
               for n in names]
    report = {"meta": {"commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime()),
                       "cpu": cpu_model(), "cores": os.cpu_count(), "load_start": load_start,
                       "load_end": os.getloadavg()[0], "seconds": time.monotonic() - started,
                       "quick": args.quick, "reps": reps, "straggler_reps": straggler_reps,
                       "torch": torch.__version__},
              "datasets": results}
    text = markdown(report)
    print()
    print(text)
    write(report, args.quick, args.out)


if __name__ == "__main__":
    main()
