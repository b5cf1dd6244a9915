"""The GPU paths of the adapters and of platoon.cuda, for a machine with a CUDA GPU.

Run there: python -m pytest -q -rs tests/gpu (each test skips, saying why, without its
framework or a GPU). PyTorch (float32 and bfloat16, sync_params and start_sync with and
without snapshot, two worker processes sharing cuda:0), CuPy (C and F order, a
non-contiguous array refused, start_sync, a non-blocking user stream), JAX on the GPU, and
pycuda with platoon.cuda's primary context (last: it leaves that context current on the
main thread, as a pycuda user's script does). The CuPy and pycuda tests change values with
get()/set() only, so they need no kernel compiler.
"""

import os
import threading

import numpy as np
import pytest

from platoon import EASGD, Controller, Worker

# JAX preallocates 75% of the GPU at its first use, leaving torch, CuPy and the worker
# processes too little; read when JAX's GPU backend starts, so set before any test runs.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


class Nothing(Controller):
    def handle_control(self, req, worker_id, req_info):
        return None


@pytest.fixture
def worker(serve):
    """(controller, worker): one worker of a job served in this process."""
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=20) as w:
        yield ctl, w
    serving.join()


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    return torch


def _cupy():
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or CUDARuntimeError without a driver
        pytest.skip("CuPy is not usable here: %s" % exc)
    if count == 0:
        pytest.skip("no CUDA GPU visible to CuPy")
    return cupy


def _is_pinned(array):
    import torch
    return torch.from_numpy(array).is_pinned()  # asks CUDA about the pointer


# PyTorch


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cuda_tensors_sync_through_one_pinned_staging_buffer(worker, dtype):
    torch = _torch_cuda()
    ctl, w = worker
    model = torch.nn.Linear(3, 2).cuda().to(getattr(torch, dtype))
    with torch.no_grad():
        model.weight.copy_(torch.arange(6.0).reshape(2, 3))
        model.bias.fill_(-1.0)
    w.init_shared_params(model, EASGD(0.5))
    staging = w._adapter.arrays  # noqa: SLF001 (what the syncs copy through)
    assert all(_is_pinned(a) for a in staging)
    assert staging[1].ctypes.data - staging[0].ctypes.data == 64  # 24 bytes, then aligned
    assert ctl.centre[0].dtype == np.float32
    for step in range(1, 3):
        with torch.no_grad():
            model.weight += 3.0
        w.sync_params()  # EASGD 0.5: both move halfway, by 1.5
        expected = np.arange(6.0).reshape(2, 3) + 1.5 * step
        assert model.weight.dtype == getattr(torch, dtype) and model.weight.is_cuda
        np.testing.assert_array_equal(model.weight.detach().float().cpu().numpy(), expected)
        np.testing.assert_array_equal(ctl.centre[0], expected)
        np.testing.assert_array_equal(ctl.centre[1], [-1.0, -1.0])


@pytest.mark.parametrize("snapshot", [False, True])
def test_torch_start_sync_on_cuda(worker, snapshot):
    torch = _torch_cuda()
    ctl, w = worker
    x = torch.zeros(4096, device="cuda")
    w.init_shared_params([x], EASGD(0.5))
    x += 3.0
    handle = w.start_sync(snapshot=snapshot)
    assert handle.snapshot is snapshot
    if snapshot:
        x += 1.0  # after the snapshot: wait() applies the sync on top of it
    handle.wait(30)
    # EASGD: x += -0.5 * (x_snap - c) with x_snap = 3, c = 0; the centre moves to 1.5
    np.testing.assert_array_equal(x.cpu().numpy(), np.full(4096, 2.5 if snapshot else 1.5))
    np.testing.assert_array_equal(ctl.centre[0], np.full(4096, 1.5))


def test_two_worker_processes_share_one_gpu(procs, tmp_path):
    """Two real workers on cuda:0 (as ``-D cuda0 cuda0`` starts them), syncing in turn."""
    _torch_cuda()
    two_workers_in_turn(procs, tmp_path, "cuda:0")


def two_workers_in_turn(procs, tmp_path, device):
    """Runs two tests/procs/gpu_worker.py processes with bfloat16 tensors on `device`."""
    ctl = procs("step_controller.py", 2, tmp_path / "centre.npz", 120)
    port = int(ctl.wait_for_line("PORT").split()[1])
    workers = [procs("gpu_worker.py", port, 2, "bfloat16", device) for _ in range(2)]
    results = {}
    for p in workers:
        assert p.wait_for_line("DEVICE", timeout=60).startswith("DEVICE %s " % device)
        worker_id, value = p.wait_for_line("RESULT", timeout=60).split()[1:]
        results[int(worker_id)] = float(value)
        assert p.wait(60) == 0, p.output
    assert ctl.wait(60) == 0, ctl.output
    # worker 0: 1 and centre 0 -> 0.5, centre 0.5; worker 1: 2 and 0.5 -> 1.25, centre 1.25
    assert results == {0: 0.5, 1: 1.25}
    centre = np.load(tmp_path / "centre.npz")["arr_0"]
    assert centre.dtype == np.float32
    np.testing.assert_array_equal(centre, np.full(1000, 1.25))


# CuPy


def _cupy_array(cupy, values, order):
    """A CuPy array holding `values` in `order`, made without a kernel (set() copies)."""
    p = cupy.ndarray(values.shape, values.dtype, order=order)
    p.set(np.asarray(values, order=order))
    return p


def _cupy_add(cupy, p, value):
    """p += value through the host; done on the GPU when this returns (set() from pageable
    memory may return before its copy lands)."""
    p.set(p.get() + value)
    cupy.cuda.get_current_stream().synchronize()


@pytest.mark.parametrize("order", ["C", "F"])
def test_cupy_arrays_sync_in_their_own_order(worker, order):
    cupy = _cupy()
    ctl, w = worker
    start = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = _cupy_array(cupy, start, order)
    w.init_shared_params([p], EASGD(0.5))
    assert w._adapter.arrays[0].flags["%s_CONTIGUOUS" % order]  # noqa: SLF001 (staging)
    for step in range(1, 3):
        _cupy_add(cupy, p, 2.0)
        w.sync_params()
        expected = start + step
        np.testing.assert_array_equal(p.get(), expected)
        np.testing.assert_array_equal(ctl.centre[0], expected)  # not transposed


def test_cupy_non_contiguous_array_is_refused_with_the_remedy(worker):
    cupy = _cupy()
    ctl, w = worker
    p = cupy.ndarray((4, 4), np.float32)[:, ::2]
    with pytest.raises(TypeError, match=r"parameter 0 is not contiguous .*"
                                        r"cupy.ascontiguousarray\(p\)"):
        w.init_shared_params([p], EASGD(0.5))
    assert ctl.centre is None  # refused before the centre was made


@pytest.mark.parametrize("snapshot", [False, True])
def test_cupy_start_sync(worker, snapshot):
    cupy = _cupy()
    ctl, w = worker
    p = _cupy_array(cupy, np.zeros(1000, np.float32), "C")
    w.init_shared_params([p], EASGD(0.5))
    _cupy_add(cupy, p, 4.0)
    handle = w.start_sync(snapshot=snapshot)
    handle.wait(30)
    np.testing.assert_array_equal(p.get(), np.full(1000, 2.0, np.float32))
    np.testing.assert_array_equal(ctl.centre[0], np.full(1000, 2.0, np.float32))


def test_cupy_values_are_on_the_gpu_when_sync_params_returns(worker):
    """set() from pinned memory only queues its copy on the current stream; the adapter
    waits for it, so a read on another stream (not ordered after it) sees the sync's result,
    and the staging is never rewritten under a copy still reading it."""
    cupy = _cupy()
    ctl, w = worker
    n = 1 << 24  # 64 MiB: an upload takes milliseconds
    p = _cupy_array(cupy, np.zeros(n, np.float32), "C")
    w.init_shared_params([p], EASGD(0.5))
    upload, read = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for step in range(1, 4):
        with upload:
            _cupy_add(cupy, p, 2.0)
            w.sync_params()  # its uploads are queued on `upload`
        got = p.get(stream=read)  # blocking on `read` only
        np.testing.assert_array_equal(got, np.full(n, step, np.float32))
        np.testing.assert_array_equal(ctl.centre[0], np.full(n, step, np.float32))


# JAX


def _jax_gpu():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError as exc:  # no GPU backend
        pytest.skip("JAX has no GPU here (it runs on %s): %s" % (jax.default_backend(), exc))


def test_jax_arrays_sync_on_the_gpu(worker):
    jax, gpu = _jax_gpu()
    ctl, w = worker
    params = [jax.device_put(np.zeros(1000, np.float32), gpu)]
    w.init_shared_params(params, EASGD(0.5))
    first = w.sync_params(params=[params[0] + 2.0])
    assert first[0].devices() == {gpu}
    second = w.sync_params(params=[first[0] + 4.0])  # 1 + 4 against 1: 3
    assert second[0].devices() == {gpu}
    np.testing.assert_array_equal(np.asarray(first[0] + 0.0), np.ones(1000))  # unchanged
    np.testing.assert_array_equal(np.asarray(second[0]), np.full(1000, 3.0))
    np.testing.assert_array_equal(ctl.centre[0], np.full(1000, 3.0))


# pycuda (last: init_context leaves the primary context current on the main thread)


def _pycuda():
    cuda = pytest.importorskip("pycuda.driver", reason="pycuda is not installed")
    try:
        cuda.init()
        count = cuda.Device.count()
    except cuda.Error as exc:
        pytest.skip("CUDA is not usable by pycuda here: %s" % exc)
    if count == 0:
        pytest.skip("no CUDA GPU visible to pycuda")
    return cuda


def test_pycuda_context_is_the_primary_one():
    cuda = _pycuda()
    from platoon.cuda import init_context
    context = init_context()
    assert cuda.Context.get_current() == context
    assert context == cuda.Device(0).retain_primary_context()  # the runtime's context
    assert init_context() == context  # again on this thread: the same, not pushed twice
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():  # the runtime still works on this thread
        assert torch.ones(8, device="cuda").sum().item() == 8.0


@pytest.mark.parametrize("order", ["C", "F"])
def test_pycuda_gpuarrays_sync_in_their_own_order_from_any_thread(worker, order):
    _pycuda()
    import pycuda.gpuarray as gpuarray

    from platoon.cuda import init_context
    init_context()
    ctl, w = worker
    start = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = gpuarray.to_gpu(np.asarray(start, order=order))
    assert p.flags.f_contiguous if order == "F" else p.flags.c_contiguous
    w.init_shared_params([p], EASGD(0.5))
    assert w._adapter.arrays[0].flags["%s_CONTIGUOUS" % order]  # noqa: SLF001

    def add(value):
        host = p.get()
        host += value  # in place: keeps the array's order
        p.set(host)

    add(2.0)
    w.sync_params()
    np.testing.assert_array_equal(p.get(), start + 1.0)
    np.testing.assert_array_equal(ctl.centre[0], start + 1.0)  # not transposed
    add(2.0)
    errors = []

    def sync_elsewhere():  # a thread where no pycuda context is current
        try:
            w.sync_params()
        except Exception as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=sync_elsewhere)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not errors, errors
    np.testing.assert_array_equal(p.get(), start + 2.0)
    np.testing.assert_array_equal(ctl.centre[0], start + 2.0)


def test_pycuda_non_contiguous_gpuarray_is_refused(worker):
    _pycuda()
    import pycuda.gpuarray as gpuarray

    from platoon.cuda import init_context
    init_context()
    ctl, w = worker
    p = gpuarray.to_gpu(np.zeros((4, 4), np.float32))[:, ::2]
    with pytest.raises(TypeError, match="parameter 0 is not contiguous"):
        w.init_shared_params([p], EASGD(0.5))

