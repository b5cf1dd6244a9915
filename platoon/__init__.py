"""platoon: data-parallel training of one model by many worker processes.

A `Controller` serves control requests over ZeroMQ and owns the central
parameters in POSIX shared memory; each `Worker` registers its parameters
and periodically syncs them with the centre under a `ParamSyncRule`.

The names below are imported on first use (PEP 562), so the processes that
only supervise others (`platoon.launch`) load neither zmq nor numpy.

Layout, along the process line (docs/architecture.md has the whole map):
`controller` and `_controller/` run in the controller, `worker` and `_worker/` in a
worker; `_centre/` (shared memory) and `_os/` (the standard library only) serve both;
`rules/` the sync rules; `launch/` the launcher app; `adapters/` one module per array
framework; `mpi/` jobs across nodes; `compat/` the original Platoon's names (and their
module paths, `platoon._moved`).
"""

import importlib
from typing import TYPE_CHECKING

from . import _moved

_moved.install()

__version__ = "0.1.0"

__all__ = [
    "Controller", "Worker", "ParamSyncRule", "EASGD", "ASGD", "SyncHandle", "SyncStats",
    "PlatoonError", "ControllerTimeout", "LockTimeout", "ServeTimeout", "MinibatchTimeout",
    "ProtocolError", "RemoteError", "LayoutMismatch", "PortInUse", "WorkerDied",
    "ControllerGone", "SyncTimeout", "CheckpointError", "StopRequested", "UsedAfterFork",
    "WorkerClosed",
    "Downpour", "SGD", "Adam", "average_gradients", "shard", "DiLoCo", "DelayedNesterov",
    "PeriodicSync", "load_centre",
]

if TYPE_CHECKING:  # what users' type checkers see (py.typed); at run time, __getattr__ below
    from ._centre.checkpoint import load_centre
    from ._worker.exchange import SyncHandle, SyncStats
    from .collectives import average_gradients
    from .controller import Controller
    from .errors import (
        CheckpointError,
        ControllerGone,
        ControllerTimeout,
        LayoutMismatch,
        LockTimeout,
        MinibatchTimeout,
        PlatoonError,
        PortInUse,
        ProtocolError,
        RemoteError,
        ServeTimeout,
        StopRequested,
        SyncTimeout,
        UsedAfterFork,
        WorkerClosed,
        WorkerDied,
    )
    from .rules import (
        ASGD,
        EASGD,
        SGD,
        Adam,
        DelayedNesterov,
        DiLoCo,
        Downpour,
        ParamSyncRule,
    )
    from .sharding import shard
    from .torch_sync import PeriodicSync
    from .worker import Worker

# Where each public name lives.
_HOMES = {
    "Controller": "controller", "Worker": "worker",
    "ParamSyncRule": "rules", "EASGD": "rules", "ASGD": "rules",
    "Downpour": "rules", "SGD": "rules", "Adam": "rules",
    "DiLoCo": "rules", "DelayedNesterov": "rules",
    "SyncHandle": "_worker.exchange", "SyncStats": "_worker.exchange",
    "average_gradients": "collectives", "shard": "sharding",
    "PeriodicSync": "torch_sync",  # imports torch, so only when used
    "load_centre": "_centre.checkpoint",
}
_HOMES.update((name, "errors") for name in __all__ if name not in _HOMES)

# Public modules reachable as attributes of the package (as when it imported them eagerly).
_SUBMODULES = frozenset((
    "adapters", "collectives", "compat", "controller", "cuda", "device", "errors", "launch",
    "mpi", "protocol", "rules", "security", "sharding", "torch_sync", "worker"))


def __getattr__(name):
    if name in _HOMES:
        value = getattr(importlib.import_module("." + _HOMES[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    elif __name__ + "." + name in _moved.MOVED:  # an old path: works, but is not listed
        value = importlib.import_module(__name__ + "." + name)
    else:
        raise AttributeError("module 'platoon' has no attribute %r" % name)
    globals()[name] = value
    return value


def __dir__():
    """The public API and the public modules only."""
    return sorted(set(__all__) | _SUBMODULES | {"__version__"})
