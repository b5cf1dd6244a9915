"""EASGD's and ASGD's kernels on CUDA float32 tensors (`SyncKernels.device` of
`platoon.rules.elastic`), run by the registered centre (`platoon.adapters.torch_registered`)
on the parameters and a stripe of the centre copied to the GPU.

Arithmetic: the float32 operations of the host kernels (rules/_sync_kernels.c, compiled
without FMA contraction), in the same order, each a separate elementwise kernel (one
rounding each; alpha rounded to float32 once, as the kernels do); neither side flushes
denormals to zero. IEEE float32 add, subtract, multiply and negate are correctly rounded on
both, so results are bit-identical to the host path. Each method works on elements ``a:b``
of parameter `i`: `x` the parameter's, `s` the snapshot's, `c` the centre's (all 1-D).
"""

from typing import List, Optional

import torch


class EASGDOnDevice:
    """EASGD (`platoon.rules.elastic.EASGD`): ``d = alpha*(x - c); x -= d; c += d``."""

    def __init__(self, rule) -> None:
        self.alpha = rule.alpha

    def prepare(self, device: torch.device) -> None:
        """Nothing to move: EASGD keeps no per-worker state."""

    def update(self, i: int, a: int, b: int, x: torch.Tensor, c: torch.Tensor) -> None:
        d = torch.sub(x, c).mul_(self.alpha)  # d = (x - c) * alpha; x = x - d; c = c + d
        x.sub_(d)
        c.add_(d)

    def push(self, i: int, a: int, b: int, s: torch.Tensor, c: torch.Tensor) -> None:
        d = torch.sub(s, c).mul_(self.alpha)  # d = (s - c) * alpha; c = c + d; s = -d
        c.add_(d)
        torch.neg(d, out=s)

    def pull(self, i: int, a: int, b: int, x: torch.Tensor, s: torch.Tensor) -> None:
        x.add_(s)  # x = x + s (s = -d)


class ASGDOnDevice:
    """ASGD (`platoon.rules.elastic.ASGD`): ``c += x - last; x = last = c``. The rule's
    ``x_last`` moves to the GPU at the first call (copied from its host arrays) and lives
    there from then on."""

    def __init__(self, rule) -> None:
        self.rule = rule
        self._last: Optional[List[torch.Tensor]] = None

    def prepare(self, device: torch.device) -> None:
        """Move ``x_last`` to `device` (the first time), on the calling thread's stream."""
        if self._last is None:
            self._last = [torch.from_numpy(last.reshape(-1)).to(device)
                          for last in self.rule._last]  # noqa: SLF001 (its state moves here)

    def _last_of(self, i: int, a: int, b: int) -> torch.Tensor:
        assert self._last is not None, "prepare() first"
        return self._last[i][a:b]

    def update(self, i: int, a: int, b: int, x: torch.Tensor, c: torch.Tensor) -> None:
        x_last = self._last_of(i, a, b)  # v = c + (x - last); c = x = last = v
        c.add_(torch.sub(x, x_last))
        x.copy_(c)
        x_last.copy_(c)

    def push(self, i: int, a: int, b: int, s: torch.Tensor, c: torch.Tensor) -> None:
        x_last = self._last_of(i, a, b)  # v = c + (s - last); c = last = v
        c.add_(torch.sub(s, x_last))
        x_last.copy_(c)

    def pull(self, i: int, a: int, b: int, x: torch.Tensor, s: torch.Tensor) -> None:
        x.sub_(s).add_(self._last_of(i, a, b))  # x = (x - s) + last
