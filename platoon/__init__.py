"""platoon: data-parallel training of one model by many worker processes.

A `Controller` serves control requests over ZeroMQ and owns the central
parameters in POSIX shared memory; each `Worker` registers its parameters
and periodically syncs them with the centre under a `ParamSyncRule`.
"""

from .controller import Controller
from .errors import (CheckpointError, ControllerGone, ControllerTimeout, LayoutMismatch,
                     LockTimeout, MinibatchTimeout, PlatoonError, PortInUse, ProtocolError,
                     RemoteError, ServeTimeout, SyncTimeout, WorkerDied)
from .exchange import SyncHandle, SyncStats
from .rules import ASGD, EASGD, ParamSyncRule
from .collectives import average_gradients
from .downpour import SGD, Adam, Downpour
from .sharding import shard
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Controller", "Worker", "ParamSyncRule", "EASGD", "ASGD", "SyncHandle", "SyncStats",
    "PlatoonError", "ControllerTimeout", "LockTimeout", "ServeTimeout", "MinibatchTimeout",
    "ProtocolError", "RemoteError", "LayoutMismatch", "PortInUse", "WorkerDied",
    "ControllerGone", "SyncTimeout", "CheckpointError",
    "Downpour", "SGD", "Adam", "average_gradients", "shard",
]
