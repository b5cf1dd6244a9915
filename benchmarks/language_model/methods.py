"""What the language-model benchmark compares: the problem's sizes and targets, and each
method with its learning-rate grid (the harness's members from time_to_accuracy run them)."""

from ..time_to_accuracy.methods import LOCAL_SGD_PERIOD, WORLD
from .problem import Text

# One process of plain SGD (clipped at norm 1) reaches 2.2 bits per byte in about 50-60 s on
# one idle core of the 2-core machine; `--quick` is a smaller model to an earlier target.
FULL = Text("stdlib", hidden=256, target=2.2, cap_s=150.0, eval_every=100, batch=16)
QUICK = Text("stdlib-quick", hidden=64, target=2.9, cap_s=20.0, eval_every=40, batch=8,
             bptt=32, train_bytes=1_000_000, eval_windows=64)

LR_GRID = [{"lr": 5.0}, {"lr": 10.0}, {"lr": 20.0}]
# With heavy-ball momentum 0.9 (EAMSGD's workers, and the baselines given the same for a fair
# comparison): a step is about 10x its lr.
MOMENTUM_GRID = [{"lr": 1.0}, {"lr": 2.0}, {"lr": 4.0}]
# Every platoon mode syncs every `tau` steps; the workers' optimizer is torch SGD(lr) with
# the `momentum` given (0 unless said), clipped like the others'.
PLATOON = {
    # Today's recommendation: EASGD(0.9/p), tau 4, the workers' lr tuned (it was 2x the single
    # process's on digits).
    "platoon_easgd": ({"rule": "easgd", "alpha": 0.45, "tau": 4}, LR_GRID + [{"lr": 40.0}]),
    # EAMSGD (Zhang et al. 2015): the same with Nesterov-free heavy-ball momentum 0.9 in each
    # worker's optimizer; lr a tenth (momentum 0.9 multiplies a step by about 10).
    "platoon_eamsgd": ({"rule": "easgd", "alpha": 0.45, "tau": 4, "momentum": 0.9},
                       MOMENTUM_GRID),
    # ASGD: each worker pushes its change over tau steps to the centre in full and takes
    # the centre back (asynchronous local SGD without averaging): the single lr grid.
    "platoon_asgd": ({"rule": "asgd", "tau": 4}, [{"lr": 1.25}, {"lr": 2.5}] + LR_GRID),
    # Downpour: the pushed change is a gradient for a centre that steps with SGD(server_lr,
    # Nesterov momentum 0.9): momentum amplifies the workers' steps, so a lower grid.
    "platoon_downpour_nesterov": ({"rule": "downpour_nesterov", "server_lr": 0.2, "tau": 4},
                                  [{"lr": 1.25}, {"lr": 2.5}, {"lr": 5.0}]),
    # DiLoCo: each push is 1/p of a synchronous outer Nesterov step (outer lr 0.7, momentum
    # 0.9): amplifies more, a lower grid still.
    "platoon_diloco": ({"rule": "diloco", "outer_lr": 0.7, "tau": 4},
                       [{"lr": 1.0}, {"lr": 2.0}, {"lr": 4.0}]),
}


def methods(names=None):
    """{name: (world size, fixed settings, grid)}, in the order runs alternate."""
    # Every grid whose best value was at an edge was extended past it: one process and one
    # process with momentum down once, Hogwild and ASGD down twice, EASGD up once.
    out = {"single": (1, {}, [{"lr": 2.5}] + LR_GRID),
           "hogwild": (WORLD, {}, [{"lr": 1.25}, {"lr": 2.5}] + LR_GRID),
           "ddp": (WORLD, {}, LR_GRID),
           "local_sgd": (WORLD, {"period": LOCAL_SGD_PERIOD}, LR_GRID),
           "single_momentum": (1, {"momentum": 0.9}, [{"lr": 0.25}, {"lr": 0.5}] + MOMENTUM_GRID),
           "ddp_momentum": (WORLD, {"momentum": 0.9}, MOMENTUM_GRID)}
    for name, (fixed, grid) in PLATOON.items():
        out[name] = (WORLD, dict(fixed), grid)
    return {n: v for n, v in out.items() if names is None or n in names}


# What the measured run takes by default: every tuned method.
MEASURED = list(methods())
