"""What the transformer benchmark compares: the problem and each method with its lr grid,
every method's optimizer AdamW (the harness's members from time_to_accuracy run them)."""

from ..time_to_accuracy.methods import LOCAL_SGD_PERIOD, WORLD
from .problem import GPTText

# 64 wide, 2 layers, 4 heads, 128-byte context, batch 16: one process at lr 1.2e-2 reached
# 2.38 bits per byte in 1,800 steps and 2.33 in 2,000 (about 60 s on one idle core of the
# 2-core machine); the target is later, so that one process takes over a minute.
FULL = GPTText("stdlib-gpt", hidden=64, target=2.3, cap_s=240.0, eval_every=100, batch=16,
               bptt=128, eval_bptt=128, eval_windows=128, train_bytes=4_000_000,
               valid_bytes=1_000_000)

# AdamW with the schedule transformers are trained with: 5% warm-up, then linear decay to 0
# at step 3,200 of each process (a Trainer's default), where a run that has not reached the
# target stops.
ADAMW = {"optimizer": "adamw", "horizon": 3200}
# Around each method's best lr at a 1,600-step horizon (benchmarks/results/
# transformer_horizon1600.md): one process and DDP 1.2e-2, local SGD and EASGD 2.4e-2.
GRID = [{"lr": 6e-3}, {"lr": 1.2e-2}, {"lr": 2.4e-2}]
HIGHER = [{"lr": 1.2e-2}, {"lr": 2.4e-2}, {"lr": 4.8e-2}]
# torchft's DiLoCo: its outer step SGD(0.7, momentum 0.9, Nesterov) as in the DiLoCo paper,
# a sync every 20 or 50 inner steps (an evaluation, every 100 steps, then follows a sync).
# Every 4 steps, as local SGD and platoon sync, it diverged (lr 2.4e-2: 4.6, 4.8, 5.2 bits
# per byte at steps 100-300).
TORCHFT = [dict(g, sync_every=h) for h in (20, 50) for g in GRID]


def methods(names=None):
    """{name: (world size, fixed settings, grid)}, in the order runs alternate."""
    out = {"single": (1, dict(ADAMW), GRID),
           "ddp": (WORLD, dict(ADAMW), GRID),
           "local_sgd": (WORLD, dict(ADAMW, period=LOCAL_SGD_PERIOD), HIGHER),
           # platoon's default: EASGD(0.9/p) every 4 steps, each worker its own AdamW
           "platoon_easgd": (WORLD, dict(ADAMW, rule="easgd", alpha=0.45, tau=4), HIGHER),
           # docs/choosing-a-rule.md's AdamW setting of 2026-12-01 (issue 47): every 2 steps at
           # 1.5x one process's lr (1.2e-2), untuned here; for the straggler runs
           "platoon_easgd_every2": (WORLD, dict(ADAMW, rule="easgd", alpha=0.45, tau=2),
                                    [{"lr": 1.8e-2}]),
           "torchft_diloco": (WORLD, dict(ADAMW, outer_lr=0.7), TORCHFT)}
    return {n: v for n, v in out.items() if names is None or n in names}
