"""Framework adapters: torch tensors and modules shared with real workers, the layout checks of
the CuPy and pycuda adapters (on numpy arrays, which have the same flags), JAX on the CPU; the
GPU paths are in tests/gpu/test_gpu_adapters.py and skip without a GPU."""

import numpy as np
import pytest

from platoon import EASGD, Controller, PlatoonError, Worker, adapters

torch = pytest.importorskip("torch", reason="the torch adapter tests need PyTorch")


class Nothing(Controller):
    def handle_control(self, req, worker_id, req_info):
        return None


def test_cpu_tensors_are_shared_without_copy():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    adapter = adapters.adapt([t])
    assert adapter.arrays[0].ctypes.data == t.data_ptr()
    adapter.arrays[0][0, 0] = 42.0
    assert t[0, 0].item() == 42.0


def test_module_parameters_sync_in_place_with_easgd(serve):
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    torch.manual_seed(0)
    a_model, b_model = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with Worker(ctl.control_port, timeout_s=5) as a, Worker(ctl.control_port, timeout_s=5) as b:
        a.init_shared_params(a_model, EASGD(0.5))
        b.init_shared_params(b_model, EASGD(0.5))
        torch.testing.assert_close(b_model.weight, a_model.weight)  # b starts from the centre
        weight_before = a_model.weight.detach().clone()
        with torch.no_grad():
            a_model.weight += 2.0
        returned = a.sync_params()  # the same tensors, synced in place
        assert [t is p for t, p in zip(returned, a_model.parameters())] == [True, True]
        torch.testing.assert_close(a_model.weight, weight_before + 1.0)  # moved halfway back
        np.testing.assert_allclose(ctl.centre[0], (weight_before + 1.0).numpy())
        # Training still works on the shared tensors.
        loss = b_model(torch.ones(4, 3)).sum()
        loss.backward()
        torch.optim.SGD(b_model.parameters(), lr=0.1).step()
        b.sync_params()
    serving.join()


def test_unsupported_and_mixed_parameters():
    with pytest.raises(TypeError, match="parameter 0 is a builtins.str"):
        adapters.adapt(["weights"])
    with pytest.raises(TypeError, match="mix frameworks"):
        adapters.adapt([np.zeros(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="float8_e4m3fn, which numpy cannot hold"):
        adapters.adapt([torch.zeros(2, dtype=torch.float8_e4m3fn)])
    with pytest.raises(TypeError, match="non-contiguous"):
        adapters.adapt([torch.zeros(4, 4).t()])


def test_pycuda_helper_fails_clearly_without_a_gpu():
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("pycuda is installed: tests/gpu/test_gpu_adapters.py covers it")
    except ImportError:
        pass
    from platoon.cuda import init_context
    with pytest.raises(PlatoonError, match="pycuda is not installed"):
        init_context()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_cuda_tensors_go_through_pinned_staging(serve):
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    model = torch.nn.Linear(64, 64).cuda()
    with Worker(ctl.control_port, timeout_s=5) as w:
        w.init_shared_params(model, EASGD(0.5))
        with torch.no_grad():
            model.weight += 2.0
        w.sync_params()
        np.testing.assert_allclose(ctl.centre[0], model.weight.detach().cpu().numpy(),
                                   rtol=1e-6)
    serving.join()


def test_jax_arrays_are_replaced_by_sync(serve):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        params = [jnp.zeros(3)]
        w.init_shared_params(params, EASGD(0.5))
        params = [params[0] + 2.0]
        params = w.sync_params(params=params)
        np.testing.assert_allclose(np.asarray(params[0]), 1.0)
    serving.join()


def test_device_arrays_are_staged_in_their_own_order_or_refused():
    """The CuPy and pycuda adapters stage each array in its memory order (pycuda copies two
    contiguous arrays flat, so a Fortran array staged in C order would land transposed) and
    refuse other layouts before anything is copied, saying how to fix it."""
    c = np.zeros((3, 4), np.float32)
    assert adapters.staging_order(0, c, "x") == "C"
    assert adapters.staging_order(0, np.asfortranarray(c), "x") == "F"
    assert adapters.staging_order(0, c[1], "x") == "C"
    with pytest.raises(TypeError, match=r"parameter 2 is not contiguous \(strides \(16,\) for "
                                        r"shape \(3,\)\).*share cupy.ascontiguousarray\(p\)"):
        adapters.staging_order(2, c[:, 0], "cupy.ascontiguousarray(p)")
    with pytest.raises(TypeError, match="not contiguous"):
        adapters.staging_order(0, c[:, ::2], "x")


def test_flat_staging_holds_every_tensor_aligned_in_one_buffer():
    from platoon.adapters.torch_adapter import flat_staging
    tensors = [torch.zeros(3), torch.zeros(2, 5, dtype=torch.bfloat16), torch.zeros(0),
               torch.zeros(7, dtype=torch.float64), torch.zeros(1, dtype=torch.int8)]
    staging = flat_staging(tensors, pin=False)
    assert [s.dtype for s in staging] == [torch.float32, torch.float32, torch.float32,
                                          torch.float64, torch.int8]
    assert [s.shape for s in staging] == [t.shape for t in tensors]
    base = staging[0].untyped_storage().data_ptr()
    assert all(s.untyped_storage().data_ptr() == base for s in staging)  # one allocation
    spans = [(s.data_ptr(), s.data_ptr() + s.numel() * s.element_size()) for s in staging]
    assert all((a - base) % 64 == 0 for a, _ in spans)
    spans = sorted(span for span in spans if span[0] != span[1])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap


def test_bfloat16_tensors_sync_as_float32(serve):
    """bfloat16 (numpy has none) is staged as float32: the centre is float32, and the sync's
    result is written back rounded to bfloat16."""
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.copy_(torch.arange(6.0).reshape(2, 3))
        model.bias.fill_(-1.0)
    with Worker(ctl.control_port, timeout_s=5) as w:
        w.init_shared_params(model, EASGD(0.5))
        assert ctl.centre[0].dtype == np.float32
        np.testing.assert_array_equal(ctl.centre[0], np.arange(6.0).reshape(2, 3))
        with torch.no_grad():
            model.weight += 3.0
        w.sync_params()  # EASGD 0.5: both move halfway, by 1.5
        expected = np.arange(6.0).reshape(2, 3) + 1.5
        assert model.weight.dtype == torch.bfloat16
        np.testing.assert_array_equal(model.weight.detach().float().numpy(), expected)
        np.testing.assert_array_equal(ctl.centre[0], expected)
        model.weight.data = model.weight.data.float()  # converted after sharing
        with pytest.raises(PlatoonError, match=r"torch.bfloat16 \[2, 3\] on cpu to "
                                               r"torch.float32"):
            w.sync_params()
    serving.join()


@pytest.mark.parametrize("snapshot", [False, True])
def test_bfloat16_tensors_start_sync(serve, snapshot):
    """start_sync through the staging: the update runs on the float32 staging arrays and
    wait() writes the result back (with a snapshot, on top of the updates made meanwhile)."""
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    x = torch.zeros(4096, dtype=torch.bfloat16)
    with Worker(ctl.control_port, timeout_s=5) as w:
        w.init_shared_params([x], EASGD(0.5))
        x += 3.0
        handle = w.start_sync(snapshot=snapshot)
        assert handle.snapshot is snapshot
        if snapshot:
            x += 1.0
        handle.wait(10)
        # EASGD: x += -0.5 * (x_snap - c) with x_snap = 3, c = 0; the centre moves to 1.5
        assert x.dtype == torch.bfloat16
        np.testing.assert_array_equal(x.float().numpy(), np.full(4096, 2.5 if snapshot else 1.5))
        np.testing.assert_array_equal(ctl.centre[0], np.full(4096, 1.5))
    serving.join()


def test_host_arrays_of_bfloat16_tensors_are_float32_copies_installed_back():
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    f = torch.zeros(2)
    (host, host_f), install = adapters.host_arrays([t, f])
    assert host.dtype == np.float32 and host_f.ctypes.data == f.data_ptr()
    host[...] = [0.5, 1.0 / 3.0, 256.0]
    install()
    assert t.dtype == torch.bfloat16
    assert t.tolist() == [0.5, torch.tensor(1.0 / 3.0).bfloat16().item(), 256.0]


def test_jax_arrays_returned_by_a_sync_stay_unchanged(serve):
    """device_put may alias its numpy input (JAX's CPU backend does, for a 64-byte aligned
    one): the arrays a sync returns must not share memory with the staging arrays that the
    next sync rewrites. (Eight sizes: some staging array lands 64-byte aligned.)"""
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    sizes = [1000 + 4 * k for k in range(8)]
    with Worker(ctl.control_port, timeout_s=5) as w:
        params = [jnp.zeros(n) for n in sizes]
        w.init_shared_params(params, EASGD(0.5))
        first = w.sync_params(params=[p + 2.0 for p in params])  # x = 1, centre 1
        w.sync_params(params=[p + 4.0 for p in first])  # the staging holds 5, then 3
        # (read through a computation: np.asarray caches an array's first reading)
        for p, n in zip(first, sizes):
            np.testing.assert_array_equal(np.asarray(p + 0.0), np.ones(n))
    serving.join()


def test_two_worker_processes_with_bfloat16_tensors(procs, tmp_path):
    """The GPU test's two workers (tests/gpu/test_gpu_adapters.py), with CPU tensors."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
    from test_gpu_adapters import two_workers_in_turn
    two_workers_in_turn(procs, tmp_path, "cpu")


# The registered centre (platoon.adapters.cuda_register, torch_registered): what a machine
# without CUDA can check. The GPU side is tests/gpu/test_gpu_registered.py.


class Registrar:
    """Records what a Registry asks of the CUDA driver (the bookkeeping under test is ours)."""

    def __init__(self):
        self.calls = []

    def register(self, start, length, **how):
        self.calls.append(("register", start, length, how))
        return ("handle", start)

    def unregister(self, start, handle):
        self.calls.append(("unregister", start, handle))


def test_registration_covers_whole_pages_once_and_never_zero_bytes():
    from platoon.adapters.cuda_register import RegistrationRefused, Registry, page_span
    assert page_span(8192, 1, page=4096) == (8192, 4096)
    assert page_span(8192 + 100, 4096, page=4096) == (8192, 8192)  # spills into a second page
    assert page_span(8192, 0, page=4096) is None
    registrar = Registrar()
    registry = Registry(registrar.register, registrar.unregister, page=4096)
    with pytest.raises(RegistrationRefused, match="zero bytes"):
        registry.add(8192, 0)
    first = registry.add(8192, 5000, ordinal=0)
    assert registrar.calls == [("register", 8192, 8192, {"ordinal": 0})]
    for address, nbytes in ((8192, 1), (12288 + 10, 100), (4096, 4097)):  # overlapping pages
        with pytest.raises(RegistrationRefused, match="registered already"):
            registry.add(address, nbytes)
    other = registry.add(16384, 4096)  # the next page is free
    assert registry.spans == {8192: 8192, 16384: 4096}
    first.close()
    first.close()  # idempotent: one unregister
    assert registrar.calls[-1] == ("unregister", 8192, ("handle", 8192))
    assert [c[0] for c in registrar.calls].count("unregister") == 1
    registry.add(8192, 4096).close()  # free again once unregistered
    other.close()
    assert registry.spans == {}


def test_the_centre_is_unregistered_while_still_mapped(tmp_path):
    """SharedCentre.close runs its hooks (unregistering from CUDA) before the unmap."""
    from platoon._centre.shmem import SharedCentre  # noqa: PLC2701 (the centre itself)
    from platoon.adapters.cuda_register import Registry
    registrar = Registrar()
    registry = Registry(registrar.register, registrar.unregister)
    seen = []
    with SharedCentre.create("t27", [{"dtype": "float32", "shape": [3000]}]) as centre:
        address, nbytes = centre.mapping()
        assert address % 4096 == 0 and nbytes == centre.size
        centre.arrays[0][:] = 7.0
        registration = registry.add(address, nbytes)
        centre.on_close(lambda: seen.append(
            np.frombuffer(centre._map, np.float32, 1, 4096)[0]))  # noqa: SLF001 (mapped?)
        centre.on_close(registration.close)  # runs first (newest first), then the reader
        assert registrar.calls[0][1:3] == (address, 4096 * 4)  # header + 12000 bytes, pages
        centre.close()
        assert registrar.calls[-1][:2] == ("unregister", address)
        assert seen == [7.0]  # the mapping was still there for the hooks
        centre.close()
        assert len(registrar.calls) == 2 and seen == [7.0]  # hooks run once
        with pytest.raises(PlatoonError, match="closed"):
            centre.mapping()


def test_registered_centre_setting(monkeypatch):
    from platoon.adapters import cuda_register as cr
    for text, mode in (("", cr.AUTO), ("auto", cr.AUTO), ("1", cr.AUTO), ("0", cr.OFF),
                       ("off", cr.OFF), ("require", cr.REQUIRE)):
        assert cr.setting({"PLATOON_REGISTERED_CENTRE": text}) == mode
    assert cr.setting({}) == cr.AUTO
    with pytest.raises(ValueError, match="give 0 .* auto .* or require"):
        cr.setting({"PLATOON_REGISTERED_CENTRE": "yes"})


def test_without_cuda_registration_is_refused_saying_why():
    from platoon._centre.shmem import SharedCentre  # noqa: PLC2701 (the centre itself)
    from platoon.adapters import torch_registered
    from platoon.adapters.cuda_register import RegistrationRefused
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: tests/gpu/test_gpu_registered.py covers registration")
    with SharedCentre.create("t27", [{"dtype": "float32", "shape": [10]}]) as centre:
        with pytest.raises(RegistrationRefused, match="CUDA|cuInit|device"):
            torch_registered.register_centre(centre, 0)
        assert centre._close_hooks == []  # noqa: SLF001 (nothing to undo at close)


def test_the_staging_fallback_says_why_once_per_process(monkeypatch, caplog):
    """Parameters the registered centre cannot take: the reason is logged at INFO once per
    process, at DEBUG afterwards; PLATOON_REGISTERED_CENTRE=require raises it instead."""
    from platoon import ASGD
    from platoon._centre.shmem import SharedCentre  # noqa: PLC2701 (the centre itself)
    from platoon.adapters import cuda_register, torch_registered
    monkeypatch.setattr(cuda_register, "_told", __import__("threading").Event())
    params = [torch.zeros(10)]  # on the CPU: never registered
    with SharedCentre.create("t27", [{"dtype": "float32", "shape": [10]}]) as centre:
        with caplog.at_level("DEBUG", logger="platoon.adapters.cuda_register"):
            for rule in (EASGD(0.5), ASGD()):
                assert torch_registered.attach(lambda: params, rule, centre, 5.0) is None
        said = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in said] == ["INFO", "DEBUG"], said
        assert "not all on one GPU (cpu)" in said[0][1] and "=0" in said[0][1]
        monkeypatch.setenv("PLATOON_REGISTERED_CENTRE", "require")
        with pytest.raises(PlatoonError, match="=require, but .* not all on one GPU"):
            torch_registered.attach(lambda: params, EASGD(0.5), centre, 5.0)
        caplog.clear()
        monkeypatch.setenv("PLATOON_REGISTERED_CENTRE", "0")
        assert torch_registered.attach(lambda: params, EASGD(0.5), centre, 5.0) is None
        assert caplog.records == []  # turned off: nothing to say


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_tensors_never_take_the_registered_path(serve, caplog, dtype):
    ctl = Nothing(control_port=0)
    serving = serve(ctl)
    x = torch.full((1000,), 3.0, dtype=getattr(torch, dtype))
    with caplog.at_level("DEBUG", logger="platoon.adapters"):
        with Worker(ctl.control_port, timeout_s=10) as w:
            w.init_shared_params([x], EASGD(0.5))
            assert w._exchange.device is None  # noqa: SLF001
            x += 2.0
            w.sync_params()
            assert x[0].item() == 4.0 and ctl.centre[0][0] == 4.0
    assert not [r for r in caplog.records if "registered" in r.getMessage()]
    serving.join()
