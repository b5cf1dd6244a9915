"""Time to a target test accuracy: platoon against what users would pick instead.

usage: python -m benchmarks.time_to_accuracy [--quick] [--datasets digits,mnist1d]
                                            [--reps N] [--out DIR]

Methods, each with its learning rate (or platoon's own knob) tuned over a grid
of three values: one process of plain torch SGD; Hogwild (a shared model,
2 processes, lock-free); DDP over gloo (2 processes); local SGD with torch's
PeriodicModelAverager (gloo, 2 processes); platoon with 2 worker processes
and a controller process, one entry per sync rule in PLATOON_MODES. Then a
straggler run: one of the two processes sleeps after each step for as long
as its measured step time (2x slower), and each multi-process method's time
to target is divided by its time without.

How it is timed, the same for every method:
- every process is forked from this one (torch already imported), builds its
  model, joins its group (process group, platoon controller), warms up, then
  all wait on one barrier; the clock starts at the barrier. Start-up is
  reported separately ("setup").
- every `eval_every` steps every process evaluates a model on the test set
  (rank 0 the one the method produces: the single model, the shared one, the
  centre; the others their own, so that every process pauses alike) and
  subtracts its evaluation time from its clock. Stopping is decided there.
- each process is single-threaded (torch.set_num_threads(1), SINGLE_THREAD_ENV).
- all methods alternate within each repetition (seeds differ between
  repetitions and from the tuning runs), so machine load hits all alike.

Writes benchmarks/results/time_to_accuracy.json and .md (with --quick:
time_to_accuracy_quick.*) and, for a full run, docs/time-to-accuracy.md.
`--render` rewrites the .md and the docs page from the JSON only.
"""

import os

from ._util import ROOT, SINGLE_THREAD_ENV
from .record import cpu_model, git_commit

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import queue  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
DOC = os.path.join(ROOT, "docs", "time-to-accuracy.md")
COMMAND = "python -m benchmarks.time_to_accuracy"
WORLD = 2  # processes of every multi-process method

# The goals this benchmark checks (docs/time-to-accuracy.md shows met / not met).
GOAL_VS_SINGLE = 0.55   # best platoon mode's time <= this x the best-tuned single process
GOAL_VS_HOGWILD = 1.0   # ... and <= this x Hogwild's
GOAL_STRAGGLER = 1.2    # platoon with a 2x straggler <= this x its all-fast time


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

LR_GRID = [{"lr": 0.2}, {"lr": 0.4}, {"lr": 0.8}]
LOCAL_SGD_PERIOD = 4  # PeriodicModelAverager's period, as platoon's tau


@dataclass
class Dataset:
    """A problem: data, MLP sizes, target accuracy, evaluation period and time cap."""
    name: str
    hidden: int
    target: float
    cap_s: float
    eval_every: int  # steps; a multiple of every sync period
    batch: int = 32


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
        from .mlp import load_digits_split
        return load_digits_split()
    if dataset.name == "mnist1d":
        try:
            import mnist1d.data
        except ImportError:
            raise SystemExit("MNIST-1D needs the mnist1d package: pip install -e '.[bench]' "
                             "(or --datasets digits)") from None
        d = mnist1d.data.make_dataset(mnist1d.data.get_dataset_args())  # generated offline, about 3 s
        return (d["x"].astype(np.float32), d["y"].astype(np.int64),
                d["x_test"].astype(np.float32), d["y_test"].astype(np.int64))
    raise ValueError("unknown dataset %r: choose digits or mnist1d" % dataset.name)


# -- what runs in each forked process --------------------------------------------------------

@dataclass
class Job:
    """One training run of one method, as every process of it sees it."""
    method: str
    cfg: dict
    seed: int
    straggler: bool
    cap_s: float
    dataset: Dataset
    world: int
    address: str = ""  # DDP / local SGD: the tcp:// rendezvous; platoon: the controller


def _model(sizes, seed):
    import torch
    torch.manual_seed(seed)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class _Member:
    """The method-specific part of one process: set up, sync after a step, the model to
    evaluate, agree on stopping, close. The plain single process is this base class."""

    def __init__(self, job, rank, model):
        self.job, self.rank, self.model = job, rank, model
        self.stop_event = None

    def setup(self):
        return self.model

    def after_step(self, step):
        """Sync if it is time; returns False when told to stop."""
        return True

    def eval_model(self):
        return self.model

    def agree_stop(self, stop):
        """Called at every evaluation by every process; rank 0's `stop` decides."""
        return stop

    def stats(self):
        return {}

    def close(self):
        pass


class _Hogwild(_Member):
    def agree_stop(self, stop):
        if stop:
            self.stop_event.set()
        return self.stop_event.is_set()


class _Collective(_Member):
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


class _DDP(_Collective):
    def setup(self):
        from torch.nn.parallel import DistributedDataParallel
        super().setup()
        self.ddp = DistributedDataParallel(self.model)
        return self.ddp


class _LocalSGD(_Collective):
    def setup(self):
        from torch.distributed.algorithms.model_averaging.averagers import \
            PeriodicModelAverager
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


class _Platoon(_Member):
    """A platoon worker: the torch parameters shared with the centre as numpy views
    (`p.detach().numpy()`), synced every `tau` steps; asks the controller whether to go on."""

    def setup(self):
        from platoon import Worker
        rule = PLATOON_MODES[self.job.method[len("platoon_"):]][0](self.job.cfg)
        self.worker = Worker(self.job.address, timeout_s=60)
        self.views = [p.detach().numpy() for p in self.model.parameters()]
        self.worker.init_shared_params(self.views, rule)
        self.centre = _model(_sizes(self.job), 0)  # what rank 0 evaluates
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


def _member_class(method):
    if method.startswith("platoon_"):
        return _Platoon
    return {"single": _Member, "hogwild": _Hogwild, "ddp": _DDP, "local_sgd": _LocalSGD}[method]


def _sizes(job):
    d = job.dataset
    n_in = 64 if d.name == "digits" else 40
    return (n_in, d.hidden, d.hidden, 10)


def _accuracy(model, x, y):
    import torch
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _own_session(stacks_after_s):
    """Make this forked child die with the benchmark and run in a session of its own: with
    the kernel's autogroup scheduling, CPU is shared fairly between sessions, so under load
    from elsewhere two processes of one session would get the CPU of one. Print every
    thread's stack to stderr if still running after `stacks_after_s` (a hang's diagnosis)."""
    import faulthandler

    from platoon.process import die_with_parent
    die_with_parent(signal.SIGKILL)
    os.setsid()
    if stacks_after_s:
        faulthandler.dump_traceback_later(stacks_after_s, exit=False)


def _member_main(job, rank, data, shared_model, barrier, results, stop_event):
    """Body of one forked process: train until rank 0 reaches the target or the cap."""
    forked = time.monotonic()
    _own_session(job.cap_s + 60)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(1)
        xtr, ytr, xte, yte = (torch.from_numpy(a) for a in data)
        model = shared_model if shared_model is not None else _model(_sizes(job), job.seed)
        member = _member_class(job.method)(job, rank, model)
        member.stop_event = stop_event
        trained = member.setup()
        opt = torch.optim.SGD(trained.parameters(), lr=job.cfg["lr"])
        rng = np.random.default_rng(1000 * job.seed + rank)
        batches = torch.from_numpy(rng.integers(0, len(ytr), (4096, job.dataset.batch)))

        def step(net, optimizer, k):
            idx = batches[k % len(batches)]
            optimizer.zero_grad()
            F.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
            optimizer.step()

        # Warm up on a throwaway copy and measure the compute time of one step.
        spare = _model(_sizes(job), job.seed + 1)
        spare_opt = torch.optim.SGD(spare.parameters(), lr=job.cfg["lr"])
        times = []
        for k in range(8):
            start = time.perf_counter()
            step(spare, spare_opt, k)
            times.append(time.perf_counter() - start)
        _accuracy(spare, xte, yte)
        step_s = statistics.median(times[3:])
        delay = step_s if job.straggler and rank == 1 else 0.0
        ready = time.monotonic()
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        eval_s, steps, trace, reached = 0.0, 0, [], None
        every, cap, target = job.dataset.eval_every, job.cap_s, job.dataset.target
        while True:
            step(trained, opt, steps)
            steps += 1
            if delay:
                time.sleep(delay)
            go_on = member.after_step(steps)
            if steps % every == 0 or not go_on:
                start = time.monotonic()
                acc = _accuracy(member.eval_model(), xte, yte)
                clock = start - t0 - eval_s
                if rank == 0:
                    trace.append((round(clock, 4), steps, round(acc, 4)))
                    if reached is None and acc >= target:
                        reached = (clock, steps)
                stop = member.agree_stop(rank == 0 and (reached is not None or clock >= cap))
                eval_s += time.monotonic() - start
                if stop or not go_on:
                    break
        clock = time.monotonic() - t0 - eval_s
        out = {"rank": rank, "steps": steps, "clock_s": clock, "step_s": step_s,
               "setup_s": ready - forked, "eval_s": eval_s, "trace": trace,
               "reached": reached}
        out.update(member.stats())
        results.put(("ok", rank, out))
        member.close()
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
    # Exit without running torch's destructors: a gloo group's teardown once hung past its
    # peer's exit. What was put is flushed first.
    results.close()
    results.join_thread()
    os._exit(0)


def _controller_main(conn):
    """A platoon controller: answers "next" with "train" until a worker asks to "stop"."""
    from platoon import Controller
    _own_session(None)

    class Stopper(Controller):
        stopped = False

        def handle_control(self, req, worker_id, req_info):
            if req == "stop":
                self.stopped = True
                return None
            if req == "next":
                return "stop" if self.stopped else "train"
            raise ValueError("unknown request %r" % (req,))

    with Stopper(control_port=0, num_workers=WORLD, transport="ipc") as ctl:
        conn.send(ctl.control_address)
        ctl.serve(timeout_s=300)


# -- the parent: one run --------------------------------------------------------------------

def prewarm():
    """Import and initialise in this process what every child would otherwise load lazily
    (torch's first optimizer step imports its compiler stack: seconds), so children start
    in milliseconds."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.functional as F
    from torch.distributed.algorithms.model_averaging import averagers  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401

    import platoon
    for name in ("Controller", "Worker", "EASGD", "Downpour", "SGD", "DiLoCo"):
        getattr(platoon, name)
    torch.set_num_threads(1)
    model = _model((4, 8, 8, 2), 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(torch.zeros(2, 4)), torch.zeros(2, dtype=torch.int64)).backward()
    opt.step()


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def run_one(ctx, job, data):
    """Run `job` in fresh processes; returns rank 0's result with every rank's stats, or
    {"error": ...}. Start-up is outside the timed window."""
    procs, extra = [], []
    results = ctx.Queue()
    barrier = ctx.Barrier(job.world)
    stop_event = ctx.Event()
    shared = rendezvous = None
    try:
        if job.method == "hogwild":
            shared = _model(_sizes(job), job.seed)
            shared.share_memory()
        elif job.method in ("ddp", "local_sgd"):  # a file store: no port to race for
            rendezvous = tempfile.mkdtemp(prefix="tta-")
            job.address = "file://" + os.path.join(rendezvous, "store")
        elif job.method.startswith("platoon_"):
            mine, theirs = ctx.Pipe()
            ctl = ctx.Process(target=_controller_main, args=(theirs,), daemon=True)
            ctl.start()
            extra.append(ctl)
            if not mine.poll(60):
                raise RuntimeError("the platoon controller did not start within 60 s")
            job.address = mine.recv()
        for rank in range(job.world):
            p = ctx.Process(target=_member_main, daemon=True,
                            args=(job, rank, data, shared, barrier, results, stop_event))
            p.start()
            procs.append(p)
        got = {}
        deadline = time.monotonic() + job.cap_s + 120
        while len(got) < job.world:
            try:
                kind, rank, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if r not in got and p.exitcode is not None]
                if dead:
                    raise RuntimeError("%s rank %d exited with code %s without a result" % (
                        job.method, dead[0][0], dead[0][1])) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("%s did not finish within %.0f s of its %.0f s cap "
                                       "(stacks on stderr)" % (job.method, 120, job.cap_s)
                                       ) from None
                continue
            if kind == "error":
                raise RuntimeError("%s rank %d failed:\n%s" % (job.method, rank, value))
            got[rank] = value
        end = time.monotonic() + 10  # then _stop ends whatever still runs
        for p in procs + extra:
            p.join(max(0.1, end - time.monotonic()))
    except RuntimeError as exc:
        return {"error": str(exc)}
    finally:
        _stop(procs + extra)
        if rendezvous:
            shutil.rmtree(rendezvous, ignore_errors=True)
    out = dict(got[0])
    out["ranks"] = [{k: v for k, v in got[r].items() if k != "trace"} for r in sorted(got)]
    return out


# -- the benchmark --------------------------------------------------------------------------

def _median(values):
    return float(statistics.median(values)) if values else None


def _score(result):
    """Sort key of a tuning run: time to target, else (after every run that reached it)
    the best accuracy it got to."""
    if result.get("reached"):
        return (0, result["reached"][0])
    best = max((a for _, _, a in result.get("trace", [])), default=0.0)
    return (1, -best)


def tune_and_measure(ctx, dataset, table, tune, reps, straggler_reps, log):
    """Tune (or take each grid's middle value), then measure, then the straggler runs."""
    data = load(dataset)
    runs = []
    # Caps are set for an idle machine; under load every step takes longer.
    load_factor = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    cap_s = dataset.cap_s * load_factor

    def run(name, cfg, seed, straggler, cap_s, phase):
        world, fixed, _ = table[name]
        job = Job(name, dict(fixed, **cfg), seed, straggler, cap_s, dataset, world)
        wall = time.monotonic()
        result = run_one(ctx, job, data)
        result["wall_s"] = time.monotonic() - wall
        reached = result.get("reached")
        log("%s %-26s %-34s seed %d%s: %s (run %.1f s)" % (
            dataset.name, name, json.dumps(cfg), seed, " straggler" if straggler else "",
            result["error"].splitlines()[0] if "error" in result else
            ("%.2f s, %d steps" % tuple(reached)) if reached else "not reached in %.1f s"
            % cap_s, result["wall_s"]))
        runs.append({"phase": phase, "method": name, "cfg": job.cfg, "seed": seed,
                     "straggler": straggler, "cap_s": cap_s, **result})
        return result

    # Tuning: seed 0, every grid value, methods alternating. A run's cap is at most twice
    # the best time its method has reached so far (a slower setting cannot win).
    best = {name: None for name in table}
    chosen = {}
    for i in range(max(len(g) for _, _, g in table.values()) if tune else 0):
        for name, (_, _, grid) in table.items():
            if i >= len(grid):
                continue
            cap = cap_s
            if best[name] is not None and best[name][1].get("reached"):
                cap = min(cap, 2 * best[name][1]["reached"][0] + 0.5)
            result = run(name, grid[i], 0, False, cap, "tune")
            if "error" not in result and (best[name] is None or _score(result) <
                                          _score(best[name][1])):
                best[name] = (grid[i], result)
    for name, (_, _, grid) in table.items():
        chosen[name] = best[name][0] if best[name] is not None else grid[len(grid) // 2]

    # Measurement: new seeds, all methods alternating within each repetition.
    for rep in range(reps):
        for name in table:
            run(name, chosen[name], 1 + rep, False, cap_s, "measure")
    # Straggler: every multi-process method, alternating, with the same seeds.
    for rep in range(straggler_reps):
        for name, (world, _, _) in table.items():
            if world > 1:
                run(name, chosen[name], 1 + rep, True, cap_s, "straggler")
    return {"dataset": asdict(dataset), "tuned": tune, "cap_s": cap_s,
            "load_factor": load_factor,
            "grids": {n: g for n, (_, _, g) in table.items()},
            "fixed": {n: f for n, (_, f, _) in table.items()}, "chosen": chosen,
            "summary": summarise(runs, table), "runs": runs}


def summarise(runs, table):
    """Per method: medians over the measured runs that reached the target, and how many."""
    out = {}
    for name in table:
        row = {}
        for phase in ("measure", "straggler"):
            mine = [r for r in runs if r["method"] == name and r["phase"] == phase]
            if not mine:
                continue
            hit = [r for r in mine if r.get("reached")]
            row[phase] = {
                "runs": len(mine), "reached": len(hit),
                "time_s": _median([r["reached"][0] for r in hit]),
                "steps": _median([r["reached"][1] for r in hit]),
                "setup_s": _median([max(k["setup_s"] for k in r["ranks"]) for r in mine
                                    if "ranks" in r]),
                "steps_per_s": _median([k["steps"] / k["clock_s"] for r in mine
                                        if "ranks" in r for k in r["ranks"]]),
                "sync_ms_per_step": _median([1000 * k["sync_s"] / k["steps"] for r in mine
                                             if "ranks" in r for k in r["ranks"]
                                             if "sync_s" in k]),
                "lock_wait_ms_per_sync": _median([1000 * k["lock_wait_s"] / max(1, k["syncs"])
                                                  for r in mine if "ranks" in r
                                                  for k in r["ranks"] if "syncs" in k]),
                "lock_hold_ms_per_sync": _median([1000 * k["lock_hold_s"] / max(1, k["syncs"])
                                                  for r in mine if "ranks" in r
                                                  for k in r["ranks"] if "syncs" in k]),
            }
        out[name] = row
    return out


# -- reports --------------------------------------------------------------------------------

def _fmt(value, spec="%.2f", none="-"):
    return none if value is None else spec % value


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def goals(result):
    """[(goal, measured, met)] for one dataset's result."""
    s = result["summary"]
    t = {name: row.get("measure", {}).get("time_s") for name, row in s.items()}
    modes = [n for n in s if n.startswith("platoon_") and t[n] is not None]
    out = []
    best_mode = min(modes, key=lambda n: t[n]) if modes else None
    vs_single = _ratio(t.get(best_mode), t.get("single"))
    vs_hog = _ratio(t.get(best_mode), t.get("hogwild"))
    name = result["dataset"]["name"]
    out.append(("%s: best platoon mode (%s) vs best-tuned single process" % (name, best_mode),
                vs_single, GOAL_VS_SINGLE))
    out.append(("%s: best platoon mode vs Hogwild" % name, vs_hog, GOAL_VS_HOGWILD))
    if best_mode:
        slow = s[best_mode].get("straggler", {}).get("time_s")
        out.append(("%s: %s with a 2x straggler vs all fast" % (name, best_mode),
                    _ratio(slow, t[best_mode]), GOAL_STRAGGLER))
    return out


def limits(result):
    """Lines saying what each platoon mode's time is made of, against the single process:
    time ratio ~ (steps to target ratio) x (time per step ratio)."""
    s = result["summary"]
    single = s.get("single", {}).get("measure", {})
    lines = []
    for name, row in s.items():
        m = row.get("measure", {})
        if not name.startswith("platoon_") or not m.get("steps") or not single.get("steps"):
            continue
        step_ms = 1000 / m["steps_per_s"]
        lines.append(
            "- %s: %.2fx the single process's steps to target (per process, 2 processes), "
            "%.2fx its time per step (%.2f ms, of which sync %.2f ms; lock wait %.3f ms and "
            "hold %.3f ms per sync): %.2fx its time." % (
                name, m["steps"] / single["steps"], single["steps_per_s"] / m["steps_per_s"],
                step_ms, m["sync_ms_per_step"] or 0.0, m["lock_wait_ms_per_sync"] or 0.0,
                m["lock_hold_ms_per_sync"] or 0.0,
                _ratio(m["time_s"], single["time_s"]) or float("nan")))
    return lines


def markdown(report):
    meta = report["meta"]
    lines = []
    for result in report["datasets"]:
        d = result["dataset"]
        s = result["summary"]
        single = s.get("single", {}).get("measure", {}).get("time_s")
        hog = s.get("hogwild", {}).get("measure", {}).get("time_s")
        lines += ["### %s: MLP %s-%d-%d-10, batch %d, target %.0f%% test accuracy" % (
            d["name"], 64 if d["name"] == "digits" else 40, d["hidden"], d["hidden"],
            d["batch"], 100 * d["target"]), "",
            "Evaluated every %d steps (evaluation time excluded); each run capped at %.1f s "
            "(%.0f s on an idle machine, times the load average per core at the start, %.2f)."
            % (d["eval_every"], result["cap_s"], d["cap_s"], result["load_factor"]), "",
            "| method | grid | chosen | reached | median time | median steps | vs single "
            "| vs Hogwild | steps/s per process | sync ms/step | setup s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in s.items():
            m = row.get("measure", {})
            grid = result["grids"][name]
            key = sorted(grid[0])[0]
            fixed = result["fixed"][name]
            lines.append("| %s | %s=%s%s | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s |" % (
                name, key, ", ".join("%g" % g[key] for g in grid),
                "".join("; %s=%g" % kv for kv in sorted(fixed.items())),
                "%g" % result["chosen"][name][key], m.get("reached", 0), m.get("runs", 0),
                _fmt(m.get("time_s"), "%.2f s"), _fmt(m.get("steps"), "%.0f"),
                _fmt(_ratio(m.get("time_s"), single), "%.2fx"),
                _fmt(_ratio(m.get("time_s"), hog), "%.2fx"),
                _fmt(m.get("steps_per_s"), "%.0f"), _fmt(m.get("sync_ms_per_step"), "%.2f"),
                _fmt(m.get("setup_s"), "%.2f")))
        lines += [""] + limits(result)
        lines += ["", "With a 2x straggler (one of the two processes sleeps its step time "
                  "after each step):", "",
                  "| method | median time, straggler | median time, all fast | ratio | reached |"
                  " lock wait ms/sync |",
                  "|---|---|---|---|---|---|"]
        for name, row in s.items():
            st = row.get("straggler")
            if not st:
                continue
            fast = row.get("measure", {}).get("time_s")
            lines.append("| %s | %s | %s | %s | %d/%d | %s |" % (
                name, _fmt(st["time_s"], "%.2f s"), _fmt(fast, "%.2f s"),
                _fmt(_ratio(st["time_s"], fast), "%.2fx"), st["reached"], st["runs"],
                _fmt(st.get("lock_wait_ms_per_sync"), "%.2f")))
        lines.append("")
    lines += ["### Goals", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for result in report["datasets"]:
        for what, value, limit in goals(result):
            met = value is not None and value <= limit
            lines.append("| %s | %s | <= %.2fx | %s |" % (what, _fmt(value, "%.2fx"), limit,
                                                          "met" if met else "**not met**"))
    lines += ["", "Commit %s, %s; %s, %d cores; load average %.2f at start, %.2f at end; "
              "ran in %.0f s%s." % (meta["commit"], meta["date"], meta["cpu"], meta["cores"],
                                    meta["load_start"], meta["load_end"], meta["seconds"],
                                    " (--quick)" if meta["quick"] else "")]
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Time to accuracy against the alternatives

Back to the [README](../README.md).

How long each way of training one model on this machine's cores takes to reach a target test
accuracy, measured in one run in which all methods alternate:

- **single**: one process of plain torch SGD;
- **hogwild**: `model.share_memory()` and 2 `torch.multiprocessing` processes, lock-free;
- **ddp**: `DistributedDataParallel` over gloo, 2 processes;
- **local_sgd**: local SGD with torch's `PeriodicModelAverager` (gloo, 2 processes, period 4);
- **platoon_easgd**, **platoon_downpour_nesterov**, **platoon_diloco**: platoon, 2 worker
  processes and a controller process, `EASGD(alpha)`,
  `Downpour(SGD(server_lr, momentum=0.9, nesterov=True))` and
  `DiLoCo(outer_lr, momentum=0.9, nesterov=True)`, synced every 4 steps; the workers' own optimizer is plain torch SGD, their torch parameters shared
  with the centre as numpy views.

Each method's learning rate is tuned over a grid of three values on one seed (a tuning run is
capped at twice the best time its method has reached so far, plus 0.5 s); the chosen value is
then measured on new seeds. platoon's modes tune their workers' learning rate too, with
EASGD's alpha at 0.9/p = 0.45, Downpour's centre at SGD(0.2, Nesterov momentum 0.9) and
DiLoCo's outer lr at 0.7; the grids are in the tables. Every process is single-threaded. The
clock starts when all of a method's processes are ready (start-up is the "setup" column) and
excludes test evaluations, which every process makes alike. "steps" are the minibatch steps of
one process (in the 2-process methods, each process takes about as many). The straggler runs
slow one of the two processes 2x by sleeping its measured step time after every step.

**Run it** (designed for under 5 minutes on an idle 2-core machine; how long this run took,
and under what load, is under the tables; `--quick` is a shorter smoke version that writes
`benchmarks/results/time_to_accuracy_quick.*`):

```bash
python3 -m venv .venv && .venv/bin/pip install -q -e '.[bench]' && .venv/bin/python -m benchmarks.time_to_accuracy
```

Caveats: the baselines use plain SGD, as a user switching from one process would; only
Downpour's centre has momentum (a single process with momentum was not measured). On this
shared machine absolute times move 2-5x with the load (see the load average under the tables):
read the ratios, measured in one run with every method alternating, not the seconds.

Reading the lines under each table: a platoon mode's time to target is about its steps to
target (per process) times its time per step. Two processes on two cores can at best halve
the first (0.5x the single process's) and keep the second (1.0x); the lines say how far each
mode is from that, and how much of a step is sync (lock hold and wait from `Worker.sync_stats`).

It writes `benchmarks/results/time_to_accuracy.json` (every run, with its accuracy trace) and
`time_to_accuracy.md`, and regenerates this page from them. The targets: the best platoon mode
at most %.2fx the time of the best-tuned single process and at most %.2fx Hogwild's, on
MNIST-1D and on digits with H=1024; with a 2x straggler, platoon at most %.2fx its all-fast
time.

## Results

""" % (GOAL_VS_SINGLE, GOAL_VS_HOGWILD, GOAL_STRAGGLER)


def doc(report):
    return DOC_HEAD + markdown(report)


def write(report, quick, out_dir, doc_path=DOC):
    """The JSON and its Markdown under `out_dir`; for a full run also the docs page."""
    os.makedirs(out_dir, exist_ok=True)
    stem = "time_to_accuracy_quick" if quick else "time_to_accuracy"
    text = json.dumps(report, indent=1)
    # Lists of numbers (the traces' points) on one line each.
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]",
                  lambda m: "[%s]" % ", ".join(v.strip() for v in m.group(1).split(",")), text)
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(markdown(report))
    if doc_path and not quick:
        with open(doc_path, "w") as f:
            f.write(doc(report))


def main(argv=None):
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
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
