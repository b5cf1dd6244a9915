"""What the slow-link benchmark trains: the language model's byte-level LSTM with SGD and
momentum (the default), or the transformer benchmark's byte-level GPT with AdamW and its
warm-up and linear decay; each with the lrs of its own tuning record."""

import os
from dataclasses import dataclass, field

from .._util import ROOT
from ..transformer.methods import ADAMW

RESULTS = os.path.join(ROOT, "benchmarks", "results")


@dataclass(frozen=True)
class Workload:
    """`cfg`: the optimizer settings every method's workers get; `lr_names`: the name in the
    tuning record of each method (by its name, else by its `lr_from`), where they differ."""
    name: str
    stem: str
    tuning: str
    cfg: dict
    lr_names: dict = field(default_factory=dict)
    description: str = ""

    def problem(self, quick=False):
        if self.name == "transformer":
            from ..transformer.methods import FULL
            if quick:
                raise ValueError("--quick has no transformer problem: run the full one")
            return FULL
        from ..language_model.methods import FULL, QUICK
        return QUICK if quick else FULL

    def lr_name(self, method_name, method):
        return self.lr_names.get(method_name, self.lr_names.get(method.lr_from,
                                                                  method.lr_from))


LSTM = Workload(
    "lstm", "slow_link", os.path.join(RESULTS, "language_model_tuning.json"),
    {"momentum": 0.9},
    description="momentum 0.9 everywhere; platoon's workers EAMSGD (EASGD 0.45 every 4 "
                "steps)")
TRANSFORMER = Workload(
    "transformer", "slow_link_transformer", os.path.join(RESULTS, "transformer_tuning.json"),
    dict(ADAMW),  # AdamW and the transformer benchmark's horizon
    {"single_momentum": "single", "ddp_momentum": "ddp", "local_sgd": "local_sgd",
     "platoon_eamsgd": "platoon_easgd"},
    description="AdamW (weight decay 0.01, gradients clipped at norm 1) with the transformer "
                "benchmark's warm-up and linear decay everywhere; platoon's workers EASGD "
                "0.45 every 4 steps, each with its own AdamW;")
WORKLOADS = {w.name: w for w in (LSTM, TRANSFORMER)}


def optimizer_settings(workload):
    """The settings `workload`'s workers are trained with (a copy)."""
    return dict(workload.cfg)
