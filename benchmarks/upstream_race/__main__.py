"""`python -m benchmarks.upstream_race`: race, record, report (see the package)."""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from .._util import SINGLE_THREAD_ENV
from ..record import cpu_model, git_commit
from . import __doc__ as PACKAGE_DOC

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
UPSTREAM = os.path.join(ROOT, "examples", "upstream")
PROBE = os.path.join(HERE, "probe.py")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
RECORD = os.path.join(RESULTS, "upstream_race.json")
PROCESSES = 2
METHODS = ("ddp", "platoon", "single")  # single: the original script alone, the reference
LINE = re.compile(r"^(?:\[(worker\d+)\] )?upstream_race: (\{.*\})\s*$")

# The stdlib modules the Trainer's language model reads (train, validation): 630 KB, 23 KB.
CLM_TEXT = (("argparse.py", "ast.py", "typing.py", "inspect.py", "dataclasses.py", "enum.py",
             "functools.py", "pathlib.py"), ("bisect.py", "textwrap.py"))
CLM_ARGS = ["--model_type", "gpt2", "--config_overrides",
            "vocab_size=500,n_embd=64,n_layer=2,n_head=2,n_positions=64",
            "--tokenizer_name", "tok", "--train_file", "train.txt", "--validation_file",
            "valid.txt", "--block_size", "64", "--per_device_train_batch_size", "16",
            "--do_train", "--do_eval", "--eval_strategy", "steps", "--save_strategy", "no",
            "--logging_steps", "100", "--max_eval_samples", "64", "--use_cpu",
            "--report_to", "none", "--disable_tqdm", "true", "--output_dir", "out"]

# Per framework: the scripts (DDP's, platoon's), the horizon and evaluation cadence (steps per
# process), the target eval loss, the lrs (the first the default; several: tuned on the
# grid, both sides) and how its DDP is started.
FRAMEWORKS = {
    "transformers": {"ddp": "transformers/run_clm.py",
                     "platoon": "transformers/run_clm_platoon.py",
                     "horizon": 600, "eval_every": 25, "target": 3.45,
                     "lrs": [2e-3]},  # tuned, seed 1, --lrs 1e-3,2e-3,4e-3: both sides' best
    "lightning": {"ddp": "lightning/autoencoder.py", "platoon": "lightning/autoencoder.py",
                  "horizon": 3000, "eval_every": 50, "target": 0.002, "lrs": [1e-2]},
    # transformer.py: the script's own SGD lr 20 (no flag) swings its validation loss by
    # several nats from one evaluation to the next, under DDP too: no target to race to
    "lightning_transformer": {"ddp": "lightning/transformer.py",
                              "platoon": "lightning/transformer_platoon.py",
                              "horizon": 600, "eval_every": 25, "target": 0.0,
                              "lrs": [20.0]},
}
FRAMEWORKS["accelerate"] = {  # horizon: epochs; an evaluation per epoch (the script's)
    "ddp": "accelerate/local_sgd.py", "platoon": "accelerate/local_sgd_platoon.py",
    "horizon": 30, "eval_every": None, "target": 0.2, "lrs": [2e-3]}
ACCELERATE_DATA = {"UPSTREAM_RACE_PAIRS": "2048", "UPSTREAM_RACE_BATCH": "16"}
LIGHTNING_DDP = ["--trainer.strategy=ddp", "--trainer.devices=%d" % PROCESSES,
                 "--trainer.accelerator=cpu"]
PLATOON_STRATEGY = "--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy"


def prepare(framework, work):
    """The files a run of `framework` needs in its working directory `work`."""
    if framework != "transformers":
        return
    stdlib = os.path.dirname(os.__file__)
    for name, files in zip(("train.txt", "valid.txt"), CLM_TEXT):
        with open(os.path.join(work, name), "w") as out:
            for source in files:
                with open(os.path.join(stdlib, source)) as f:
                    out.write(f.read())
    subprocess.run([sys.executable, os.path.join(UPSTREAM, "transformers", "make_tokenizer.py"),
                    "train.txt", "tok"], cwd=work, check=True, capture_output=True,
                   timeout=300)


def command(framework, method, lr, seed):
    """(argv, the environment variables it adds) of one run: the framework's own DDP on
    `PROCESSES` processes, or the platoon port under the launcher."""
    spec = FRAMEWORKS[framework]
    env = {"UPSTREAM_RACE_FRAMEWORK": framework,
           "UPSTREAM_RACE_SCRIPT": os.path.join(UPSTREAM, spec["platoon" if method == "platoon"
                                                               else "ddp"])}
    if framework == "transformers":
        args = CLM_ARGS + ["--max_steps", str(spec["horizon"]), "--eval_steps",
                           str(spec["eval_every"]), "--learning_rate", "%g" % lr,
                           "--seed", str(seed)]
    elif framework == "accelerate":  # lr 2e-3 is the script's own (no flag)
        if lr != 2e-3:
            raise ValueError("local_sgd.py's AdamW lr is its own 2e-3 (no flag)")
        args = ["--cpu"]  # its LocalSGD every --local_sgd_steps 8, its default, both sides
        env.update(ACCELERATE_DATA, UPSTREAM_RACE_EPOCHS=str(spec["horizon"]),
                   UPSTREAM_RACE_SEED=str(seed))
    elif framework == "lightning":  # LightningCLI: the strategy, lr and seed are flags
        args = ["--seed_everything=%d" % seed, "--model.learning_rate=%g" % lr,
                "--trainer.max_epochs=-1", "--trainer.max_steps=%d" % spec["horizon"],
                "--trainer.val_check_interval=%d" % spec["eval_every"],
                "--trainer.check_val_every_n_epoch=null", "--trainer.enable_progress_bar=false",
                "--trainer.logger=false"]
        args += {"ddp": LIGHTNING_DDP, "platoon": [PLATOON_STRATEGY]}.get(method, [])
    else:  # lightning_transformer: lr 20 and seed 42 are the script's own
        if lr != 20.0:
            raise ValueError("transformer.py's SGD lr is its own 20 (no flag)")
        args = ["--max_steps", str(spec["horizon"]), "--max_epochs", "1000"]
        env.update(PL_TRAINER_VAL_CHECK_INTERVAL=str(spec["eval_every"]),
                   PL_TRAINER_CHECK_VAL_EVERY_N_EPOCH="None",
                   PL_TRAINER_ENABLE_CHECKPOINTING="False", PL_TRAINER_LOGGER="False")
        if method != "platoon":
            env.update(PL_TRAINER_DEVICES=str(PROCESSES if method == "ddp" else 1),
                       PL_TRAINER_ACCELERATOR="cpu",
                       PL_TRAINER_STRATEGY="ddp" if method == "ddp" else "auto")
    if method == "platoon":
        argv = [sys.executable, "-m", "platoon.launch.cli", "-n", str(PROCESSES), "--log-dir",
                "platoon-logs", PROBE, "--"] + args
    elif method == "single":
        argv = [sys.executable, PROBE] + args
    elif framework in ("transformers", "accelerate"):  # accelerate launch --cpu: 1 process
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(PROCESSES), PROBE] + args
    else:  # Lightning starts its DDP ranks itself (sys.argv again: the probe)
        argv = [sys.executable, PROBE] + args
    return argv, env


def shown(argv, env):
    """The command line a person can paste in a directory `prepare` filled, with REPO set to
    the clone (and its python first on PATH)."""
    env = dict(env, PYTHONPATH=ROOT)
    text = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())) + " " + \
        " ".join(shlex.quote(a) for a in ["python"] + argv[1:])
    return text.replace(ROOT, "$REPO")


def job_loss(evals, workers):
    """{step: the job's eval loss} from `evals` ({reporter: {step: loss}}): DDP's one reporter,
    or the mean of platoon's workers at the steps all `workers` have evaluated."""
    steps = set.intersection(*(set(e) for e in evals.values())) \
        if len(evals) >= workers else set()
    return {s: statistics.mean(e[s] for e in evals.values()) for s in sorted(steps)}


def run_once(framework, method, lr, seed, log, target=None, cap_s=900.0):
    """One job to the target (default the framework's; then stopped) or its horizon; its
    record."""
    spec = FRAMEWORKS[framework]
    target = spec["target"] if target is None else target
    argv, extra = command(framework, method, lr, seed)
    work = tempfile.mkdtemp(prefix="upstream-race-")
    prepare(framework, work)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", **SINGLE_THREAD_ENV)
    env.update(extra)
    log("%s %s lr %g seed %d: cd %s && %s" % (framework, method, lr, seed, work,
                                                shown(argv, extra)))
    load = os.getloadavg()[0]
    began, wall = time.time(), time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timer = threading.Timer(cap_s, lambda: os.killpg(proc.pid, signal.SIGTERM))
    timer.start()
    evals, times, tail, reached = {}, {}, [], None
    workers = PROCESSES if method == "platoon" else 1
    try:
        for text in proc.stdout:
            tail = (tail + [text])[-60:]
            match = LINE.match(text)
            if not match:
                continue
            point = json.loads(match.group(2))
            who = match.group(1) or "rank%d" % point["rank"]
            evals.setdefault(who, {}).setdefault(point["step"], point["loss"])
            times[point["step"]] = max(times.get(point["step"], 0.0), point["t"] - began)
            for step, loss in job_loss(evals, workers).items():
                if loss <= target:
                    reached = [round(times[step], 1), step]
                    break
            if reached:
                os.killpg(proc.pid, signal.SIGTERM)
                break
    finally:
        timer.cancel()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        shutil.rmtree(work, ignore_errors=True)
    trace = job_loss(evals, workers)
    run = {"framework": framework, "method": method, "lr": lr, "seed": seed,
           "command": shown(argv, extra), "load_before": round(load, 2),
           "load_after": round(os.getloadavg()[0], 2),
           "wall_s": round(time.monotonic() - wall, 1), "target": target,
           "reached": reached, "trace": [[s, float("%.5g" % trace[s])] for s in trace],
           "evals": {who: sorted(e.items()) for who, e in evals.items()}}
    if reached is None and not trace:
        run["error"] = "".join(tail)[-3000:]
    log("   %s (load %.1f -> %.1f)" % (
        "target at step %d, %.1f s" % (reached[1], reached[0]) if reached else
        "error" if "error" in run else "target not reached (last %s)" % (
            run["trace"][-1] if run["trace"] else "-"), load, run["load_after"]))
    return run


def crossing(run):
    """The step at which `run`'s trace crossed its target, interpolated between the two
    evaluations around it; None when it did not."""
    previous = None
    for step, loss in run["trace"]:
        if loss <= run["target"]:
            if previous is None:
                return float(step)
            before, above = previous
            return before + (step - before) * (above - run["target"]) / (above - loss)
        previous = (step, loss)
    return None


def _median(values):
    return statistics.median(values) if values else None


def markdown(runs):
    """Per framework, method and lr: medians over its seeds of steps per process and seconds
    to the target, and platoon's ratios to DDP; then every run, with its load and command."""
    lines = ["| framework | method | lr | reached | steps per process (interpolated) | "
             "seconds | platoon / DDP steps | platoon / DDP seconds |",
             "|---|---|---|---|---|---|---|---|"]
    cells = {}
    for run in runs:
        cells.setdefault((run["framework"], run["method"], run["lr"]), []).append(run)
    medians = {}
    for key, group in cells.items():
        done = [r for r in group if r["reached"]]
        medians[key] = (_median([r["reached"][1] for r in done]),
                        _median([crossing(r) for r in done]),
                        _median([r["reached"][0] for r in done]), len(done), len(group))
    for (framework, lr, method) in sorted((f, lr, m) for f, m, lr in medians):
        steps, inter, secs, done, total = medians[(framework, method, lr)]
        ddp = medians.get((framework, "ddp", lr))
        ratio = lambda i: "%.2fx" % ((steps if i == 0 else secs) / ddp[i * 2]) \
            if method == "platoon" and ddp and ddp[i * 2] and (steps, secs)[i] else ""  # noqa
        lines.append("| %s | %s | %g | %d/%d | %s | %s | %s | %s |" % (
            framework, method, lr, done, total,
            "%g (%.0f)" % (steps, inter) if steps is not None else "-",
            "%.1f s" % secs if secs is not None else "-", ratio(0), ratio(1)))
    lines += ["", "Every run (load: the 1-minute load average as it started and as it ended, "
              "2 cores shared with other engineers' work: seconds claim nothing):", "",
              "| framework | method | lr | seed | target | steps | seconds | load | "
              "final eval loss |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append("| %s | %s | %g | %d | %g | %s | %s | %.1f -> %.1f | %s |" % (
            r["framework"], r["method"], r["lr"], r["seed"], r["target"],
            r["reached"][1] if r["reached"] else "not reached",
            "%.1f s" % r["reached"][0] if r["reached"] else "-", r["load_before"],
            r["load_after"], "%.4g at %d" % (r["trace"][-1][1], r["trace"][-1][0])
            if r["trace"] else "-"))
    lines += ["", "Commands (REPO: the clone; each run in a fresh directory holding what "
              "`prepare` writes, as `python -m benchmarks.upstream_race --framework F --only M "
              "--lrs LR --seeds S --again` does):", ""]
    seen = set()
    for r in runs:
        key = (r["framework"], r["method"], r["lr"])
        if key not in seen:
            seen.add(key)
            lines.append("- %s %s lr %g: `%s`" % (key + (r["command"],)))
    return "\n".join(lines)


def write(path, runs):
    """The record `path` (json) and its report beside it (.md)."""
    with open(path, "w") as f:
        json.dump({"meta": {"commit": git_commit(), "cpu": cpu_model(),
                            "cores": os.cpu_count()}, "runs": runs}, f, indent=1)
    write_markdown(path, runs)


def write_markdown(path, runs):
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write("# The upstream race: each framework's own example, its DDP against its "
                "platoon port\n\nWritten by `python -m benchmarks.upstream_race` (see "
                "benchmarks/upstream_race/__init__.py for what is measured).\n\n"
                + markdown(runs) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.upstream_race",
                                     description=PACKAGE_DOC.split("\n")[0])
    parser.add_argument("--framework", default=",".join(FRAMEWORKS),
                        help="comma-separated, of: %s" % ", ".join(FRAMEWORKS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--only", choices=METHODS, default=None,
                        help="run only this side (default: each in turn: DDP, platoon and "
                             "one process alone, the reference)")
    parser.add_argument("--lrs", default=None,
                        help="comma-separated lrs (default: the framework's grid)")
    parser.add_argument("--target", type=float, default=None,
                        help="the eval loss to reach (default: the framework's)")
    parser.add_argument("--again", action="store_true",
                        help="run again what the record holds already (a new record entry)")
    parser.add_argument("--report", action="store_true",
                        help="only print the markdown report of the record (and write it)")
    parser.add_argument("--out", default=RECORD, help="the json record (the .md beside it)")
    args = parser.parse_args(argv)
    runs = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)["runs"]
    if args.report:
        print(markdown(runs))
        write_markdown(args.out, runs)
        return 0
    frameworks = [f for f in args.framework.split(",") if f]
    unknown = set(frameworks) - set(FRAMEWORKS)
    if unknown:
        parser.error("unknown framework(s) %s; choose from %s" % (
            ", ".join(sorted(unknown)), ", ".join(FRAMEWORKS)))
    log = lambda text: print("..", text, flush=True)  # noqa: E731
    done = {(r["framework"], r["method"], r["lr"], r["seed"]) for r in runs}
    for framework in frameworks:
        lrs = [float(x) for x in args.lrs.split(",")] if args.lrs else \
            FRAMEWORKS[framework]["lrs"]
        for seed in [int(s) for s in args.seeds.split(",")]:
            for lr in lrs:
                for method in [args.only] if args.only else METHODS:
                    if (framework, method, lr, seed) in done and not args.again:
                        continue
                    runs.append(run_once(framework, method, lr, seed, log, args.target))
                    write(args.out, runs)
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
