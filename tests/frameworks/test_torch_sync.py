"""PyTorch first: PeriodicSync around a torch optimizer, centre snapshots, tensor gradients,
and Worker.device, with real controllers, workers, sockets and shared memory."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import platoon
from platoon import (
    ASGD,
    EASGD,
    SGD,
    Adam,
    Controller,
    Downpour,
    PlatoonError,
    Worker,
    average_gradients,
)
from platoon.device import Device

from helpers import PROCS, Nothing, Proc, long_run

torch = pytest.importorskip("torch", reason="the PyTorch tests need PyTorch")
from torch import nn  # noqa: E402

from platoon import LayoutMismatch, LockTimeout, PeriodicSync, load_centre  # noqa: E402

sys.path.insert(0, PROCS)
from torch_sync_worker import make_model  # noqa: E402

from helpers import run_all  # noqa: E402  (one thread per worker)


def bn_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))


def train_step(model, opt, x, y=None):
    opt.zero_grad()
    out = model(x)
    loss = nn.functional.mse_loss(out, torch.zeros_like(out) if y is None else y)
    loss.backward()
    opt.step()
    return loss.item()



# -- a real job --

@pytest.fixture(scope="module")
def two_worker_processes(tmp_path_factory):
    """A job of two torch_sync_worker.py processes (24 steps, a sync every 4) with a
    controller serving in this process, the second worker started once the first, alone,
    has waited 1.5 s in PeriodicSync for it: {"first_alone": the first's output after
    those 1.5 s, "workers": their Procs, all exited, "reports": their JSON reports, "centre":
    the controller's centre once both were done, "out": the reports' path pattern, "steps",
    "every"}. Run once for the two tests below (a pair of torch processes fewer)."""
    steps, every = 24, 4
    out = str(tmp_path_factory.mktemp("torch_sync") / "worker%d.json")
    ctl = Nothing(control_port=0, num_workers=2)
    serving = threading.Thread(target=ctl.serve, kwargs={"timeout_s": 120}, daemon=True)
    serving.start()
    workers = []
    try:
        args = [os.path.join(PROCS, "torch_sync_worker.py"), ctl.control_port, steps, every, out]
        workers.append(Proc([str(a) for a in args]))
        workers[0].wait_for_line("REGISTERED", timeout=90)  # (torch's import)
        time.sleep(1.5)  # alone, it waits in PeriodicSync (before, it trained alone)
        first_alone = workers[0].output
        workers.append(Proc([str(a) for a in args]))
        for w in workers:
            assert w.wait(90) == 0, w.output
        serving.join(30)
        assert not serving.is_alive(), "the controller still serves"
        final = [a.copy() for a in ctl.centre]
    finally:
        for w in workers:
            w.kill()
        serving.join(30)
        ctl.close()
    reports = []
    for k in range(2):
        with open(out % k) as f:
            reports.append(json.load(f))
    return {"first_alone": first_alone, "workers": workers, "reports": reports,
            "centre": final, "out": out, "steps": steps, "every": every}


def test_two_worker_processes_train_and_the_centre_moves_and_loads_into_a_fresh_model(
        two_worker_processes):
    job = two_worker_processes
    steps, every, reports, final, out = (job[k] for k in ("steps", "every", "reports",
                                                          "centre", "out"))
    # Worker 0 syncs in place at steps 4, 8, ...; worker 1 (overlap) finishes each sync at
    # the next sync point, and the last one when its `with` block ends.
    assert reports[0]["syncs"] == [s // every for s in range(1, steps + 1)]
    assert reports[1]["syncs"] == [max(0, s // every - 1) for s in range(1, steps + 1)]
    assert reports[0]["final_syncs"] == reports[1]["final_syncs"] == steps // every
    initial = make_model().state_dict()
    for k, report in enumerate(reports):
        assert report["loss_after"] < 0.5 * report["loss_before"], report
        assert report["centre_loss"] < 0.5 * report["loss_before"], report
        centre = torch.load((out % k) + ".pt")
        fresh = make_model()
        fresh.load_state_dict(centre, strict=True)
        # The centre is what the controller holds, parameters and BatchNorm statistics.
        names = [n for n, _ in fresh.named_parameters()] + ["1.running_mean", "1.running_var"]
        assert len(final) == len(names)
        for name, array in zip(names, final):
            np.testing.assert_array_equal(centre[name].numpy(), array)
            assert not torch.equal(centre[name], initial[name]), name  # the centre moved
        assert centre["1.num_batches_tracked"].item() == steps  # this worker's own count


def test_workers_begin_training_together(two_worker_processes):
    job = two_worker_processes
    # Alone, the first worker waited in PeriodicSync (before, it trained 801 steps alone).
    assert "REGISTERED" in job["first_alone"] and "TRAINING" not in job["first_alone"], \
        job["first_alone"]
    for proc in job["workers"]:
        assert proc.wait_for_line("TRAINING").split()[2] == "1"  # nothing moved
        assert proc.wait_for_line("DONE").split()[2] == str(job["steps"] // job["every"])


# -- the wrapper in this process --

@pytest.mark.parametrize("overlap", [False, True, "step"])
def test_syncs_happen_exactly_every_n_steps(one_worker, overlap):
    _, w = one_worker
    model = nn.Linear(3, 1)
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=3,
                       rule=EASGD(0.5), overlap=overlap)
    seen, started = [], []
    for _ in range(10):
        train_step(model, opt, torch.ones(2, 3))
        seen.append(w.syncs)
        started.append(opt.in_flight)
    if overlap == "step":  # started at steps 3, 6, 9; finished by the next step()
        assert seen == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
        assert started == [False, False, True] * 3 + [False]
    elif overlap:
        assert seen == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]
        assert started == [False, False] + [True] * 8  # one in flight from step 3 on
        opt.wait()
        assert w.syncs == 3 and not opt.in_flight
    else:
        assert seen == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
        assert not any(started)
    assert opt.steps == 10


def run_linear_job(serve, overlap, loss_of, steps, every=4):
    """One worker trained by PeriodicSync for `steps` steps; (final centre, parameters)."""
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    with Worker(ctl.control_port, timeout_s=10) as w:
        opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1),
                           sync_every=every, rule=EASGD(0.5), overlap=overlap)
        x = torch.linspace(-1, 1, 10).reshape(2, 5)
        with opt:  # leaving it finishes an overlapped sync
            for _ in range(steps):
                opt.zero_grad()
                loss_of(model, x).backward()
                opt.step()
        centre = [c.copy() for c in ctl.centre]
        params = [p.detach().clone().numpy() for p in model.parameters()]
    serving.join()
    return centre + params


def linear(model, x):  # its gradient does not depend on the parameters
    return model(x).sum()


def quadratic(model, x):
    return (model(x) ** 2).sum()


def test_overlap_gives_the_centre_of_in_place_syncs_when_gradients_ignore_the_parameters(
        serve):
    for a, b in zip(run_linear_job(serve, False, linear, 4),
                    run_linear_job(serve, True, linear, 4)):
        np.testing.assert_array_equal(a, b)  # one sync: the same push and pull, bit for bit
    for a, b in zip(run_linear_job(serve, False, linear, 12),
                    run_linear_job(serve, True, linear, 12)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # only summation order differs


def test_overlap_differs_when_gradients_depend_on_the_parameters(serve):
    # The stated difference: with overlap the steps after a sync point are computed from
    # parameters that have not yet felt the centre's pull, which comes at the next sync point.
    for a, b in zip(run_linear_job(serve, False, quadratic, 4),
                    run_linear_job(serve, True, quadratic, 4)):
        np.testing.assert_array_equal(a, b)  # one sync: still the same
    plain = run_linear_job(serve, False, quadratic, 12)
    overlapped = run_linear_job(serve, True, quadratic, 12)
    assert any(not np.allclose(a, b, rtol=1e-4) for a, b in zip(plain, overlapped))


def test_overlap_with_the_next_step_syncs_in_place_and_equals_syncs_in_step(serve):
    # The sync runs during the next forward and backward and is finished before the
    # optimizer's step, without a copy of the parameters: with a gradient that does not
    # read them, every step gives the bits of syncing in step(), not merely close values.
    for a, b in zip(run_linear_job(serve, False, linear, 12),
                    run_linear_job(serve, "step", linear, 12)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["parameters", "shared buffers", "no optimizer"])
def test_overlap_with_the_next_step_copies_only_when_something_else_writes(one_worker, case):
    _, w = one_worker
    model = bn_model() if case == "shared buffers" else nn.Linear(3, 2)
    inner = None if case == "no optimizer" else torch.optim.SGD(model.parameters(), lr=0.1)
    opt = PeriodicSync(w, model, inner, sync_every=1, rule=EASGD(0.5), overlap="step")
    for _ in range(3):
        if inner is None:
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad  # the script's own update, before step()
            opt.step()
        else:
            train_step(model, opt, torch.ones(2, 3))
        assert opt.in_flight
    assert w.syncs == 2
    # Live syncs allocate no snapshot; BatchNorm's forward writes its shared statistics,
    # and a script without an optimizer writes before step(): those copy first.
    assert (w._exchange._snapshots is None) == (case == "parameters")
    opt.wait()
    assert w.syncs == 3 and not opt.in_flight


def test_overlap_must_be_false_true_or_step(one_worker):
    _, w = one_worker
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="overlap must be"):
        PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                     overlap="always")


@pytest.mark.parametrize("buffers", ["sync", "exclude"])
def test_buffers_are_synced_or_excluded(one_worker, buffers):
    ctl, w = one_worker
    model = bn_model()
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.0), sync_every=1,
                       rule=EASGD(0.5), buffers=buffers)
    params = [n for n, _ in model.named_parameters()]
    bn = model[1]
    assert opt.shared_names == params + (["1.running_mean", "1.running_var"]
                                         if buffers == "sync" else [])
    assert len(ctl.centre) == len(opt.shared_names)
    x = torch.arange(12.0).reshape(4, 3)
    opt.zero_grad()
    model(x).sum().backward()  # the forward pass moves the running statistics
    moved = bn.running_mean.clone()
    assert not torch.equal(moved, torch.zeros(4))
    opt.step()  # lr 0: only the sync changes anything
    if buffers == "sync":
        torch.testing.assert_close(bn.running_mean, moved / 2)  # halfway to the centre's zeros
        np.testing.assert_allclose(ctl.centre[len(params)], (moved / 2).numpy())
    else:
        assert torch.equal(bn.running_mean, moved)
    assert bn.num_batches_tracked.item() == 1  # integer buffers are never shared
    state = opt.centre_state_dict()
    assert state["1.num_batches_tracked"].item() == 1
    torch.testing.assert_close(state["1.running_mean"], bn.running_mean)


@pytest.mark.parametrize("rule", [ASGD(), Downpour(SGD(lr=1.0)), Downpour(SGD(0.5, 0.9)),
                                  Downpour(Adam(1e-3))], ids=repr)
@pytest.mark.parametrize("overlap", [True, "step"])
def test_any_rule_syncs_through_the_wrapper(one_worker, rule, overlap):
    ctl, w = one_worker
    model = nn.Linear(3, 2)
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                       rule=rule, overlap=overlap if rule.supports_async else False)
    before = [c.copy() for c in ctl.centre]
    with opt:
        for _ in range(4):
            train_step(model, opt, torch.ones(2, 3))
    assert w.syncs == 2
    assert all(not np.array_equal(a, b) for a, b in zip(before, ctl.centre))
    if isinstance(rule, ASGD) or repr(rule) == repr(Downpour(SGD(lr=1.0))):
        for p, c in zip(model.parameters(), ctl.centre):  # one worker: it is the centre
            np.testing.assert_allclose(p.detach().numpy(), c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
@pytest.mark.parametrize("overlap", [False, True, "step"])
def test_a_model_on_the_gpu_syncs_through_host_buffers(one_worker, overlap):
    ctl, w = one_worker
    model = bn_model().to("cuda")
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                       rule=EASGD(0.5), overlap=overlap)
    with opt:
        for _ in range(4):
            train_step(model, opt, torch.randn(4, 3, device="cuda"))
    assert w.syncs == 2
    state = opt.centre_state_dict()
    assert state["0.weight"].is_cuda
    for key, c in zip(opt.shared_names, ctl.centre):
        np.testing.assert_array_equal(state[key].cpu().numpy(), c)
    fresh = bn_model().to("cuda")
    fresh.load_state_dict(state, strict=True)


def test_overlap_needs_a_rule_that_runs_in_the_background(one_worker):
    _, w = one_worker
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="overlap=True needs a rule"):
        PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                     rule=Downpour(Adam()), overlap=True)


def test_it_drops_into_existing_code(one_worker):
    _, w = one_worker
    model = nn.Linear(3, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = PeriodicSync(w, model, inner, sync_every=2)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is inner.param_groups and opt.defaults is inner.defaults
    assert repr(opt.rule) == "EASGD(alpha=0.9)"  # 0.9 / one worker (the job's size not given)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train_step(model, opt, torch.ones(2, 3))
    scheduler.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.05)
    assert model.weight.grad is not None
    opt.zero_grad()
    assert model.weight.grad is None
    state = opt.state_dict()
    assert state["platoon_steps"] == 1 and opt.state is inner.state and len(inner.state) == 2
    plain = torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1, momentum=0.9)
    plain.load_state_dict(state)  # a plain optimizer takes the wrapper's state dict
    opt.steps = 0
    opt.load_state_dict(state)
    assert opt.steps == 1
    opt.load_state_dict(plain.state_dict())  # and the other way round
    assert opt.steps == 1
    assert opt.param_groups is inner.param_groups  # also after load_state_dict replaced them
    opt.param_groups[0]["lr"] = 0.25
    assert inner.param_groups[0]["lr"] == 0.25
    assert opt.step(lambda: torch.tensor(3.0)).item() == 3.0  # closures pass through
    assert w.syncs == 1  # step 2
    opt.sync()
    assert w.syncs == 2


# -- a loop that updates the parameters itself (no torch.optim), and sync.centre() --

def test_a_hand_written_update_syncs_without_an_optimizer(one_worker):
    """The script's own update, with its own lr annealed its own way, then sync.step(): every
    third call syncs under EASGD, exactly as the rule says."""
    ctl, w = one_worker
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    sync = PeriodicSync(w, model, sync_every=3, rule=EASGD(0.5))
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    grads = [np.tile(x.sum(0).numpy(), (2, 1)), np.full(2, 2.0, np.float32)]  # of model(x).sum()
    local = [p.detach().numpy().copy() for p in model.parameters()]
    centre = [c.copy() for c in ctl.centre]
    initial = centre[0].copy()
    lr = 0.1
    for step in range(1, 7):
        sync.zero_grad()
        model(x).sum().backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        sync.step()
        local = [p - np.float32(lr) * g for p, g in zip(local, grads)]
        if step % 3 == 0:
            for p, c in zip(local, centre):
                d = np.float32(0.5) * (p - c)
                p -= d
                c += d
            lr /= 4  # annealed by the script: the next update takes it
        for p, expected in zip(model.parameters(), local):
            np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-6, atol=1e-7)
        for c, expected in zip(ctl.centre, centre):
            np.testing.assert_allclose(c, expected, rtol=1e-6, atol=1e-7)
    assert w.syncs == 2 and sync.steps == 6
    assert not np.array_equal(ctl.centre[0], initial)  # the centre moved
    sync.zero_grad()
    assert model.weight.grad is None  # the model's zero_grad
    with pytest.raises(AttributeError, match="wraps no optimizer, so it has no param_groups"):
        sync.param_groups
    assert not hasattr(sync, "state")
    assert sync.state_dict() == {"platoon_steps": 6}
    sync.load_state_dict({"platoon_steps": 3})
    assert sync.steps == 3
    with pytest.raises(ValueError, match="wraps no optimizer, and the state dict holds"):
        sync.load_state_dict(torch.optim.SGD(model.parameters(), lr=0.1).state_dict())
    assert sync.steps == 3
    assert sync.step(lambda: 5.0) == 5.0  # step 4
    assert w.syncs == 2


def state_bytes(model):
    return {k: v.detach().cpu().numpy().tobytes() for k, v in model.state_dict().items()}


def test_centre_swaps_the_centre_in_and_restores_the_local_weights_bit_for_bit(one_worker):
    ctl, w = one_worker
    model = bn_model()
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                        rule=EASGD(0.5))
    for _ in range(3):
        train_step(model, sync, torch.randn(4, 3))
    own = state_bytes(model)
    centre = sync.centre_state_dict()
    assert {k for k in sync.shared_names if state_bytes(model)[k] != centre[k].numpy().tobytes()}
    central = [c.copy() for c in ctl.centre]
    with sync.centre() as inside:
        assert inside is model
        for key, value in model.state_dict().items():  # the centre; integer buffers our own
            assert torch.equal(value, centre[key]), key
        model(torch.randn(4, 3))  # in training mode: moves BatchNorm's statistics and count
        with torch.no_grad():
            model[0].weight.add_(1.0)
    assert state_bytes(model) == own
    with pytest.raises(RuntimeError, match="raised in the block"):
        with sync.centre():
            model(torch.randn(4, 3))
            raise RuntimeError("raised in the block")
    assert state_bytes(model) == own
    with sync.centre():
        with pytest.raises(PlatoonError, match=r"step\(\) inside `with centre\(\):` would"):
            sync.step()
        with pytest.raises(PlatoonError, match=r"sync\(\) inside `with centre"):
            sync.sync()
    assert state_bytes(model) == own and w.syncs == 1 and sync.steps == 3
    for c, before in zip(ctl.centre, central):
        np.testing.assert_array_equal(c, before)  # the block never touched the centre
    train_step(model, sync, torch.randn(4, 3))  # the same tensors, still shared: syncs on
    assert w.syncs == 2


def test_centre_finishes_a_sync_in_flight_first(one_worker):
    ctl, w = one_worker
    model = nn.Linear(3, 2)
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1,
                        rule=EASGD(0.25), overlap=True)
    train_step(model, sync, torch.ones(2, 3))
    assert sync.in_flight
    with sync.centre():
        assert not sync.in_flight and w.syncs == 1
        for p, c in zip(model.parameters(), ctl.centre):
            np.testing.assert_array_equal(p.detach().numpy(), c)
    assert not any(np.array_equal(p.detach().numpy(), c)
                   for p, c in zip(model.parameters(), ctl.centre))  # its own again


def test_bad_arguments_are_refused_before_anything_is_shared(one_worker):
    ctl, w = one_worker
    model = nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, error, match in [
            (dict(sync_every=0), ValueError, "sync_every must be an integer >= 1, got 0"),
            (dict(sync_every=2.0), ValueError, "sync_every must be an integer"),
            (dict(sync_every=2, buffers="average"), ValueError, "buffers must be one of"),
    ]:
        with pytest.raises(error, match=match):
            PeriodicSync(w, model, sgd, **kwargs)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        PeriodicSync(w, model, "sgd", sync_every=2)
    with pytest.raises(TypeError, match="rule must be a platoon.ParamSyncRule"):
        PeriodicSync(w, model, sgd, sync_every=2, rule="easgd")
    with pytest.raises(TypeError, match="needs the nn.Module"):
        PeriodicSync(w, list(model.parameters()), sgd, sync_every=2)
    assert w.shared_params is None  # nothing was shared
    with pytest.warns(UserWarning, match="steps 1 tensor.s. that are not parameters"):
        PeriodicSync(w, model, torch.optim.SGD(list(model.parameters()) + [
            torch.zeros(2, requires_grad=True)], lr=0.1), sync_every=2)
    with pytest.raises(PlatoonError, match="already called"):
        PeriodicSync(w, model, sgd, sync_every=2)


def test_centre_state_dict_is_a_snapshot_taken_under_the_lock(one_worker):
    ctl, w = one_worker
    model = bn_model()
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1)
    train_step(model, opt, torch.randn(4, 3))
    state = opt.centre_state_dict()
    fresh = bn_model(seed=1)
    assert fresh.load_state_dict(state, strict=True)
    for key, c in zip(opt.shared_names, ctl.centre):
        np.testing.assert_array_equal(state[key].numpy(), c)
    ctl.centre[0][...] += 1.0
    assert not np.array_equal(state[opt.shared_names[0]].numpy(), ctl.centre[0])  # a copy
    done = threading.Event()
    with w.lock():  # another thread asking for a snapshot waits for the lock
        t = threading.Thread(target=lambda: (opt.centre_state_dict(timeout_s=10), done.set()))
        t.start()
        assert not done.wait(0.2)
    t.join(10)
    assert done.is_set()
    held, release = threading.Event(), threading.Event()

    def hold():
        with w.lock(timeout_s=10):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(LockTimeout):
            opt.centre_state_dict(timeout_s=0.05)
    finally:
        release.set()
        holder.join(10)


def test_the_checkpointed_centre_loads_into_a_model_by_name(one_worker, tmp_path):
    ctl, w = one_worker
    model = bn_model()
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1)
    train_step(model, opt, torch.randn(4, 3))
    path = ctl.checkpoint(str(tmp_path / "centre.npz"))
    centre = load_centre(path)
    assert list(centre) == opt.shared_names
    fresh = bn_model(seed=1)
    loaded = fresh.load_state_dict(  # (not strict: integer buffers are never shared)
        {name: torch.from_numpy(array) for name, array in centre.items()}, strict=False)
    assert loaded.unexpected_keys == [], loaded
    for key, value in opt.centre_state_dict().items():
        if key in centre:
            assert torch.equal(fresh.state_dict()[key], value), key


def test_snapshot_centre_of_numpy_parameters(one_worker):
    ctl, w = one_worker
    with pytest.raises(PlatoonError, match="before snapshot_centre"):
        w.snapshot_centre()
    params = [np.arange(4.0), np.ones((2, 2), np.float32)]
    w.init_shared_params(params, EASGD(0.5))
    snap = w.snapshot_centre()
    for s, p in zip(snap, params):
        np.testing.assert_array_equal(s, p)
        assert s.dtype == p.dtype
    params[0] += 2.0
    w.sync_params()
    np.testing.assert_array_equal(snap[0], np.arange(4.0))  # copies, not views
    np.testing.assert_array_equal(w.snapshot_centre()[0], np.arange(4.0) + 1.0)


# -- average_gradients and Worker.device --

@pytest.fixture
def two_workers(serve):
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    workers = sorted((Worker(ctl.control_port, timeout_s=10) for _ in range(2)),
                     key=lambda w: w.worker_id)
    yield workers
    for w in workers:
        w.close()
    serving.join()


def test_average_gradients_takes_cpu_tensors_and_modules(two_workers):
    def body(w):
        k = float(w.worker_id)
        flat = torch.full((2, 3), k)
        strided = torch.full((4, 4), 2.0 * k).t()  # non-contiguous: reduced through a view
        doubles = torch.full((3,), 1.0 + k, dtype=torch.float64)
        assert average_gradients(w, [flat, strided, doubles]) == [flat, strided, doubles]
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        model(torch.full((1, 3), 1.0 + k)).sum().backward()
        grads = average_gradients(w, model)
        return flat, strided, doubles, model, grads

    for flat, strided, doubles, model, grads in run_all(two_workers, body):
        assert torch.equal(flat, torch.full((2, 3), 0.5))
        assert torch.equal(strided, torch.full((4, 4), 1.0))
        assert torch.equal(doubles, torch.full((3,), 1.5, dtype=torch.float64))
        assert grads[0] is model.weight.grad
        assert torch.equal(model.weight.grad, torch.full((2, 3), 1.5))  # mean of 1 and 2
        assert torch.equal(model.bias.grad, torch.ones(2))


def test_average_gradients_refuses_what_it_cannot_average(one_worker):
    _, w = one_worker
    with pytest.raises(TypeError, match="mix numpy and torch"):
        average_gradients(w, [np.zeros(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="array 1 is a builtins.list"):
        average_gradients(w, [np.zeros(2), [0.0]])
    with pytest.raises(TypeError, match="array 0 is read-only"):
        average_gradients(w, [np.broadcast_to(np.zeros(1), 2)])
    with pytest.raises(TypeError, match="parameter weight has no gradient"):
        average_gradients(w, nn.Linear(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_average_gradients_takes_cuda_tensors(two_workers):
    def body(w):
        g = torch.full((3,), float(w.worker_id), device="cuda")
        average_gradients(w, [g])
        return g

    for g in run_all(two_workers, body):
        assert g.is_cuda and torch.equal(g.cpu(), torch.full((3,), 0.5))


def test_torch_is_imported_only_for_periodic_sync():
    from helpers import loaded_after
    assert "torch" not in loaded_after("import platoon, platoon.worker\nplatoon.Worker")
    # PeriodicSync imports torch as it is first used: with torch's import refused (its ~1.5 s
    # of CPU spared), using it fails on that import
    code = ("import sys\nsys.modules['torch'] = None\nimport platoon\ntry:\n"
            "    platoon.PeriodicSync\nexcept ImportError as e:\n    print('NEEDS', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and re.search(r"^NEEDS .*\btorch\b", out.stdout), \
        out.stdout + out.stderr


def test_device_keeps_its_name_and_gives_torch_the_one_it_knows(monkeypatch):
    cpu = Device("cpu")
    assert cpu == "cpu" and isinstance(cpu, str) and not cpu.is_cuda
    assert torch.device(cpu) == cpu.torch == torch.device("cpu")
    assert nn.Linear(2, 2).to(cpu.local).weight.device.type == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the launcher pinned this worker to GPU 3
    gpu = Device("cuda3")
    assert gpu == "cuda3" and "%s" % gpu == "cuda3" and json.dumps(gpu) == '"cuda3"'
    assert gpu.is_cuda and gpu.local == "cuda:0" and gpu.torch == torch.device("cuda", 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,2")
    assert Device("cuda2").local == "cuda:1"
    with pytest.raises(ValueError, match="cuda3 is hidden from this process"):
        gpu.local
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Device("cuda3").local == "cuda:3"
    with pytest.raises(ValueError, match="unknown device 'tpu0'"):
        Device("tpu0").local


def test_worker_device_is_usable_with_torch(serve, monkeypatch):
    ctl = Nothing(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        assert w.device == "cpu" and isinstance(w.device, Device)
        model = nn.Linear(2, 2).to(w.device)
        assert model.weight.device == torch.device(w.device) == w.device.torch
    monkeypatch.setenv("PLATOON_DEVICE", "cuda1")  # as the launcher sets it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with Worker(ctl.control_port, timeout_s=10) as w:
        assert w.device == "cuda1" and w.device.torch == torch.device("cuda:0")
    serving.join()


# -- a first day with the launcher: progress, starting together, one final result --

@pytest.mark.slow
def test_a_launched_job_reports_steps_loss_and_one_final_result(tmp_path):
    from helpers import EXPERIMENTS, launcher_cmd, run_launcher
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "torchjob"), "-n", "2"),
                             tmp_path, timeout=120, script_args=["40"])
    assert code == 0, out
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    for wid in ("0", "1"):  # every step counted, the last loss kept: no w.report in the script
        report = status["reports"][wid]
        assert report["minibatches"] == 40 and report["metrics"]["steps"] == 40, status
        assert isinstance(report["metrics"]["loss"], float), status
    assert status["minibatches"] == 80, status
    final = status["final_result"]
    assert set(final) == {"metrics", "worker"} and final["worker"] in (0, 1), status
    logs = "".join((tmp_path / "logs" / ("worker%d.log" % k)).read_text() for k in (0, 1))
    printed = re.findall(r"FINAL (.*)", logs)
    assert len(printed) == 1, logs  # exactly one worker evaluated the final centre
    assert json.loads(printed[0]) == final["metrics"], logs
    assert final["metrics"]["loss"] < 1.0, status
    summary = out[out.index("platoon-launcher: job summary:"):]  # the result, on the terminal
    shown = ", ".join("%s %s" % (k, "%.4g" % v if isinstance(v, float) else v)
                      for k, v in sorted(final["metrics"].items()))
    assert ("platoon-launcher:   final result (the final centre, evaluated once by worker %d): "
            "%s\n" % (final["worker"], shown)) in summary, out
    assert "never synced" not in summary, out


def test_steps_and_the_loss_are_reported_at_most_every_report_every_s(one_worker):
    ctl, w = one_worker
    model = nn.Linear(3, 1)
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                        report_every_s=3600.0)
    for _ in range(5):
        sync.zero_grad()
        loss = model(torch.ones(2, 3)).pow(2).mean()
        loss.backward()
        sync.step(loss=loss)
    assert ctl.progress["metrics"] == {}  # within the hour: no report, no round trip
    sync.finish()  # the end of training reports what is left
    assert ctl.progress["minibatches"] == 5
    assert ctl.progress["metrics"] == {"steps": 5, "loss": pytest.approx(loss.item())}
    sync.report_every_s = 0.0
    sync.step()
    sync.report_loss(0.25)
    sync.step()
    assert ctl.progress["minibatches"] == 7
    assert ctl.progress["metrics"] == {"steps": 7, "loss": 0.25}


def test_counted_batches_are_the_minibatches_reported_and_resumed_steps_are_not(one_worker):
    """Under gradient accumulation a step takes several batches: once the script counts them
    (count_batches), the reports' minibatches are those batches, not the optimizer's steps;
    steps resumed from a checkpoint were another run's, not this run's minibatches."""
    ctl, w = one_worker
    model = nn.Linear(3, 1)
    sync = PeriodicSync(w, model, None, sync_every=2, report_every_s=0.0)
    sync.load_state_dict({"platoon_steps": 10})  # resumed: 10 steps trained before
    sync.step()  # one step of one batch (no batches counted yet)
    assert ctl.progress["minibatches"] == 1
    for _ in range(3):  # three steps of two micro-batches each
        sync.count_batches()
        sync.count_batches()
        sync.step()
    sync.finish()
    assert ctl.progress["minibatches"] == 7
    assert ctl.progress["metrics"]["steps"] == 14


def test_the_last_worker_to_finish_evaluates_the_final_centre_once(two_workers):
    calls = []
    first_finished = threading.Event()

    def evaluate(model):
        calls.append([p.detach().clone() for p in model.parameters()])
        return {"weight_sum": model.weight.sum(), "note": "centre"}

    def body(w):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1),
                            sync_every=1, rule=EASGD(0.5), evaluate=evaluate)
        for _ in range(3 + 3 * w.worker_id):
            train_step(model, sync, torch.full((2, 3), 1.0 + w.worker_id))
        if w.worker_id == 1:  # worker 1 finishes last, whatever the threads' timing
            assert first_finished.wait(20), "worker 0 did not finish"
        with sync:
            pass
        if w.worker_id == 0:
            first_finished.set()
        return sync, model

    (s0, m0), (s1, m1) = run_all(two_workers, body)
    assert len(calls) == 1  # one evaluation in the job
    assert s0.final_result is None and s1.final_result is not None
    centre = two_workers[1].shared_params
    np.testing.assert_array_equal(calls[0][0].numpy(), centre[0])  # the final centre
    assert s1.final_result == {"weight_sum": pytest.approx(float(centre[0].sum())),
                               "note": "centre"}
    assert s1.finish() is s1.final_result  # once
    assert len(calls) == 1


def test_start_together_waits_for_every_worker_within_the_timeout(serve):
    ctl = Nothing(control_port=0, num_workers=2)
    serve(ctl)
    with Worker(ctl.control_port, timeout_s=1.0) as w:
        began = time.monotonic()
        with pytest.raises(platoon.ControllerTimeout, match=r"job's 2 workers to start "
                           r"together.*start_together=False"):
            PeriodicSync(w, nn.Linear(3, 1), sync_every=1)
        assert time.monotonic() - began < 10
        w2 = Worker(ctl.control_port, timeout_s=10.0)
        w2.init_shared_params(nn.Linear(3, 1), EASGD(0.5))
        w2.sync_params()  # the job is underway: a late worker does not wait
        assert w2.start_together() is False
        w2.close()
    ctl.close()


def test_a_model_converted_and_converted_back_syncs_again(one_worker):
    _, w = one_worker
    model = bn_model()
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1)
    train_step(model, sync, torch.ones(4, 3))
    model.double()
    with pytest.raises(LayoutMismatch, match="float32.*float64"):
        train_step(model, sync, torch.ones(4, 3, dtype=torch.float64))
    model.float()  # the remedy the error gives: the model holds float32 tensors again
    for _ in range(3):
        train_step(model, sync, torch.ones(4, 3))
    assert w.syncs == 4
    centre = sync.centre_state_dict()
    assert not torch.equal(centre["1.running_mean"], torch.zeros(4))  # buffers sync too
    w.sync_params()
    for name, array in zip(sync.shared_names, w.shared_params):
        assert array.dtype == np.float32, name


def test_the_centre_in_a_call_and_in_a_state_dict(one_worker, tmp_path):
    _, w = one_worker
    model = nn.Linear(3, 1)
    sync = PeriodicSync(w, model, sync_every=2, rule=EASGD(0.5))  # a hand-written update
    for _ in range(2):
        model.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
        sync.step()
    own = model.weight.detach().clone()
    seen = sync.on_centre(lambda m: m.weight.detach().clone(), model)
    np.testing.assert_array_equal(seen.numpy(), w.shared_params[0])
    assert torch.equal(model.weight, own)  # the worker's own weights are back
    torch.save(sync.centre_state_dict(), tmp_path / "centre.pt")
    fresh = nn.Linear(3, 1)
    fresh.load_state_dict(torch.load(tmp_path / "centre.pt"))
    np.testing.assert_array_equal(fresh.weight.detach().numpy(), w.shared_params[0])


# -- one script, alone or in a job; a full resume --

@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """resume_trainer.py run by itself (no launcher variables) for 30 steps, saving a
    checkpoint at step 16 and going on; then, in the same process, a run resumed from that
    checkpoint and one resumed with the centre only, each a one-worker job of its own:
    (the three runs' JSON outputs, the process's output). Run once for the two tests below
    (one torch process where there were three)."""
    tmp_path = tmp_path_factory.mktemp("whole")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATOON_")}
    outs = [str(tmp_path / (name + ".json")) for name in ("whole", "resumed", "centre")]
    proc = Proc([os.path.join(PROCS, "resume_trainer.py"), "30", outs[0], "--save-at", "16",
                 str(tmp_path / "ckpt.pt"), "--then-resume", outs[1], outs[2]], env=env)
    try:
        assert proc.wait(120) == 0, proc.output
    finally:
        proc.kill()
    runs = []
    for out in outs:
        with open(out) as f:
            runs.append(json.load(f))
    return runs, proc.output


def test_a_script_run_by_itself_is_a_one_worker_job(whole_run):
    (report, _, _), output = whole_run
    assert (report["worker"], report["num_workers"]) == (0, 1)
    assert len(report["losses"]) == 30
    assert report["final"]["loss"] > 0  # the final evaluation ran on its one worker
    alone = output[:output.index("THEN resumed")]  # (the runs resumed after it, apart)
    assert alone.count("running as a one-worker job") == 1, output


def test_a_resumed_job_continues_the_curve(whole_run):
    (whole, resumed, centre_only), _ = whole_run  # saved at step 16, and went on to 30
    later = {k: v for k, v in whole["losses"].items() if int(k) >= 16}
    assert sorted(resumed["losses"], key=int) == sorted(later, key=int)  # steps 16..29
    for step, loss in later.items():
        assert resumed["losses"][step] == pytest.approx(loss, rel=1e-5), step
    assert resumed["final"]["loss"] == pytest.approx(whole["final"]["loss"], rel=1e-5)
    # Restoring the centre only (the optimizer, steps and schedule start over) leaves the curve.
    assert len(centre_only["losses"]) == 30
    assert any(centre_only["losses"][step] != pytest.approx(loss, rel=1e-3)
               for step, loss in later.items())


def test_distributed_sampler_and_shard_feed_each_worker_its_part_every_epoch(two_workers):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    dataset = TensorDataset(torch.arange(10.0))

    def epochs(w):
        # As a DDP script does, with the worker's id and the job's number of workers.
        sampler = DistributedSampler(dataset, num_replicas=w.num_workers, rank=w.worker_id,
                                     shuffle=True, seed=3)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler)
        seen = []
        for epoch in range(2):
            sampler.set_epoch(epoch)  # a new order each epoch, the same on every worker
            seen.append([int(v) for (batch,) in loader for v in batch])
        sharded = [[int(i) for i in platoon.shard(10, w.worker_id, w.num_workers, epoch=e)]
                   for e in range(2)]
        return seen, sharded

    (seen0, sharded0), (seen1, sharded1) = run_all(two_workers, epochs)
    for parts in ((seen0, seen1), (sharded0, sharded1)):
        for epoch in range(2):  # disjoint halves that cover the data set
            assert sorted(parts[0][epoch] + parts[1][epoch]) == list(range(10))
            assert len(parts[0][epoch]) == len(parts[1][epoch]) == 5
        assert parts[0][0] != parts[0][1]  # the epoch changes the order


# -- AdamW on a transformer, and a worker alone --

@long_run("a learning comparison (two jobs of 200 AdamW steps, about 12 s): "
          "benchmarks/transformer measures it at length")
def test_two_adamw_workers_train_a_transformer_further_than_one_in_as_many_steps(
        serve, procs, tmp_path):
    """PeriodicSync's default (EASGD(0.9/p) every 4 steps) with AdamW at one worker's lr."""
    losses = {}
    for n, lr, rule in ((1, 2e-2, "ASGD()"), (2, 2e-2, "EASGD(alpha=0.45)")):
        ctl = Nothing(control_port=0, num_workers=n)
        serving = serve(ctl, timeout=80)
        out = tmp_path / ("job%d.json" % n)
        workers = [procs("transformer_worker.py", ctl.control_port, 200, lr, out)
                   for _ in range(n)]
        for w in workers:
            assert w.wait(80) == 0, w.output
        serving.join()
        report = json.loads(out.read_text())
        assert report["rule"] == rule
        losses[n] = report["loss"]
    # 200 AdamW steps each at lr 2e-2 (one worker's best of 3e-3 to 2e-2): one worker ends at
    # 2.59 nats a byte, two at 2.50 on a quiet machine, 2.52-2.53 beside two busy loops and
    # 2.56 once in the whole suite (the workers' steps interleave less evenly under load).
    assert losses[2] < losses[1] - 0.01, losses


def test_a_worker_alone_trains_as_the_plain_script(serve):
    ctl = Nothing(control_port=0, num_workers=1)  # as a script run alone, or -n 1
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        _train_alone(w)
    serving.join()


def _train_alone(w):
    torch.manual_seed(0)
    model, plain = nn.Linear(4, 2), nn.Linear(4, 2)
    plain.load_state_dict(model.state_dict())
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    assert isinstance(sync.rule, ASGD)  # EASGD(0.9) would drag it toward a lagging centre
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    for _ in range(10):
        train_step(model, sync, x, y)
        train_step(plain, plain_opt, x, y)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
