"""Sync rules: how a worker's parameters and the centre move together.

A rule updates numpy arrays in place and knows nothing of sockets or locks; the
worker calls it while holding the lock of the part of the centre it updates.
`base` holds `ParamSyncRule` and the helpers the rules share; `elastic` EASGD and
ASGD; `downpour` Downpour with its centre optimizers; `diloco` DiLoCo and Delayed
Nesterov; `kernels` the compiled one-pass kernels (`_sync_kernels.c`) and their
numpy fallback.
"""

import importlib
from typing import TYPE_CHECKING

from .base import BLOCK_ELEMENTS, ParamSyncRule, RuleContext
from .elastic import ASGD, EASGD

if TYPE_CHECKING:  # what type checkers see of the names loaded on first use
    from .diloco import DelayedNesterov, DiLoCo
    from .downpour import SGD, Adam, Downpour

__all__ = ["ASGD", "BLOCK_ELEMENTS", "EASGD", "SGD", "Adam", "DelayedNesterov", "DiLoCo",
           "Downpour", "ParamSyncRule", "RuleContext"]

# Loaded on first use (PEP 562): a worker loads the rule it syncs by, not every rule.
_HOMES = {"SGD": "downpour", "Adam": "downpour", "Downpour": "downpour",
          "DelayedNesterov": "diloco", "DiLoCo": "diloco"}


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(importlib.import_module("." + _HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
