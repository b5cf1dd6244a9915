"""PyTorch tensors: CPU tensors shared in place, CUDA tensors through pinned staging buffers."""

import torch

from . import Adapter


def _check(i, t, contiguous=True):
    if t.dtype in (torch.bfloat16, getattr(torch, "complex32", torch.bfloat16)):
        raise TypeError("parameter %d is %s, which numpy cannot hold; keep a float32 master copy "
                        "of it for syncing" % (i, t.dtype))
    if contiguous and not t.is_contiguous():
        raise TypeError("parameter %d is a non-contiguous tensor; pass .contiguous() tensors" % i)


class TorchCUDAAdapter(Adapter):
    def __init__(self, params):
        self._staging = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        super().__init__(params, [s.numpy() for s in self._staging])

    def pull(self, params=None):
        super().pull(params)
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                s.copy_(p.detach())  # device to host; synchronous into pinned memory

    def push(self):
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                p.copy_(s)


def adapt(params):
    for i, t in enumerate(params):
        _check(i, t)
    devices = {t.device.type for t in params}
    if devices == {"cpu"}:
        return Adapter(params, [t.detach().numpy() for t in params])
    if devices == {"cuda"}:
        return TorchCUDAAdapter(params)
    raise TypeError("parameters live on %s; put them all on the CPU or all on the worker's GPU"
                    % ", ".join(sorted(devices)))


def host_arrays(tensors):
    """`platoon.adapters.host_arrays` for torch tensors: CPU ones as numpy views, CUDA ones
    copied to host and back."""
    hosts, devices = [], []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError("array %d is a %s, not a tensor" % (i, type(t).__name__))
        _check(i, t, contiguous=False)
        if t.device.type == "cpu":
            hosts.append(t.detach().numpy())
        else:
            hosts.append(t.detach().cpu().numpy())
            devices.append((t, hosts[-1]))

    def install():
        with torch.no_grad():
            for t, host in devices:
                t.copy_(torch.from_numpy(host))

    return hosts, install
