"""Adapters let `Worker.init_shared_params` take any framework's parameters.

An adapter exposes the parameters as host numpy arrays that the sync rule
updates (`arrays`), with `pull()` to bring device values into them before a
sync and `push()` to install the result afterwards. numpy arrays and PyTorch
CPU tensors are shared without any copy; CUDA tensors, CuPy and pycuda arrays
go through one device-to-host and one host-to-device copy per sync into
pinned staging buffers (CUDA bfloat16 tensors are staged, and synced, as float32), except
CUDA float32 tensors under EASGD or ASGD where CUDA registers the centre's shared memory
(`Adapter.device_sync`: the registered centre of `torch_registered`, no staging copies);
JAX arrays are immutable, so `push()` builds new ones (`params()` returns them). Device
arrays are checked when shared: contiguous (C or, for CuPy and pycuda, Fortran order, whose
staging follows it so that no parameter lands transposed in the centre), of a dtype numpy
can hold. A PyTorch tensor that torch moves after it was
shared (``model.share_memory()``, ``.data = ...``) is re-bound at the next
`pull()`; one converted to another dtype or shape raises LayoutMismatch there
(see `torch_adapter`). Each framework's module is imported only when its
arrays are seen, so none is a dependency.
"""

import sys
import types

import numpy as np


class Adapter:
    """Host numpy views of a list of parameters, with device transfers around a sync."""

    in_place = True  # False where push() makes new parameters (immutable arrays)
    on_rebind = None  # called by pull() after it replaced some of `arrays` (list kept in place)

    def __init__(self, params, arrays):
        self._params = params
        self.arrays = arrays

    def pull(self, params=None):
        """Bring the parameters' current values into `arrays` (no-op when they share memory).

        `params` replaces the parameters first (immutable frameworks make new ones each step).
        """
        if params is not None:
            self._params = list(params)

    def push(self):
        """Install `arrays` as the parameters' values (no-op when they share memory)."""

    def params(self):
        """The user's parameters (new objects for immutable frameworks)."""
        return self._params

    def device_sync(self, rule, centre, timeout_s):
        """An object that syncs the parameters with `centre` on their device, without
        `arrays` (see `torch_registered`), or None; once one is returned, `pull` and `push`
        copy nothing. Called once, by `share`."""
        return None


class StagedAdapter(Adapter):
    """Device arrays mirrored in page-locked host buffers: one copy each way per sync."""

    def __init__(self, params, staging, download, upload):
        super().__init__(params, staging)
        self._download = download  # download(device_array, host_buffer)
        self._upload = upload      # upload(device_array, host_buffer)

    def pull(self, params=None):
        super().pull(params)
        for host, p in zip(self.arrays, self._params):
            self._download(p, host)

    def push(self):
        for host, p in zip(self.arrays, self._params):
            self._upload(p, host)


def staging_order(i, p, remedy):
    """"C" or "F": the memory order of device array `p` (parameter `i`), for a host staging
    buffer laid out like it (so one flat copy moves it each way, never transposed).

    `p` is anything with numpy-like ``flags`` (CuPy, pycuda and numpy arrays). Raises
    TypeError for an array in neither order, naming `remedy` (how to make it contiguous).
    """
    if p.flags.c_contiguous:
        return "C"
    if p.flags.f_contiguous:
        return "F"
    raise TypeError("parameter %d is not contiguous (strides %s for shape %s); the staging "
                    "copies need contiguous arrays: share %s instead, and train that one"
                    % (i, tuple(p.strides), tuple(p.shape), remedy))


def framework_of(obj):
    """Which adapter module handles `obj`, judged by its type's module, without importing any."""
    module = type(obj).__module__ or ""
    root = module.split(".", 1)[0]
    if root in ("torch",):
        return "torch"
    if root in ("cupy",):
        return "cupy"
    if root in ("jax", "jaxlib"):
        return "jax"
    if root in ("pycuda",):
        return "pycuda"
    if isinstance(obj, np.ndarray):
        return "numpy"
    if "torch" in sys.modules:
        import torch
        if isinstance(obj, torch.nn.Module):
            return "torch"
    return None


def host_arrays(arrays):
    """Writable host numpy arrays for `arrays` (numpy arrays or torch tensors), and a function
    that installs their values back; for collectives (`average_gradients`).

    numpy arrays and CPU tensors are returned as themselves / views (the function does
    nothing); CUDA tensors are copied to host, and back by the function. Raises TypeError
    naming the first array that is neither, or is read-only.
    """
    arrays = list(arrays)
    kinds = {framework_of(a) for a in arrays}
    if kinds <= {"numpy"}:
        for i, a in enumerate(arrays):
            if not a.flags.writeable:
                raise TypeError("array %d is read-only; pass writable arrays" % i)
        return arrays, lambda: None
    if kinds == {"torch"}:
        from . import torch_adapter
        return torch_adapter.host_arrays(arrays)
    for i, a in enumerate(arrays):
        if framework_of(a) not in ("numpy", "torch"):
            raise TypeError("array %d is a %s.%s; pass numpy arrays or torch tensors"
                            % (i, type(a).__module__, type(a).__name__))
    raise TypeError("arrays mix numpy and torch; pass arrays of one framework")


def adapt(params):
    """An Adapter for `params`: a list of arrays of one framework, or a torch nn.Module.

    Raises TypeError naming the first parameter of an unsupported type.
    """
    if framework_of(params) == "torch":  # an nn.Module
        from . import torch_adapter
        named = list(params.named_parameters())
        return torch_adapter.adapt([t for _, t in named], [name for name, _ in named])
    params = list(params)
    if not params:
        raise ValueError("init_shared_params() needs at least one parameter array")
    kinds = [framework_of(p) for p in params]
    for i, kind in enumerate(kinds):
        if kind is None:
            raise TypeError("parameter %d is a %s.%s, which platoon cannot share; pass numpy "
                            "arrays, torch tensors (or an nn.Module), CuPy, pycuda or JAX arrays"
                            % (i, type(params[i]).__module__, type(params[i]).__name__))
    if len(set(kinds)) > 1:
        raise TypeError("parameters mix frameworks (%s); pass arrays of one framework"
                        % ", ".join(sorted(set(kinds))))
    kind = kinds[0]
    if kind == "numpy":
        return Adapter(params, params)
    module: types.ModuleType
    if kind == "torch":
        from . import torch_adapter as module
    elif kind == "cupy":
        from . import cupy_adapter as module
    elif kind == "pycuda":
        from . import pycuda_adapter as module
    else:
        from . import jax_adapter as module
    return module.adapt(params)
