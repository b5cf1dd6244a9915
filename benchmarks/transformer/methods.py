"""What the transformer benchmark compares: the problem and each method with its lr grid,
every method's optimizer AdamW (the harness's members from time_to_accuracy run them)."""

from ..time_to_accuracy.methods import LOCAL_SGD_PERIOD, WORLD
from .problem import GPTText

# 64 wide, 2 layers, 4 heads, 128-byte context, batch 16: one process reaches 2.8 bits per
# byte in about a minute and a half on one idle core of the 2-core machine (3.0 in 24 s).
FULL = GPTText("stdlib-gpt", hidden=64, target=2.8, cap_s=240.0, eval_every=100, batch=16,
               bptt=128, eval_bptt=128, eval_windows=128, train_bytes=4_000_000,
               valid_bytes=1_000_000)

ADAMW = {"optimizer": "adamw"}
GRID = [{"lr": 3e-3}, {"lr": 6e-3}, {"lr": 1.2e-2}]


def methods(names=None):
    """{name: (world size, fixed settings, grid)}, in the order runs alternate."""
    out = {"single": (1, dict(ADAMW), GRID),
           "ddp": (WORLD, dict(ADAMW), GRID),
           "local_sgd": (WORLD, dict(ADAMW, period=LOCAL_SGD_PERIOD), GRID),
           # platoon's default for AdamW: PeriodicSync without a rule (the centre runs AdamW),
           # each step's gradient
           "platoon_periodic_default": (WORLD, dict(ADAMW, tau=1), GRID),
           # the default before it: EASGD(0.9/p) every 4 steps, each worker its own AdamW
           "platoon_easgd": (WORLD, dict(ADAMW, rule="easgd", alpha=0.45, tau=4), GRID)}
    return {n: v for n, v in out.items() if names is None or n in names}
