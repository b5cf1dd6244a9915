"""The elastic rules: EASGD, where the worker and the centre move toward each other, and
ASGD, where the worker pushes its update and takes the centre."""

from typing import Sequence

import numpy as np

from . import kernels
from .base import ParamSyncRule, SyncKernels, all_contiguous, require_float, take_pull


class EASGD(ParamSyncRule):
    """Elastic averaging SGD (Zhang, Choromanska, LeCun 2015).

    With ``d = alpha * (x - c)``: ``x -= d; c += d``. `alpha` in (0, 1] is the
    elastic force; 0.5 moves both halfway. Raises ValueError for other values.

    The centre gets no gradient, so along a direction all p workers share it moves at
    p/(p+1) of one worker's speed, whatever `alpha`: give the workers' optimizer momentum
    (EAMSGD) or use a rule that pushes changes (ASGD, Downpour, DiLoCo); see
    docs/choosing-a-rule.md.
    """

    elementwise = True
    supports_async = True
    concurrent_stripes = True
    sync_kernels = SyncKernels(
        compiled=("easgd_update", "easgd_push", "easgd_push_pull", "add_into"),
        device="elastic_torch:EASGDOnDevice")

    def __init__(self, alpha: float) -> None:
        alpha = float(alpha)
        if not 0.0 < alpha <= 1.0:
            raise ValueError("EASGD alpha must be in (0, 1], got %r; a common choice is "
                             "0.9 / number_of_workers" % alpha)
        self.alpha = alpha

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        require_float(self, local_params)

    def push(self, index: int, start: int, snapshot: np.ndarray, central: np.ndarray) -> None:
        # snapshot <- -d with d = alpha * (x_snap - c); c += d
        alpha = self.alpha
        if kernels.easgd_push(snapshot, central, alpha):
            return
        for s, c, _ in self._blocks(snapshot, central):
            np.subtract(s, c, out=s)
            s *= alpha
            c += s
            np.negative(s, out=s)

    def pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray) -> None:
        if not kernels.add_into(local, snapshot):
            local += snapshot  # x - d, exactly (negation is exact)

    def push_pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray,
                  central: np.ndarray) -> None:
        if not kernels.easgd_push_pull(local, snapshot, central, self.alpha):
            super().push_pull(index, start, local, snapshot, central)

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        alpha = self.alpha
        if kernels.easgd_update(local, central, alpha):
            return
        if not all_contiguous(local, central):
            diff = alpha * (local - central)
            local -= diff
            central += diff
            return
        for x, c, d in self._blocks(local, central):
            np.subtract(x, c, out=d)
            d *= alpha
            x -= d
            c += d

    def __repr__(self) -> str:
        return "EASGD(alpha=%r)" % self.alpha


class ASGD(ParamSyncRule):
    """Asynchronous SGD: the centre receives the worker's change since its last sync,
    then the worker takes the centre (``c += x - x_last; x = c; x_last = c``)."""

    elementwise = True
    supports_async = True
    concurrent_stripes = True
    sync_kernels = SyncKernels(compiled=("asgd_update", "asgd_push", "take_pull"),
                               device="elastic_torch:ASGDOnDevice")

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        require_float(self, local_params)

    def setup(self, local_params: Sequence[np.ndarray]) -> None:
        self._last = [np.array(p, copy=True, order="C") for p in local_params]

    def update_range(self, index: int, start: int, local: np.ndarray,
                     central: np.ndarray) -> None:
        last = self._last[index].reshape(-1)[start:start + local.size]
        if kernels.asgd_update(local, central, last):
            return
        for x, c, x_last, d in self._blocks(local, central, last):
            np.subtract(x, x_last, out=d)
            c += d
            x[...] = c
            x_last[...] = c

    def push(self, index: int, start: int, snapshot: np.ndarray, central: np.ndarray) -> None:
        # c += x_snap - x_last; x_last = c   (snapshot kept for pull)
        last = self._last[index].reshape(-1)[start:start + snapshot.size]
        if kernels.asgd_push(snapshot, central, last):
            return
        for s, c, x_last, d in self._blocks(snapshot, central, last):
            np.subtract(s, x_last, out=d)
            c += d
            x_last[...] = c

    def pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray) -> None:
        take_pull(local, snapshot, self._last[index].reshape(-1)[start:start + local.size])

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        if all_contiguous(local, central):
            self.update_range(index, 0, local.reshape(-1), central.reshape(-1))
            return
        last = self._last[index]
        central += local - last
        local[...] = central
        last[...] = central

    def __repr__(self) -> str:
        return "ASGD()"
