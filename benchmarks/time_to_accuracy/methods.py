"""What the time-to-accuracy benchmark compares: datasets, the model, and each method's
part of a training process (set up, sync after a step, the model to evaluate, stopping),
with its learning-rate grid."""

import time
from dataclasses import dataclass

import numpy as np

from .member import Member

WORLD = 2  # processes of every multi-process method


# -- platoon's modes: one line per sync rule ------------------------------------------------

def _easgd(cfg):
    from platoon import EASGD
    return EASGD(cfg["alpha"])


def _downpour_nesterov(cfg):
    from platoon import SGD, Downpour
    return Downpour(SGD(cfg["server_lr"], momentum=0.9, nesterov=True))


def _diloco(cfg):
    from platoon import DiLoCo
    return DiLoCo(outer_lr=cfg["outer_lr"], momentum=0.9, nesterov=True)


# name: (rule factory, fixed settings, grid of three). Every mode syncs every `tau` steps;
# the worker's own optimizer is plain torch SGD(lr). Add a rule here to benchmark it.
PLATOON_MODES = {
    # The elastic pull damps the workers' steps: a grid one step higher (it chose 0.8, the
    # top of 0.2-0.8, on both datasets).
    "easgd": (_easgd, {"alpha": 0.45, "tau": 4}, [{"lr": 0.4}, {"lr": 0.8}, {"lr": 1.6}]),
    # The centre's Nesterov momentum amplifies the workers' steps: a lower grid.
    "downpour_nesterov": (_downpour_nesterov, {"server_lr": 0.2, "tau": 4},
                          [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.4}]),
    # Outer momentum amplifies more still (it chose 0.1, the bottom of 0.1-0.4).
    "diloco": (_diloco, {"outer_lr": 0.7, "tau": 4}, [{"lr": 0.05}, {"lr": 0.1}, {"lr": 0.2}]),
}

def _asgd(cfg):
    from platoon import ASGD
    return ASGD()


def _delayed_nesterov(cfg):
    from platoon import DelayedNesterov
    return DelayedNesterov(outer_lr=cfg["outer_lr"])


# Every rule a platoon mode may name with its "rule" setting (default: the mode's own name).
RULES = dict({mode: factory for mode, (factory, _, _) in PLATOON_MODES.items()},
             asgd=_asgd, delayed_nesterov=_delayed_nesterov)

LR_GRID = [{"lr": 0.2}, {"lr": 0.4}, {"lr": 0.8}]
LOCAL_SGD_PERIOD = 4  # PeriodicModelAverager's period, as platoon's tau


@dataclass
class Dataset:
    """A problem: data, MLP sizes, target accuracy, evaluation period and time cap.

    The harness asks a problem only for what its methods below provide (`load`, `model`,
    `trainer`, `reached`, `shortfall`), so another problem (benchmarks/language_model)
    subclasses this one and overrides them."""
    name: str
    hidden: int
    target: float
    cap_s: float
    eval_every: int  # steps; a multiple of every sync period
    batch: int = 32

    def load(self):
        """The problem's data, as numpy arrays (forked children inherit them)."""
        return load(self)

    def model(self, seed):
        """A freshly initialised model; the same `seed` gives the same model."""
        n_in = 64 if self.name == "digits" else 40
        return mlp((n_in, self.hidden, self.hidden, 10), seed)

    def trainer(self, data, seed):
        """(step(net, optimizer, k), evaluate(net) -> metric) over `data`, the minibatch
        sequence drawn with `seed`."""
        import torch
        import torch.nn.functional as F
        xtr, ytr, xte, yte = (torch.from_numpy(a) for a in data)
        rng = np.random.default_rng(seed)
        batches = torch.from_numpy(rng.integers(0, len(ytr), (4096, self.batch)))

        def step(net, optimizer, k):
            idx = batches[k % len(batches)]
            optimizer.zero_grad()
            F.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
            optimizer.step()

        def evaluate(net):
            with torch.no_grad():
                return float((net(xte).argmax(1) == yte).float().mean())
        return step, evaluate

    def reached(self, metric):
        """Whether `metric` (what `evaluate` returned) is at the target."""
        return metric >= self.target

    def shortfall(self, metric):
        """How far `metric` is from the target; ranks runs that missed it (lower is better)."""
        return self.target - metric


# Targets a single process reaches in 1-2 s on an idle core (digits 97%: about 150 steps of
# 7 ms; MNIST-1D 65%: about 1100 steps of 1.5 ms).
FULL = [Dataset("digits", 1024, 0.97, 6.0, 8), Dataset("mnist1d", 256, 0.65, 8.0, 20)]
QUICK = [Dataset("digits", 256, 0.95, 4.0, 8), Dataset("mnist1d", 128, 0.55, 4.0, 20)]


def methods():
    """{name: (world size, fixed settings, grid)}, in the order runs alternate."""
    out = {"single": (1, {}, LR_GRID), "hogwild": (WORLD, {}, LR_GRID),
           "ddp": (WORLD, {}, LR_GRID), "local_sgd": (WORLD, {"period": LOCAL_SGD_PERIOD},
                                                      LR_GRID)}
    for mode, (_, fixed, grid) in PLATOON_MODES.items():
        out["platoon_" + mode] = (WORLD, dict(fixed), grid)
    return out


# -- data -----------------------------------------------------------------------------------

def load(dataset):
    """(x_train, y_train, x_test, y_test) as float32 / int64 numpy arrays."""
    if dataset.name == "digits":
        from ..mlp import load_digits_split
        return load_digits_split()
    if dataset.name == "mnist1d":
        try:
            import mnist1d.data
        except ImportError:
            raise SystemExit("MNIST-1D needs the mnist1d package: pip install -e '.[bench]' "
                             "(or --datasets digits)") from None
        # generated offline, about 3 s
        d = mnist1d.data.make_dataset(mnist1d.data.get_dataset_args())
        return (d["x"].astype(np.float32), d["y"].astype(np.int64),
                d["x_test"].astype(np.float32), d["y_test"].astype(np.int64))
    raise ValueError("unknown dataset %r: choose digits or mnist1d" % dataset.name)



def mlp(sizes, seed):
    import torch
    torch.manual_seed(seed)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)



class Hogwild(Member):
    def agree_stop(self, stop):
        if stop:
            self.stop_event.set()
        return self.stop_event.is_set()


class Collective(Member):
    """DDP and local SGD: a gloo process group; stopping is agreed by an all_reduce."""

    def setup(self):
        import datetime

        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=self.job.address, rank=self.rank,
                                world_size=self.job.world,
                                timeout=datetime.timedelta(seconds=60))
        return self.model

    def agree_stop(self, stop):
        import torch
        import torch.distributed as dist
        flag = torch.tensor([1.0 if stop else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def close(self):
        import torch.distributed as dist
        dist.destroy_process_group()


class DDP(Collective):
    def setup(self):
        from torch.nn.parallel import DistributedDataParallel
        super().setup()
        self.ddp = DistributedDataParallel(self.model)
        return self.ddp


class LocalSGD(Collective):
    def setup(self):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        super().setup()
        self.averager = PeriodicModelAverager(period=self.job.cfg["period"], warmup_steps=0)
        self.sync_s = 0.0
        return self.model

    def after_step(self, step):
        start = time.perf_counter()
        self.averager.average_parameters(self.model.parameters())
        self.sync_s += time.perf_counter() - start
        return True

    def stats(self):
        return {"sync_s": self.sync_s}


class PlatoonMember(Member):
    """A platoon worker: the torch parameters shared with the centre as numpy views
    (`p.detach().numpy()`), synced every `tau` steps; asks the controller whether to go on."""

    def setup(self):
        from platoon import Worker
        mode = self.job.cfg.get("rule", self.job.method[len("platoon_"):])
        rule = RULES[mode](self.job.cfg)
        self.worker = Worker(self.job.address, timeout_s=60)
        self.views = [p.detach().numpy() for p in self.model.parameters()]
        self.worker.init_shared_params(self.views, rule)
        self.centre = self.job.dataset.model(0)  # what rank 0 evaluates
        self.sync_s = 0.0
        return self.model

    def after_step(self, step):
        if step % self.job.cfg["tau"] == 0:
            start = time.perf_counter()
            self.worker.sync_params()
            self.sync_s += time.perf_counter() - start
        return True

    def eval_model(self):
        if self.rank:
            return self.model
        import torch
        with self.worker.lock(timeout_s=30), torch.no_grad():
            for p, c in zip(self.centre.parameters(), self.worker.shared_params):
                p.copy_(torch.from_numpy(c))
        return self.centre

    def agree_stop(self, stop):
        """Like the others' stop agreement: at every evaluation each worker asks the
        controller for more work; rank 0 first tells it to stop when it is done."""
        if stop:
            self.worker.send_req("stop")
        return self.worker.send_req("next") == "stop"

    def stats(self):
        s = self.worker.sync_stats
        return {"sync_s": self.sync_s, "syncs": s.syncs, "lock_wait_s": s.lock_wait_s,
                "lock_hold_s": s.lock_hold_s}

    def close(self):
        self.worker.close()


def member_class(method):
    """The Member subclass of `method`; a "_momentum" suffix names the same method (its
    optimizer's momentum is in its settings)."""
    if method.startswith("platoon_"):
        return PlatoonMember
    if method == "torchft_diloco":
        from .torchft_diloco import TorchftDiLoCo
        return TorchftDiLoCo
    method = method[:-len("_momentum")] if method.endswith("_momentum") else method
    return {"single": Member, "hogwild": Hogwild, "ddp": DDP, "local_sgd": LocalSGD}[method]

