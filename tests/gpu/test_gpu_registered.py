"""The registered centre on a GPU (platoon.adapters.torch_registered): CUDA float32
parameters synced by EASGD and ASGD on the GPU, straight from the centre's shared memory.

Each test skips, saying why, without a CUDA GPU. Checked: the registered path gives the
staging path's results bit for bit (sync_params, with and without the caller's lock,
start_sync with and without a snapshot, the default start_sync by value), start_sync
returns while the compute stream is still busy, two worker processes share one GPU, a
worker killed mid-sync leaves no lock held, and nothing stays registered after close.
Run there: python -m pytest -q -rs tests/gpu/test_gpu_registered.py
"""

import os
import threading

import numpy as np
import pytest

from platoon import ASGD, EASGD, Controller, Worker
from platoon.errors import WorkerDied

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = {"easgd": lambda: EASGD(0.3), "asgd": ASGD}


class Nothing(Controller):
    def handle_control(self, req, worker_id, req_info):
        return None


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    return torch


def _registered_spans():
    from platoon.adapters import cuda_register
    return cuda_register.process_registry().spans


def run_job(torch, serve, monkeypatch, registered, rule, mode, steps=3):
    """One worker of a job in this process, on the registered path or the staging path: the
    same parameters, local steps, moves of the centre (as other workers would make) and
    syncs; the parameters and the centre at the end, as numpy arrays."""
    monkeypatch.setenv("PLATOON_REGISTERED_CENTRE", "require" if registered else "0")
    gen = torch.Generator().manual_seed(27)

    def noise(p):
        return torch.randn(p.shape, generator=gen).to(p.device)

    # two parameters, odd sizes: about 10 MB, so 10 stripes, one of them split
    params = [torch.randn(2_500_003, generator=gen).cuda(), torch.randn(1001, generator=gen).cuda()]
    ctl = Nothing(control_port=0)
    serving = serve(ctl, timeout=60.0)
    with Worker(ctl.control_port, timeout_s=30) as w:
        w.init_shared_params(params, RULES[rule]())
        assert (w._exchange.device is not None) is registered  # noqa: SLF001
        for step in range(steps):
            for p in params:
                p.add_(noise(p))
            for c in ctl.centre:  # another worker's syncs
                c *= np.float32(0.875)
                c += np.float32(0.0625 * (step + 1))
            if mode == "sync_params":
                w.sync_params()
            elif mode == "locked":
                with w.lock(10):
                    w.sync_params()
            elif mode == "unlocked":
                w.sync_params(synchronous=False)
            elif mode == "live":
                w.start_sync(snapshot=False).wait(30)
            elif mode == "snapshot":
                handle = w.start_sync(snapshot=True)
                for p in params:  # the worker goes on training meanwhile
                    p.add_(noise(p))
                handle.wait(30)
            else:
                w.start_sync().wait()
        torch.cuda.synchronize()
        xs = [p.cpu().numpy().copy() for p in params]
        cs = [c.copy() for c in ctl.centre]
    serving.join()
    return xs, cs


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("mode", ["sync_params", "locked", "unlocked", "live", "snapshot",
                                  "default"])
def test_registered_path_matches_staging_bit_for_bit(serve, monkeypatch, rule, mode):
    torch = _torch_cuda()
    staged = run_job(torch, serve, monkeypatch, False, rule, mode)
    registered = run_job(torch, serve, monkeypatch, True, rule, mode)
    assert _registered_spans() == {}, "a centre stayed registered after the worker closed"
    for which, a_list, b_list in (("parameter", staged[0], registered[0]),
                                  ("centre", staged[1], registered[1])):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            if mode == "default":  # the overlap choice may differ: equal values, not bits
                np.testing.assert_array_equal(b, a, err_msg="%s %d" % (which, i))
                continue
            differ = np.flatnonzero(a.view(np.int32) != b.view(np.int32))
            assert not differ.size, "%s %d: %d elements differ, first %d: staging %r, " \
                "registered %r" % (which, i, differ.size, differ[0], a[differ[0]], b[differ[0]])


@pytest.mark.parametrize("snapshot", [None, True, False])
def test_start_sync_leaves_the_compute_stream_running(serve, monkeypatch, snapshot):
    """start_sync queues its copies behind an event: it returns while a long kernel is still
    running on the compute stream (the staging path's device-to-host copy would wait for
    it), and wait() gives what sync_params gives."""
    torch = _torch_cuda()
    monkeypatch.setenv("PLATOON_REGISTERED_CENTRE", "require")
    x = torch.zeros(1 << 20, device="cuda")
    ctl = Nothing(control_port=0)
    serving = serve(ctl, timeout=60.0)
    with Worker(ctl.control_port, timeout_s=30) as w:
        w.init_shared_params([x], EASGD(0.5))
        x += 3.0
        torch.cuda._sleep(2_000_000_000)  # noqa: SLF001 (about a second of GPU clock cycles)
        handle = w.start_sync(snapshot=snapshot)
        busy = not torch.cuda.current_stream().query()
        handle.wait(30)
        torch.cuda.synchronize()
        assert busy, "start_sync waited for the compute stream"
        np.testing.assert_array_equal(x.cpu().numpy(), np.full(1 << 20, 1.5, np.float32))
        np.testing.assert_array_equal(ctl.centre[0], np.full(1 << 20, 1.5, np.float32))
    serving.join()


def test_two_worker_processes_share_one_gpu_through_the_registered_centre(procs, tmp_path):
    """Two real workers on cuda:0, each registering its own mapping of the centre."""
    _torch_cuda()
    ctl = procs("step_controller.py", 2, tmp_path / "centre.npz", 120)
    port = int(ctl.wait_for_line("PORT").split()[1])
    env = {"PLATOON_REGISTERED_CENTRE": "require"}
    workers = [procs("gpu_worker.py", port, 2, "float32", "cuda:0", env=env) for _ in range(2)]
    results = {}
    for p in workers:
        worker_id, value = p.wait_for_line("RESULT", timeout=90).split()[1:]
        results[int(worker_id)] = float(value)
        assert p.wait(60) == 0, p.output
    assert ctl.wait(60) == 0, ctl.output
    # worker 0: 1 and centre 0 -> 0.5, centre 0.5; worker 1: 2 and 0.5 -> 1.25, centre 1.25
    assert results == {0: 0.5, 1: 1.25}
    np.testing.assert_array_equal(np.load(tmp_path / "centre.npz")["arr_0"],
                                  np.full(1000, 1.25, np.float32))


def test_a_worker_killed_mid_sync_leaves_no_lock_held(procs):
    _torch_cuda()
    with Controller(control_port=0, liveness_interval_s=0.2) as ctl:
        died = []

        def run():
            try:
                ctl.serve(timeout_s=60)
            except WorkerDied as exc:
                died.append(exc)

        serving = threading.Thread(target=run, daemon=True)
        serving.start()
        victim = procs(os.path.join(HERE, "registered_worker.py"), ctl.control_port)
        victim.wait_for_line("READY", timeout=90)
        victim.wait_for_line("SYNCING", timeout=60)  # syncing back to back: killed mid-sync
        victim.kill()
        serving.join(30)
        assert died, "the controller did not notice the killed worker"
        centre = ctl.shared_centre
        for lock in centre.stripe_locks:
            lock.acquire(5.0)  # LockTimeout if the dead worker's lock stayed held
            lock.release()
        centre.lock.acquire(5.0)
        centre.lock.release()
