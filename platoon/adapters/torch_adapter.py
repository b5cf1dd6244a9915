"""PyTorch tensors: CPU tensors shared in place, CUDA tensors through pinned staging buffers.

torch may move a shared tensor's memory after it was shared (``model.share_memory()``,
``p.data = ...``, ``p.set_(...)``) or convert it (``model.double()``). Before every sync
(`pull`) each tensor is checked against what was shared (one data-pointer comparison per
tensor, no copy): a CPU tensor that moved with the same dtype and shape is
re-bound and keeps syncing; one whose dtype, shape or device changed raises LayoutMismatch,
and nothing touches its old memory.
"""

import logging

import torch

from ..errors import LayoutMismatch
from . import Adapter

log = logging.getLogger(__name__)


def _check(i, t, contiguous=True):
    if t.dtype in (torch.bfloat16, getattr(torch, "complex32", torch.bfloat16)):
        raise TypeError("parameter %d is %s, which numpy cannot hold; keep a float32 master copy "
                        "of it for syncing" % (i, t.dtype))
    if contiguous and not t.is_contiguous():
        raise TypeError("parameter %d is a non-contiguous tensor; pass .contiguous() tensors" % i)


def _which(i, names):
    return "parameter %d (%r)" % (i, names[i]) if names else "parameter %d" % i


def describe_layout(dtype, shape, device, contiguous=True):
    return "%s %s on %s%s" % (dtype, list(shape), device, "" if contiguous else ", non-contiguous")


def layout_changed(which, was, t):
    """The LayoutMismatch for shared tensor `which` (words), laid out as `was` then, as `t` now."""
    return LayoutMismatch(
        "%s changed from %s to %s after it was shared; the job's centre keeps the layout it "
        "was shared with. Convert or move the model (model.double(), .to(...)) before "
        "init_shared_params() / PeriodicSync, or put the tensor back as it was"
        % (which, was, describe_layout(t.dtype, t.shape, t.device, t.is_contiguous())))


class TorchCPUAdapter(Adapter):
    """CPU tensors shared through numpy views of their memory, re-bound when torch moves it."""

    def __init__(self, params, names=None):
        super().__init__(params, [t.detach().numpy() for t in params])
        self._names = names
        self._ptrs = [t.data_ptr() for t in params]
        self._layouts = [(t.dtype, t.shape) for t in params]
        self._told = False  # logged a re-binding at INFO once; DEBUG after

    def pull(self, params=None):
        super().pull(params)
        ptrs = [t.data_ptr() for t in self._params]  # a dtype or shape change moves them too
        if ptrs != self._ptrs:
            self._rebind([i for i, (now, was) in enumerate(zip(ptrs, self._ptrs)) if now != was])

    def _rebind(self, moved):
        for i in moved:  # all checked before any view is replaced
            t, (dtype, shape) = self._params[i], self._layouts[i]
            if (t.dtype, t.shape, t.device.type) != (dtype, shape, "cpu") \
                    or not t.is_contiguous():
                was = describe_layout(dtype, shape, "cpu")
                raise layout_changed(_which(i, self._names), was, t)
        for i in moved:
            t = self._params[i]
            self.arrays[i] = t.detach().numpy()  # in place: the Exchange holds this list
            self._ptrs[i] = t.data_ptr()
        log.log(logging.DEBUG if self._told else logging.INFO,
                "%d shared tensor(s) moved in memory (model.share_memory(), .data = or set_()), "
                "first %s; syncing follows them", len(moved), _which(moved[0], self._names))
        self._told = True
        if self.on_rebind is not None:
            self.on_rebind()


class TorchCUDAAdapter(Adapter):
    def __init__(self, params, names=None):
        self._staging = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        self._names = names
        super().__init__(params, [s.numpy() for s in self._staging])

    def pull(self, params=None):
        super().pull(params)
        # copy_ follows a tensor torch moved, but would convert dtypes and broadcast shapes.
        for i, (s, p) in enumerate(zip(self._staging, self._params)):
            if p.dtype != s.dtype or p.shape != s.shape:
                was = describe_layout(s.dtype, s.shape, "cuda")
                raise layout_changed(_which(i, self._names), was, p)
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                s.copy_(p.detach())  # device to host; synchronous into pinned memory

    def push(self):
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                p.copy_(s)


def adapt(params, names=None):
    """An Adapter for a list of tensors; `names` (one per tensor, optional) name them in errors."""
    for i, t in enumerate(params):
        _check(i, t)
    devices = {t.device.type for t in params}
    if devices == {"cpu"}:
        return TorchCPUAdapter(params, names)
    if devices == {"cuda"}:
        return TorchCUDAAdapter(params, names)
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
