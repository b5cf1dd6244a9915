"""PyTorch tensors: CPU tensors shared in place, CUDA tensors through pinned staging.

torch may move a shared tensor's memory after it was shared (``model.share_memory()``,
``p.data = ...``, ``p.set_(...)``) or convert it (``model.double()``). Before every sync
(`pull`) each tensor is checked against what was shared (one data-pointer comparison per
tensor, no copy): a CPU tensor that moved with the same dtype and shape is
re-bound and keeps syncing; one whose dtype, shape or device changed raises LayoutMismatch,
and nothing touches its old memory.

bfloat16, which numpy cannot hold, is staged as float32: the centre, the sync rule and
checkpoints see float32 values (exact), and each sync writes back the float32 result
rounded to bfloat16 by ``copy_``. CUDA tensors and CPU bfloat16 tensors go through one
flat host buffer (pinned for CUDA) holding every tensor's staging array, except where the
registered centre syncs CUDA float32 tensors on the GPU (`torch_registered`): then `pull`
and `push` copy nothing.
"""

import logging

import torch

from ..errors import LayoutMismatch
from . import Adapter

log = logging.getLogger(__name__)

STAGED_AS = {torch.bfloat16: torch.float32}  # dtypes numpy lacks, and what stands in for them
_ALIGN = 64  # bytes; each staging array starts on a cache line


def _check(i, t, contiguous=True):
    if t.dtype not in STAGED_AS and not _numpy_holds(t.dtype):
        raise TypeError("parameter %d is %s, which numpy cannot hold; keep a float32 master copy "
                        "of it for syncing" % (i, t.dtype))
    if contiguous and not t.is_contiguous():
        raise TypeError("parameter %d is a non-contiguous tensor; pass .contiguous() tensors" % i)


def _numpy_holds(dtype):
    if dtype == getattr(torch, "complex32", None):  # (creating one warns)
        return False
    try:
        torch.empty(0, dtype=dtype).numpy()
    except (TypeError, RuntimeError):  # "Got unsupported ScalarType ...", quantized types
        return False
    return True


def staged_dtype(dtype):
    """The dtype of the host array that stands for a tensor of `dtype` (float32 for bfloat16)."""
    return STAGED_AS.get(dtype, dtype)


def flat_staging(tensors, pin):
    """Host staging tensors for `tensors`, carved out of one flat buffer (pinned if `pin`):
    one allocation (pinned memory is rounded up per allocation), each view 64-byte aligned,
    in the tensor's shape and its `staged_dtype`."""
    dtypes = [staged_dtype(t.dtype) for t in tensors]
    offsets, end = [], 0
    for t, dtype in zip(tensors, dtypes):
        start = -(-end // _ALIGN) * _ALIGN
        offsets.append(start)
        end = start + t.numel() * dtype.itemsize
    flat = torch.empty(max(end, 1), dtype=torch.uint8, pin_memory=pin)
    return [flat[start:start + t.numel() * dtype.itemsize].view(dtype).view(t.shape)
            for t, dtype, start in zip(tensors, dtypes, offsets)]


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


class TorchStagedAdapter(Adapter):
    """Tensors mirrored in host staging arrays: CUDA tensors (pinned staging, asynchronous
    copies, one wait per direction), and CPU tensor lists holding bfloat16 (plain memory)."""

    def __init__(self, params, names=None):
        self._layouts = [(p.dtype, p.shape, p.device.type) for p in params]
        self._staging = flat_staging(params, pin=any(p.is_cuda for p in params))
        self._names = names
        self._on_device = False  # the registered centre syncs: no staging copies
        super().__init__(params, [s.numpy() for s in self._staging])

    def device_sync(self, rule, centre, timeout_s):
        """The registered centre's RegisteredSync for CUDA float32 tensors synced by EASGD or
        ASGD, where CUDA registers the centre; else None (the staging path; why is logged
        once per process)."""
        if not all(p.is_cuda for p in self._params):
            return None
        from . import torch_registered
        sync = torch_registered.attach(self.params, rule, centre, timeout_s)
        self._on_device = sync is not None
        return sync

    def pull(self, params=None):
        super().pull(params)
        # copy_ follows a tensor torch moved, but would convert dtypes and broadcast shapes.
        for i, (p, layout) in enumerate(zip(self._params, self._layouts)):
            if (p.dtype, p.shape, p.device.type) != layout:
                raise layout_changed(_which(i, self._names), describe_layout(*layout), p)
        if self._on_device:
            return
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                s.copy_(p.detach(), non_blocking=True)  # device to host, converting bfloat16
        self._wait()

    def push(self):
        if self._on_device:
            return
        with torch.no_grad():
            for s, p in zip(self._staging, self._params):
                p.copy_(s, non_blocking=True)
        self._wait()  # the staging may be written again (next pull) only once these are done

    def _wait(self):
        """Wait for the copies queued on the current stream of each GPU holding a parameter
        (non_blocking copies from or to pinned memory are asynchronous; for CPU tensors a no-op)."""
        for device in {p.device for p in self._params if p.device.type == "cuda"}:
            torch.cuda.current_stream(device).synchronize()


def adapt(params, names=None):
    """An Adapter for a list of tensors; `names` (one per tensor, optional) name them in errors."""
    for i, t in enumerate(params):
        _check(i, t)
    devices = {t.device.type for t in params}
    if devices == {"cpu"}:
        if any(t.dtype in STAGED_AS for t in params):
            return TorchStagedAdapter(params, names)
        return TorchCPUAdapter(params, names)
    if devices == {"cuda"}:
        return TorchStagedAdapter(params, names)
    raise TypeError("parameters live on %s; put them all on the CPU or all on the worker's GPU"
                    % ", ".join(sorted(devices)))


def host_arrays(tensors):
    """`platoon.adapters.host_arrays` for torch tensors: CPU ones as numpy views; CUDA ones
    copied into one flat pinned buffer (torch caches it for the next call) and back;
    bfloat16 ones as float32 copies, installed back rounded."""
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError("array %d is a %s, not a tensor" % (i, type(t).__name__))
        _check(i, t, contiguous=False)
    copied = [t for t in tensors if t.device.type != "cpu" or t.dtype in STAGED_AS]
    staged = TorchStagedAdapter(copied) if copied else None
    if staged is not None:
        staged.pull()
    it = iter(staged.arrays if staged is not None else [])
    hosts = [next(it) if t.device.type != "cpu" or t.dtype in STAGED_AS else t.detach().numpy()
             for t in tensors]

    def install():
        if staged is not None:
            staged.push()

    return hosts, install
