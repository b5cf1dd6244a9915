"""What the transformer benchmark compares: the problem and each method with its lr grid,
every method's optimizer AdamW (the harness's members from time_to_accuracy run them)."""

from ..time_to_accuracy.methods import LOCAL_SGD_PERIOD, WORLD
from .problem import GPTText

# 64 wide, 2 layers, 4 heads, 128-byte context, batch 16: one process reached 2.8 bits per
# byte in 800 steps (28 s on one core of the 2-core machine); the target is later.
FULL = GPTText("stdlib-gpt", hidden=64, target=2.6, cap_s=240.0, eval_every=100, batch=16,
               bptt=128, eval_bptt=128, eval_windows=128, train_bytes=4_000_000,
               valid_bytes=1_000_000)

# AdamW with the schedule transformers are trained with: 5% warm-up, then linear decay to 0
# at step 1,600 of each process (a Trainer's default), which every method's run ends before.
ADAMW = {"optimizer": "adamw", "horizon": 1600}
# Every grid whose best value was at an edge was extended past it (every one up; one
# process and DDP once, local SGD and EASGD twice).
GRID = [{"lr": 3e-3}, {"lr": 6e-3}, {"lr": 1.2e-2}]


def methods(names=None):
    """{name: (world size, fixed settings, grid)}, in the order runs alternate."""
    out = {"single": (1, dict(ADAMW), GRID + [{"lr": 2.4e-2}]),
           "ddp": (WORLD, dict(ADAMW), GRID + [{"lr": 2.4e-2}]),
           "local_sgd": (WORLD, dict(ADAMW, period=LOCAL_SGD_PERIOD),
                         GRID + [{"lr": 2.4e-2}, {"lr": 4.8e-2}]),
           # platoon's default: EASGD(0.9/p) every 4 steps, each worker its own AdamW
           "platoon_easgd": (WORLD, dict(ADAMW, rule="easgd", alpha=0.45, tau=4),
                             GRID + [{"lr": 2.4e-2}, {"lr": 4.8e-2}])}
    return {n: v for n, v in out.items() if names is None or n in names}
