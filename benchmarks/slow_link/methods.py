"""What the slow-link benchmark races: each method's kind, its lr (from the language model's
tuning record) and, for platoon, just the extra options of `python -m platoon.mpi`; which
(method, link) pairs the default run measures; and an estimate of a run's duration."""

import json
from dataclasses import dataclass, field
from typing import Tuple

TIE_EVERY_S = 1.0  # rounds come at most this often (a longer round is followed at once)


@dataclass(frozen=True)
class Method:
    """`kind`: "single" (one process), "ddp", "local_sgd" (gloo, one process per host) or
    "platoon" (one rank per host under `python -m platoon.mpi --workers 1`). The workers'
    optimizer is torch SGD(lr, momentum 0.9), lr as tuned for `lr_from` in the language
    model's record, times `lr_times`. `options`: platoon.mpi's options after `--workers 1`;
    `settings`: the worker's (platoon: its sync rule; local SGD: its period)."""
    kind: str
    lr_from: str
    options: Tuple[str, ...] = ()
    settings: dict = field(default_factory=dict)
    note: str = ""
    one_host: str = ""  # whose one-host time its "vs one host" divides by (default: its own)
    lr_times: float = 1.0

    def needs_link(self):
        return self.kind != "single"


def _platoon(*options, note="", one_host=""):
    # The workers: EAMSGD as in benchmarks/language_model/methods.py (EASGD(0.45) every 4
    # steps, heavy-ball momentum 0.9 in their optimizer).
    return Method("platoon", "platoon_eamsgd",
                  ("--tie-every-s", "%g" % TIE_EVERY_S) + tuple(options),
                  {"rule": "easgd", "alpha": 0.45, "tau": 4}, note, one_host)


def _advised(*options, note=""):
    # The AdamW advice of docs/choosing-a-rule.md (benchmarks/results/advice_2026-12-01.md):
    # EASGD(0.45) every 2 steps, the workers at 1.5x one process's lr (not tuned here).
    return Method("platoon", "single_momentum",
                  ("--tie-every-s", "%g" % TIE_EVERY_S) + tuple(options),
                  {"rule": "easgd", "alpha": 0.45, "tau": 2}, note, lr_times=1.5)


_DILOCO = ("--tie-outer", "diloco", "--tie-outer-lr", "0.7", "--tie-outer-momentum", "0.9")
METHODS = {
    "single": Method("single", "single_momentum", note="one process, no link"),
    "ddp": Method("ddp", "ddp_momentum", note="torch DDP, gloo"),
    # No lr is recorded for local SGD with momentum: DDP's (which EAMSGD also chose).
    "local_sgd": Method("local_sgd", "ddp_momentum", settings={"period": 16},
                        note="torch PeriodicModelAverager, gloo; lr as ddp_momentum's"),
    "platoon_easgd_f32": _platoon("--tie-compress", "float32",
                                  note="EASGD tie, float32"),
    # int8 on one host would only cost time: its "vs one host" is against float32's.
    "platoon_easgd_int8": _platoon("--tie-compress", "int8", note="EASGD tie, int8",
                                   one_host="platoon_easgd_f32"),
    "platoon_diloco_f32": _platoon(*_DILOCO, "--tie-compress", "float32",
                                   note="DiLoCo outer step, float32"),
    "platoon_diloco_int8": _platoon(*_DILOCO, "--tie-compress", "int8",
                                    note="DiLoCo outer step, int8",
                                    one_host="platoon_diloco_f32"),
    "platoon_easgd_every2_f32": _advised(
        "--tie-compress", "float32",
        note="EASGD tie, float32; workers every 2 steps at 1.5x one process's lr (the AdamW "
             "advice)"),
}
LINKS = ("none", "10mbit", "100mbit", "1gbit")

# The default measured run (about 25 minutes on the 2-core machine, 1 repetition): one
# process; platoon's float32 methods on one host; every platoon method across 100 and 10
# Mbit/s with DDP beside them (and local SGD at 100 Mbit/s); at 1 Gbit/s DDP and platoon's
# float32 EASGD. Left out by default (name them with --methods/--links): local SGD at 10
# Mbit/s and 1 Gbit/s (at 10 Mbit/s it reaches the cap, as DDP does), the int8 methods on
# one host, the other platoon methods at 1 Gbit/s, DDP on one host, and the AdamW advice's
# method (platoon_easgd_every2_f32: name it with the transformer workload).
PLATOON = [n for n in METHODS if n.startswith("platoon_") and METHODS[n].lr_times == 1.0]
DEFAULT_PAIRS = ([("single", "none"), ("platoon_easgd_f32", "none"),
                  ("platoon_diloco_f32", "none")]
                 + [(m, "100mbit") for m in ["ddp", "local_sgd"] + PLATOON]
                 + [(m, "10mbit") for m in ["ddp"] + PLATOON]
                 + [("ddp", "1gbit"), ("platoon_easgd_f32", "1gbit")])


def define(spec):
    """Add (or replace) a platoon method from "NAME=OPTIONS" (OPTIONS: platoon.mpi's options,
    shell-quoted, e.g. "platoon_int8_fast=--tie-every-s 0.25 --tie-compress int8"), with
    EAMSGD workers as the others; returns its name. Raises ValueError for a bad spec."""
    import shlex
    name, sep, options = spec.partition("=")
    if not sep or not name.startswith("platoon_") or not options.strip():
        raise ValueError("--define %r: give NAME=OPTIONS with NAME starting platoon_" % spec)
    METHODS[name] = Method("platoon", "platoon_eamsgd", tuple(shlex.split(options)),
                           {"rule": "easgd", "alpha": 0.45, "tau": 4}, "defined: " + options)
    return name


def pairs(methods=None, links=None):
    """The (method, link) pairs to run: the default ones, or every valid pair of the
    `methods` and `links` given (a single process only runs without a link; the others
    without one only if "none" is asked for). Raises ValueError for unknown names."""
    for name in methods or ():
        if name not in METHODS:
            raise ValueError("unknown method %r; choose from %s" % (name, ", ".join(METHODS)))
    for link in links or ():
        if link not in LINKS:
            raise ValueError("unknown link %r; choose from %s" % (link, ", ".join(LINKS)))
    if methods is None and links is None:
        return list(DEFAULT_PAIRS)
    if methods is None:
        return [p for p in DEFAULT_PAIRS if p[1] in links]
    links = links or [lk for lk in LINKS if lk != "1gbit"]
    out = []
    for link in sorted(set(links), key=LINKS.index):
        for name in methods:
            if link == "none" or METHODS[name].needs_link():
                out.append((name, link))
    return out


def learning_rates(workload=None):
    """{method: lr} from the tuning record of `workload` (default: the language model's LSTM);
    KeyError naming what is missing."""
    from .workloads import LSTM
    workload = workload or LSTM
    with open(workload.tuning) as f:
        chosen = json.load(f)["chosen"]
    out = {}
    for name, method in METHODS.items():
        key = workload.lr_name(name, method)
        if key not in chosen:
            raise KeyError("%s has no lr for %s (%s needs it)" % (workload.tuning, key, name))
        out[name] = chosen[key]["lr"] * method.lr_times
    return out


def unsupported(method, platoon_help):
    """The options of `method` that `python -m platoon.mpi --help` does not list (empty when
    it runs on this checkout)."""
    return [o for o in method.options if o.startswith("--") and o not in platoon_help]


# -- an estimate of a run's duration --------------------------------------------------------

STARTUP_S = {"single": 8.0, "ddp": 12.0, "local_sgd": 12.0, "platoon": 18.0}
# Steps per worker to the FULL target and seconds per step on an idle core, from
# benchmarks/results/language_model.md (platoon across a link: 1.2x its one-host steps).
FULL_STEPS = {"single": 3000, "ddp": 2000, "local_sgd": 2800, "platoon": 1500}
FULL_STEP_S = 0.018


def estimate_s(name, link, cap_s, model_bytes, quick=False, eval_s=0.3, eval_every=100):
    """A rough duration of one run in seconds: start-up, plus the time to target (compute,
    plus for DDP and local SGD the model crossing the link each step or period) capped at
    `cap_s`, plus evaluation time (`eval_s` every `eval_every` steps) and teardown."""
    method = METHODS[name]
    steps = FULL_STEPS[method.kind] * (0.25 if quick else 1.0)
    step_s = FULL_STEP_S * (0.4 if quick else 1.0)
    rate = {"none": None, "10mbit": 10e6, "100mbit": 100e6, "1gbit": 1e9}[link]
    if rate and method.kind in ("ddp", "local_sgd"):
        per_step = model_bytes * 8 / rate
        step_s += per_step / method.settings.get("period", 1)
    elif rate and method.kind == "platoon":
        steps *= 1.2
    train = min(cap_s, steps * step_s)
    evals = train / step_s / eval_every * eval_s * (0.3 if quick else 1.0)
    return STARTUP_S[method.kind] + train + evals + 3.0


def default_cap_s(quick):
    return 45.0 if quick else 240.0


def model_bytes_of(problem):
    """Bytes of the model's float32 parameters (an LSTM's computed from the sizes, without
    torch; another model's counted)."""
    if not hasattr(problem, "embed"):
        return 4 * sum(p.numel() for p in problem.model(0).parameters())
    h, e = problem.hidden, problem.embed
    lstm = 4 * h * (e + h) + 2 * 4 * h
    return 4 * (256 * e + lstm + h * 256 + 256)

