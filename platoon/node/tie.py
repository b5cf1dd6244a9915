"""What every centre tie shares, whichever group carries its rounds (MPI's fixed world,
`platoon.mpi.tie`; an elastic job's quorums, `platoon.elastic.tie`): its settings
(`CentreTie`, `OUTER_RULES`: declared in `platoon._os.nodesettings`, which the launcher reads
too), DiLoCo's outer step on the anchor, and how long a round waits for the centre's lock."""

import numpy as np

from .._os.nodesettings import OUTER_RULES, CentreTie
from ..rules.diloco import DiLoCo

LOCK_TIMEOUT_S = 60.0  # a worker stopped while holding the centre fails the tie

__all__ = ["CentreTie", "OUTER_RULES", "LOCK_TIMEOUT_S", "outer_step"]


def outer_step(anchor: np.ndarray, velocity: np.ndarray, mean_moved: np.ndarray, lr: float,
               mu: float) -> None:
    """DiLoCo's outer SGD step with Nesterov momentum `mu` and learning rate `lr` on
    `anchor`, in place (`velocity` too): ``u = mu*u + d; anchor += lr * (d + mu*u)``, d the
    nodes' mean move (-gradient). lr 1, momentum 0: the new anchor is the mean. The rule's
    own step (`DiLoCo.synchronous_step`), not a copy of it."""
    DiLoCo(lr, mu).synchronous_step(anchor, velocity, mean_moved)
