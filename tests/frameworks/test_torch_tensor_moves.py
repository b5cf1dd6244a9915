"""Tensors that torch moves or converts after they were shared (model.share_memory(),
`.data = ...`, `set_()`, model.double()): syncing follows them or says why it cannot, with
real controller and worker processes."""

import json
import os
import re
import threading

import numpy as np
import pytest

from platoon import EASGD, LayoutMismatch

torch = pytest.importorskip("torch", reason="the PyTorch tests need PyTorch")
from torch import nn  # noqa: E402

from platoon import PeriodicSync  # noqa: E402

from helpers import PROCS, Nothing, Proc  # noqa: E402

MOVES = ["share_memory", "data", "set"]


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """One torch_move_worker.py process (torch's import is most of its time) making the MOVES
    and then model.double() in turn, the only worker of a job, syncing in place; then the
    same in a second job, overlapped: {False: the first job's report, True: the second's}, a
    dict per change."""
    tmp_path = tmp_path_factory.mktemp("moves")
    ctls = {overlap: Nothing(control_port=0) for overlap in (False, True)}
    servings = [threading.Thread(target=ctl.serve, kwargs={"timeout_s": 60}, daemon=True)
                for ctl in ctls.values()]
    for serving in servings:
        serving.start()
    args = [ctls[False].control_port, ",".join(MOVES + ["double"]), 0, tmp_path / "0.json",
            ctls[True].control_port, 1, tmp_path / "1.json"]
    worker = Proc([os.path.join(PROCS, "torch_move_worker.py")] + [str(a) for a in args])
    try:
        code = worker.wait(90)
        assert code == 0, "worker exited with %s:\n%s" % (code, worker.output)
        for serving in servings:
            serving.join(30)
            assert not serving.is_alive(), "a controller still serves"
    finally:
        worker.kill()
        for ctl in ctls.values():
            ctl.close()  # (a serve() still waiting for its worker returns first)
        for serving in servings:
            serving.join(30)
    reports = {}
    for overlap in (False, True):
        with open(tmp_path / ("%d.json" % overlap)) as f:
            reports[overlap] = json.load(f)
    return reports


@pytest.mark.parametrize("overlap", [False, True], ids=["in_place", "overlapped"])
def test_moved_tensors_keep_syncing_and_a_converted_model_is_refused(moved, overlap):
    # One worker process makes each change in turn, in a job of its own for each overlap.
    # Before: share_memory() freed the storage the adapter's numpy views pointed at (the
    # worker died of SIGSEGV at its next sync); `.data =` and `set_()` left the views on the
    # old storage, so the model silently stopped syncing.
    report = moved[overlap]
    for syncs, how in enumerate(MOVES, start=2):
        assert "error" not in report[how], (how, report)
        assert report[how]["syncs"] == syncs, (how, report)
        # Every parameter was 0.1 away from the centre; EASGD(0.5) met half-way.
        assert report[how]["centre_moved"] > 0.04, (how, report)
        assert report[how]["param_vs_centre"] < 1e-5, (how, report)
    error = report["double"].get("error", "")
    assert error.startswith("LayoutMismatch"), report
    # model.double() converts parameters in place and replaces buffers: the first one met
    assert re.search(r"the model's '[\w.]+' changed from torch.float32 \[1024\] on cpu to "
                     r"torch.float64 \[1024\] on cpu", error), error
    assert "before" in error and "PeriodicSync" in error, error  # what to do


# -- Worker.init_shared_params in this process --


def test_a_rebound_parameter_of_a_plain_worker_keeps_syncing(one_worker):
    ctl, w = one_worker
    model = nn.Linear(4, 3)
    w.init_shared_params(model, EASGD(0.5))
    with torch.no_grad():
        model.weight.data = torch.full((3, 4), 2.0)
        model.bias.set_(torch.full((3,), 4.0))
    centre = [c.copy() for c in ctl.centre]
    w.sync_params()
    for p, c, before, value in zip(model.parameters(), ctl.centre, centre, (2.0, 4.0)):
        np.testing.assert_allclose(p.detach().numpy(), (before + value) / 2, rtol=1e-6)
        np.testing.assert_allclose(c, (before + value) / 2, rtol=1e-6)


def test_a_changed_shape_or_device_is_refused(one_worker):
    _, w = one_worker
    model = nn.Linear(4, 3)
    w.init_shared_params(model, EASGD(0.5))
    model.weight.data = torch.zeros(3, 5)
    with pytest.raises(LayoutMismatch, match=r"'weight'.*\[3, 4\].*\[3, 5\]"):
        w.sync_params()
    with pytest.raises(LayoutMismatch, match="'weight'"):
        w.start_sync()  # still refused: nothing touches the old memory
    model.weight.data = torch.zeros(3, 4)  # put right again: syncing goes on
    w.sync_params()
    assert w.syncs == 1


def test_a_replaced_buffer_is_refused_naming_it_until_its_layout_is_back(one_worker):
    _, w = one_worker
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1,
                       rule=EASGD(0.5))
    shared = model[1].running_mean
    model[1].running_mean = torch.zeros(4, dtype=torch.float64)  # another dtype
    with pytest.raises(LayoutMismatch, match=r"'1.running_mean'.*float32.*float64"):
        opt.sync()
    model[1].running_mean = torch.full((4,), 2.0)  # a new tensor of the shared layout
    opt.sync()
    assert model[1].running_mean is shared  # back in its place, with the new values synced
    np.testing.assert_array_equal(w.shared_params[4], np.full(4, 1.0))  # 0.5 * (2 - 0)
    model[1].running_mean = None
    with pytest.raises(LayoutMismatch, match="'1.running_mean'.*no longer the tensor"):
        opt.sync()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_a_converted_gpu_model_is_refused(one_worker):
    _, w = one_worker
    model = nn.Linear(4, 3).to("cuda")
    w.init_shared_params(model, EASGD(0.5))
    model.weight.data = model.weight.data.clone()  # moved: copies follow it
    w.sync_params()
    model.double()
    with pytest.raises(LayoutMismatch, match=r"'weight'.*float32.*float64"):
        w.sync_params()
