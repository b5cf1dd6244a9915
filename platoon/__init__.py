"""platoon: data-parallel training of one model by many worker processes.

A `Controller` serves control requests over ZeroMQ and owns the central
parameters in POSIX shared memory; each `Worker` registers its parameters
and periodically syncs them with the centre under a `ParamSyncRule`.

The names below are imported on first use (PEP 562), so the processes that
only supervise others (`platoon.launch.child`, `platoon.launch.cli`, `platoon.launch.process`)
load neither zmq nor numpy.
"""

import importlib

__version__ = "0.1.0"

__all__ = [
    "Controller", "Worker", "ParamSyncRule", "EASGD", "ASGD", "SyncHandle", "SyncStats",
    "PlatoonError", "ControllerTimeout", "LockTimeout", "ServeTimeout", "MinibatchTimeout",
    "ProtocolError", "RemoteError", "LayoutMismatch", "PortInUse", "WorkerDied",
    "ControllerGone", "SyncTimeout", "CheckpointError", "StopRequested", "UsedAfterFork",
    "Downpour", "SGD", "Adam", "average_gradients", "shard", "DiLoCo", "DelayedNesterov",
    "PeriodicSync", "load_centre",
]

# Where each public name lives.
_HOMES = {
    "Controller": "controller", "Worker": "worker",
    "ParamSyncRule": "rules", "EASGD": "rules", "ASGD": "rules",
    "SyncHandle": "exchange", "SyncStats": "exchange",
    "average_gradients": "collectives", "shard": "sharding",
    "Downpour": "downpour", "SGD": "downpour", "Adam": "downpour",
    "DiLoCo": "diloco", "DelayedNesterov": "diloco",
    "PeriodicSync": "torch_sync",  # imports torch, so only when used
    "load_centre": "checkpoint",
}
_HOMES.update((name, "errors") for name in __all__ if name not in _HOMES)

# Submodules reachable as attributes of the package (as when it imported them eagerly).
_SUBMODULES = frozenset((
    "adapters", "channel", "checkpoint", "child", "collectives", "controller", "cuda",
    "device", "diloco", "downpour", "environment", "errors", "exchange", "launcher",
    "logthrottle", "mpi", "param_sync", "peers", "process", "protocol", "reaper", "resources",
    "rules", "security", "sharding", "shmem", "stopsignal", "supervision", "torch_sync", "worker"))


def __getattr__(name):
    if name in _HOMES:
        value = getattr(importlib.import_module("." + _HOMES[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError("module 'platoon' has no attribute %r" % name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
