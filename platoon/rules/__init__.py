"""Sync rules: how a worker's parameters and the centre move together.

A rule updates numpy arrays in place and knows nothing of sockets or locks; the
worker calls it while holding the lock of the part of the centre it updates.
`base` holds `ParamSyncRule` and the helpers the rules share; `elastic` EASGD and
ASGD; `downpour` Downpour with its centre optimizers; `diloco` DiLoCo and Delayed
Nesterov; `kernels` the compiled one-pass kernels (`_sync_kernels.c`) and their
numpy fallback.
"""

from .base import BLOCK_ELEMENTS, ParamSyncRule, RuleContext
from .diloco import DelayedNesterov, DiLoCo
from .downpour import SGD, Adam, Downpour
from .elastic import ASGD, EASGD

__all__ = ["ASGD", "BLOCK_ELEMENTS", "EASGD", "SGD", "Adam", "DelayedNesterov", "DiLoCo",
           "Downpour", "ParamSyncRule", "RuleContext"]
