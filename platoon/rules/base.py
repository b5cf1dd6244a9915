"""The base of the sync rules (`ParamSyncRule`) and the helpers the built-in rules share.

A rule updates numpy arrays in place and knows nothing of sockets or locks; the
worker calls it while holding the lock of the part of the centre it updates.
Built-in rules run a compiled one-pass kernel (`platoon.rules.kernels`) on
C-contiguous float32 and float64 arrays: it reads and writes each element of
the local and central parameters once, and gives bit-for-bit the result of the
plain numpy formula. Other arrays, or an install without the compiled kernels,
take that formula in numpy, walked in cache-sized blocks with one preallocated
scratch buffer (several passes over each block, no temporaries).
"""

import importlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from . import kernels


class RuleContext(Protocol):
    """What a rule may ask of the worker it syncs for, in `attach`: a `Worker` is one; a
    test can pass any object with these three (and `stripes`, see `stripes_of`)."""

    @property
    def num_workers(self) -> Optional[int]:
        """Workers of the job (of this node in a multi-node job), None if not known."""

    @property
    def shared_params(self) -> Optional[List[np.ndarray]]:
        """The centre's arrays (set before `attach` is called)."""

    def shared_state(self, name: str, layout: list) -> List[np.ndarray]:
        """Arrays of `layout` in shared memory, named `name`, shared by the job's workers
        (zeros when first made)."""

    # Also, where the worker syncs stripe by stripe (a `Worker` does):
    #   stripes: List[List[Tuple[int, int, int]]], how its exchange cuts the centre: for each
    #   stripe, (param_index, start, stop) ranges of flat element indices (see `stripes_of`).


def stripes_of(worker: RuleContext, layout: list) -> List[List[Tuple[int, int, int]]]:
    """The stripes `worker` cuts the centre into (its `stripes`), so that a rule's per-stripe
    state matches the exchange's cut; a context without them (a rule outside a job) has the
    whole of every parameter of `layout` in one stripe."""
    stripes = getattr(worker, "stripes", None)
    if stripes is not None:
        return stripes
    sizes = [int(np.prod(e["shape"], dtype=np.int64)) for e in layout]
    return [[(i, 0, n) for i, n in enumerate(sizes) if n]]


BLOCK_ELEMENTS = 1 << 16  # 256 KiB of float32: stays in L2 while a block is updated

_CAPABILITIES = ("elementwise", "supports_async", "concurrent_stripes")
_MATHS = ("update", "update_range", "push", "pull", "push_pull")


@dataclass(frozen=True)
class SyncKernels:
    """The kernels a rule's maths runs on besides its numpy formula, declared once by the rule
    (its class attribute `sync_kernels`); adapters ask the rule (`ParamSyncRule.device_kernels`)
    rather than testing its type.

    - `compiled`: the functions of `platoon.rules.kernels` (the compiled one-pass kernels of
      `_sync_kernels.c`) that the rule's methods call, each falling back to numpy.
    - `device`: ``"module:Class"`` in `platoon.rules` of its kernels on framework tensors on a
      GPU (`platoon.rules.elastic_torch` holds EASGD's and ASGD's), loaded on first use, or
      None. The class is built with the rule and offers ``prepare(device)`` (its state to
      the device, before a sync's stripes), ``update(i, a, b, x, c)``, ``push(i, a, b, s, c)``
      and ``pull(i, a, b, x, s)`` on elements ``a:b`` of parameter `i`, bit-identical to the
      rule's own methods.

    They implement the declaring class's maths methods (update, update_range, push, pull,
    push_pull): a subclass that overrides one of them runs its own code, never the device
    kernels declared here (see `ParamSyncRule.device_kernels`).
    """

    compiled: Tuple[str, ...] = ()
    device: Optional[str] = None


class ParamSyncRule:
    """Base class of sync rules. Subclass it and override `update` (and `setup` for state).

    One instance belongs to one worker; `Worker.init_shared_params` calls
    `check` before sharing, `attach` once the centre is shared, `setup` once the
    worker's parameters equal the centre, then every `sync_params` calls
    `update_params` under the centre's lock.

    A rule declares what it can do with class attributes, checked when the
    subclass is defined (a TypeError names what is missing):

    - ``elementwise = True``: the update of each element depends only on that
      element (and per-element state); the worker may call `update_range` on
      flat, contiguous slices of each parameter, one stripe of the centre at a
      time, with `start` so per-element state can be sliced alike.
    - ``supports_async = True``: `push` and `pull` split an update so that
      `Worker.start_sync` can run it in the background; needs `elementwise`.
    - ``concurrent_stripes = True``: `push` (and `pull`) may run for different
      stripes in two threads at once (the worker's and the sync's), which
      `SyncHandle.wait` then does to finish sooner. Leave it False when they
      share mutable scratch beyond `_blocks`' (which is per thread).
    """

    elementwise: bool = False
    supports_async: bool = False
    concurrent_stripes: bool = False
    sync_kernels: ClassVar[SyncKernels] = SyncKernels()  # none: numpy (or the rule's own code)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = vars(cls).get("sync_kernels")
        if declared is not None:
            if not isinstance(declared, SyncKernels):
                raise TypeError("%s.sync_kernels must be a platoon.rules.base.SyncKernels, got %r"
                                % (cls.__name__, declared))
            unknown = [name for name in declared.compiled if name not in kernels.NAMES]
            if unknown:
                raise TypeError("%s.sync_kernels names compiled kernels that platoon.rules."
                                "kernels does not have: %s (it has %s)"
                                % (cls.__name__, ", ".join(unknown), ", ".join(kernels.NAMES)))
            if declared.device is not None and declared.device.count(":") != 1:
                raise TypeError("%s.sync_kernels.device must be 'module:Class' (a module of "
                                "platoon.rules), got %r" % (cls.__name__, declared.device))
        for name in _CAPABILITIES:
            if not isinstance(getattr(cls, name), bool):
                raise TypeError("%s.%s must be True or False, got %r"
                                % (cls.__name__, name, getattr(cls, name)))
        if cls.supports_async:
            missing = [m for m in ("push", "pull")
                       if getattr(cls, m) is getattr(ParamSyncRule, m)]
            if missing:
                raise TypeError("%s declares supports_async = True but does not implement %s; "
                                "implement push() and pull(), or leave supports_async False"
                                % (cls.__name__, " and ".join(m + "()" for m in missing)))
            if not cls.elementwise:
                raise TypeError("%s declares supports_async = True, which needs elementwise = "
                                "True (start_sync pushes one stripe of the centre at a time)"
                                % cls.__name__)
        if cls.elementwise and cls.update is ParamSyncRule.update \
                and cls.update_range is ParamSyncRule.update_range:
            raise TypeError("%s declares elementwise = True but implements neither update() nor "
                            "update_range()" % cls.__name__)
        if cls.bind_worker is not ParamSyncRule.bind_worker \
                and cls.attach is ParamSyncRule.attach:
            warnings.warn("%s.bind_worker() is deprecated: rename it attach(worker)"
                          % cls.__name__, DeprecationWarning, stacklevel=2)
            cls.attach = cls.bind_worker  # type: ignore[method-assign]  # the old name's body

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        """Raise TypeError or ValueError if this rule cannot sync these arrays."""

    def device_kernels(self) -> Any:
        """This rule's kernels on GPU tensors (see `SyncKernels.device`), built for it, or
        None: it declares none, or its class overrides a maths method of the class that
        declared them (the subclass's own code must run, so it syncs through host memory).
        Raises ImportError where the framework the kernels use is not installed."""
        cls = type(self)
        declarer = next(c for c in cls.__mro__ if "sync_kernels" in vars(c))
        device = vars(declarer)["sync_kernels"].device
        if device is None or any(getattr(cls, name) is not getattr(declarer, name)
                                 for name in _MATHS):
            return None
        module, name = device.split(":")
        return getattr(importlib.import_module("." + module, __package__), name)(self)

    def attach(self, worker: RuleContext) -> None:
        """Acquire what the rule shares with other workers through `worker` (a Worker, or
        any `RuleContext`), such as `worker.shared_state(...)`; called by
        `Worker.init_shared_params`."""

    def bind_worker(self, worker: RuleContext) -> None:
        """Deprecated name of `attach`."""
        warnings.warn("ParamSyncRule.bind_worker() is deprecated: call attach()",
                      DeprecationWarning, stacklevel=2)
        self.attach(worker)

    def setup(self, local_params: Sequence[np.ndarray]) -> None:
        """Prepare per-worker state; `local_params` already equal the centre."""

    def update_params(self, local_params: Sequence[np.ndarray],
                      central_params: Sequence[np.ndarray]) -> None:
        """Apply the rule to every (local, central) pair of arrays, in place."""
        for index, (local, central) in enumerate(zip(local_params, central_params)):
            self.update(index, local, central)

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        """Update parameter number `index`: `local` and `central` are same-shaped arrays."""
        raise NotImplementedError("%s must implement update(index, local, central)"
                                  % type(self).__name__)

    def update_range(self, index: int, start: int, local: np.ndarray,
                     central: np.ndarray) -> None:
        """Update elements ``start:start+len(local)`` of parameter `index` (1-D slices);
        called only on elementwise rules."""
        self.update(index, local, central)

    def push(self, index: int, start: int, snapshot: np.ndarray, central: np.ndarray) -> None:
        """Background half of an asynchronous sync, run under the stripe's lock.

        `snapshot` is a copy of the worker's elements when the sync started;
        update `central` in place, and leave in `snapshot` what `pull` needs.
        """
        raise NotImplementedError("%s does not support start_sync(); implement push() and "
                                  "pull(), or call sync_params()" % type(self).__name__)

    def pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray) -> None:
        """Caller half of an asynchronous sync: apply the pushed result to `local` in place.

        `local` may have moved since the snapshot; keep that movement.
        """
        raise NotImplementedError("%s does not support start_sync(); implement push() and "
                                  "pull(), or call sync_params()" % type(self).__name__)

    def push_pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray,
                  central: np.ndarray) -> None:
        """`push` then `pull` of one range (`SyncHandle.wait` uses it for the stripes it
        pushes itself); override with a one-pass version. Leaves `snapshot` unspecified."""
        self.push(index, start, snapshot, central)
        self.pull(index, start, local, snapshot)

    # -- helpers for the block-wise numpy path (when platoon.rules.kernels cannot run) --

    def _scratch(self, dtype: np.dtype) -> np.ndarray:
        cache = self.__dict__.setdefault("_scratch_buffers", {})
        key = (dtype, threading.get_ident())  # one per thread: pushes may run in two at once
        buf = cache.get(key)
        if buf is None:
            buf = cache[key] = np.empty(BLOCK_ELEMENTS, dtype)
        return buf

    def _blocks(self, *arrays: np.ndarray) -> Iterator[List[np.ndarray]]:
        """Yield aligned 1-D blocks of same-shaped C-contiguous arrays plus a scratch block."""
        flats = [a.reshape(-1) for a in arrays]
        scratch = self._scratch(arrays[0].dtype)
        n = flats[0].size
        for start in range(0, n, BLOCK_ELEMENTS):
            stop = min(start + BLOCK_ELEMENTS, n)
            yield [f[start:stop] for f in flats] + [scratch[:stop - start]]


def require_float(rule: object, params: Sequence[np.ndarray]) -> None:
    """Raise TypeError, naming `rule` and the parameter, unless every array is floating-point."""
    for i, p in enumerate(params):
        if p.dtype.kind not in "fc":
            raise TypeError("%s needs floating-point parameters, but parameter %d is %s"
                            % (type(rule).__name__, i, p.dtype))


def all_contiguous(*arrays: np.ndarray) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def take_pull(local: np.ndarray, snapshot: np.ndarray, last: np.ndarray) -> None:
    """The pull of rules whose worker takes the centre (ASGD, Downpour):
    ``x = c_new + (x - x_snap)``, exactly c_new when x did not move; `last` holds c_new."""
    if not kernels.take_pull(local, snapshot, last):
        local -= snapshot
        local += last
