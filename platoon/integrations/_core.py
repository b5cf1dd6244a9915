"""What every integration shares: counting a framework's real optimizer steps.

A framework calls its optimizer's ``step`` once per real step (gradient accumulation's
micro-batches call none), and a GradScaler that finds inf or NaN gradients skips the step: a
plain optimizer's ``step`` is then not called, a fused one's (``_step_supports_amp_scaling``,
such as ``AdamW(fused=True)``) is called with the scaler's ``found_inf`` set on it, skips the
update itself, and its post-step hook fires all the same. `StepCounter` counts through that
hook and reads ``found_inf``, so each integration syncs a ``PeriodicSync`` (with no optimizer
of its own) on real steps only. At the first real step of a job of several workers it also
checks the schedule: Adam without a warm-up is outside what platoon's lr advice was measured
with (`warn_without_warmup`).
"""

import logging
from typing import Any, Callable, Optional, Tuple

import torch

from ..errors import PlatoonError

log = logging.getLogger(__name__)
# What docs/choosing-a-rule.md says of Adam without a warm-up (issue 47; the numbers are
# benchmarks/results/advice_2026-11-29.md's).
NO_WARMUP = (
    "platoon: %s takes its first step at its full lr (%g): no warm-up, in a job of %d workers. "
    "Without one, the Trainer race's GPT-2 under AdamW (2 workers) took 2.3x the steps to "
    "its target at lr 1.2e-2, and twice a lr that trained well crossed the edge (1.7x the "
    "steps). Warm up over about 5%% of the steps (TrainingArguments(warmup_ratio=0.05); "
    "transformers.get_linear_schedule_with_warmup), or at least do not double one "
    "process's lr (docs/choosing-a-rule.md)")


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


def first_lr_is_peak(optimizer: torch.optim.Optimizer) -> bool:
    """True when `optimizer`'s step now (called after its first) ran at its peak lr: no
    scheduler, or one that left every group's lr at its ``initial_lr`` (a warm-up starts
    below it; torch's schedulers set it, and step only after the optimizer)."""
    return all(float(group["lr"]) >= float(group.get("initial_lr", group["lr"]))
               for group in optimizer.param_groups)


def warn_without_warmup(optimizer: torch.optim.Optimizer, workers: int) -> bool:
    """Log a warning (`NO_WARMUP`) when `optimizer`, an Adam or AdamW of a job of more than
    one worker, has just taken its first step at its full lr; True when it did."""
    if workers < 2 or not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) \
            or not first_lr_is_peak(optimizer):
        return False
    log.warning(NO_WARMUP, type(optimizer).__name__,
                max(float(group["lr"]) for group in optimizer.param_groups), workers)
    return True


class StepCounter:
    """Calls `on_step()` after each real step of `optimizer` (or of the torch optimizer under
    its wrappers): not after a step a GradScaler skipped. After the first, in a job of
    `workers` > 1, checks its schedule's warm-up (`warn_without_warmup`). `remove()` stops
    it."""

    def __init__(self, optimizer: Any, on_step: Callable[[], Any], workers: int = 1):
        self.optimizer = innermost_optimizer(optimizer)
        self.on_step = on_step
        self._check_warmup = workers > 1
        self.workers = workers
        self._hook: Any = self.optimizer.register_step_post_hook(self._stepped)

    def _stepped(self, optimizer, args, kwargs):
        if not skipped_by_scaler(optimizer):
            if self._check_warmup:
                self._check_warmup = False
                warn_without_warmup(optimizer, self.workers)
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


def job_workers(worker: Any) -> int:
    """How many workers `worker`'s job has (at least 1): its node's, or every node's."""
    return max(worker.num_workers or 1, worker.global_size or 1)


def own_ddp_refused(world: int, who: str, launched_by: str) -> PlatoonError:
    """The error for a framework running its own data parallelism across `world` processes:
    its all-reduce would tie platoon's workers step by step."""
    return PlatoonError(
        "%s runs its own DDP across %d processes (%s): under platoon each worker trains alone "
        "and syncs through the centre. Start the script with platoon-launcher -n N (or "
        "python -m platoon.mpi), not torchrun" % (who, world, launched_by))
