"""Framework adapters: torch tensors and modules shared with real workers; GPU paths skip here."""

import numpy as np
import pytest

from platoon import EASGD, Controller, PlatoonError, Worker
from platoon import adapters

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
        assert a.sync_params() is not None
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
    with pytest.raises(TypeError, match="numpy cannot hold"):
        adapters.adapt([torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(TypeError, match="non-contiguous"):
        adapters.adapt([torch.zeros(4, 4).t()])


def test_pycuda_helper_fails_clearly_without_a_gpu():
    try:
        import pycuda.driver  # noqa: F401
        pytest.skip("pycuda is installed: tests/gpu/check_gpu.py covers it")
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
