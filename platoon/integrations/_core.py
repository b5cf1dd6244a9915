"""What every integration shares: counting a framework's real optimizer steps.

A framework calls its optimizer's ``step`` once per real step (gradient accumulation's
micro-batches call none), and a GradScaler that finds inf or NaN gradients skips the step: a
plain optimizer's ``step`` is then not called, a fused one's (``_step_supports_amp_scaling``,
such as ``AdamW(fused=True)``) is called with the scaler's ``found_inf`` set on it, skips the
update itself, and its post-step hook fires all the same. `StepCounter` counts through that
hook and reads ``found_inf``, so each integration syncs a ``PeriodicSync`` (with no optimizer
of its own) on real steps only.
"""

from typing import Any, Callable, Optional, Tuple

import torch

from ..errors import PlatoonError


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under the frameworks' wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer); TypeError when there is none."""
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError("platoon counts the steps of a torch.optim.Optimizer; got %r"
                        % (optimizer,))
    return inner


def skipped_by_scaler(optimizer: torch.optim.Optimizer) -> bool:
    """True when a GradScaler called this (fused) optimizer's step with inf or NaN gradients
    found, so that the step updated nothing."""
    found_inf = getattr(optimizer, "found_inf", None)
    return found_inf is not None and float(found_inf) > 0


class StepCounter:
    """Calls `on_step()` after each real step of `optimizer` (or of the torch optimizer under
    its wrappers): not after a step a GradScaler skipped. `remove()` stops it."""

    def __init__(self, optimizer: Any, on_step: Callable[[], Any]):
        self.optimizer = innermost_optimizer(optimizer)
        self.on_step = on_step
        self._hook: Any = self.optimizer.register_step_post_hook(self._stepped)

    def _stepped(self, optimizer, args, kwargs):
        if not skipped_by_scaler(optimizer):
            self.on_step()

    def remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def worker_slot(worker: Any) -> Optional[Tuple[str, int]]:
    """What makes `worker` (a `platoon.Worker`) one of its job's workers for its files and its
    seed: (a directory name under the output directory, an offset to the seed), distinct for
    each worker of the job; None in a job of one worker (it keeps both as they are). Its
    placement's (`platoon.placement.Placement.files_and_seed`): ``workerK`` and K, its global
    rank, in a fixed world; ``NODE/workerK`` and a number made from it in an elastic job (a
    global rank there may be its node's own)."""
    return worker.placement.files_and_seed()


def own_ddp_refused(world: int, who: str, launched_by: str) -> PlatoonError:
    """The error for a framework running its own data parallelism across `world` processes:
    its all-reduce would tie platoon's workers step by step."""
    return PlatoonError(
        "%s runs its own DDP across %d processes (%s): under platoon each worker trains alone "
        "and syncs through the centre. Start the script with platoon-launcher -n N (or "
        "python -m platoon.mpi), not torchrun" % (who, world, launched_by))
