"""Accelerate's ``LocalSGD`` with platoon's rules: `LocalSGD`, a drop-in for
``accelerate.local_sgd.LocalSGD``.

::

    from platoon.integrations.accelerate import LocalSGD   # instead of accelerate.local_sgd's
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in data:
            with accelerator.accumulate(model):
                ...; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
                local_sgd.step()

Each process is a platoon worker (under the launcher, ``python -m platoon.mpi``, or alone a
one-worker job), not a rank of Accelerate's own multi-process mode: instead of a blocking
average of the parameters across a fixed world, the model (its floating-point buffers too)
syncs with the job's centre every `local_sgd_steps` real optimizer steps under a platoon rule
(EASGD, DiLoCo, ...), with no barrier. docs/accelerate.md tells the rest. Imported only by
its users; needs ``accelerate`` (the ``accelerate`` extra).
"""

import os
from typing import Any, Callable, Dict, Optional

try:
    from accelerate import Accelerator
except ImportError as exc:
    raise ImportError("platoon.integrations.accelerate needs Hugging Face Accelerate: "
                      "pip install 'platoon-dp[accelerate]' (in platoon's clone: "
                      "pip install -e '.[accelerate]')") from exc

import torch

from ..rules import ParamSyncRule
from ..torch_sync import PeriodicSync
from ..worker import Worker
from ._core import StepCounter, own_ddp_refused, worker_slot


def own_project_directories(accelerator: Accelerator, directory: str) -> None:
    """Worker `directory` (``workerK``) under the accelerator's project and logging
    directories, where the script set them (once per accelerator: a second LocalSGD on the
    same accelerator leaves them)."""
    config = accelerator.project_configuration
    if getattr(config, "_platoon_worker_directory", None) is not None:
        return
    config._platoon_worker_directory = directory  # noqa: SLF001 (marks it done)
    if config.logging_dir is not None and config.logging_dir != config.project_dir:
        config.logging_dir = os.path.join(config.logging_dir, directory)
    if config.project_dir is not None:
        project = os.path.join(config.project_dir, directory)
        if config.logging_dir == config.project_dir:
            config.logging_dir = project
        config.project_dir = project


class LocalSGD:
    """``accelerate.local_sgd.LocalSGD``'s constructor and `step()`, syncing through platoon.

    Parameters (the first four as Accelerate's):
        accelerator: the ``Accelerator``, after ``accelerator.prepare(model, optimizer, ...)``
            (one optimizer); a single process (``num_processes == 1``).
        model: the prepared model.
        local_sgd_steps: sync every this many real optimizer steps (>= 1).
        enabled: False: no worker and no syncing (`step` only counts), as Accelerate's.
        rule: the sync rule; default as ``PeriodicSync``'s: ``EASGD(0.9 / workers)``, and
            ``ASGD()`` in a job of one worker (the script run alone trains as without
            platoon); ``DiLoCo(...)``, ``EASGD(...)`` or any platoon rule.
        buffers: "sync" (default): floating-point buffers (BatchNorm's statistics) are synced
            with the parameters; "exclude": each worker keeps its own.
        worker: this process's `platoon.Worker`; default one made here and closed on leaving
            the ``with`` block.
        evaluate: ``evaluate(model) -> dict``: on leaving the ``with`` block the job's last
            worker evaluates the final centre with it once (the job's result, also
            `final_result` there).
        report_every_s: progress reports to the launcher's status line at most this often.

    In a job of several workers, worker K saves under its own ``workerK`` of the accelerator's
    project directory (``ProjectConfiguration(project_dir=...)``: ``save_state()`` and
    ``load_state()`` without a directory, with automatic checkpoint naming) and of its logging
    directory. A directory the script names itself it makes each worker's own with
    `worker_path` (``save_state(local_sgd.worker_path(DIR))``).

    `step()` goes where Accelerate's goes (after the optimizer's step, once per batch, also
    inside ``accelerator.accumulate``); what it counts are the optimizer's real steps, through
    the optimizer's post-step hook: a micro-batch of gradient accumulation is none, nor is a
    step the GradScaler skipped. In a job of several workers, worker K reseeds torch with
    ``torch.initial_seed() + K`` (K: its global rank; in an elastic job an offset made from its
    node's name and local rank), so that each draws its own batches (build LocalSGD before
    iterating the data loader). Raises PlatoonError when the accelerator runs several
    processes (torchrun, ``accelerate launch``), ValueError for a bad `local_sgd_steps` or
    for an accelerator that prepared no optimizer or several.
    """

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module, local_sgd_steps: int,
                 enabled: bool = True, *, rule: Optional[ParamSyncRule] = None,
                 buffers: str = "sync", worker: Optional[Worker] = None,
                 evaluate: Optional[Callable[[torch.nn.Module], Dict[str, Any]]] = None,
                 report_every_s: Optional[float] = 1.0):
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) \
                or local_sgd_steps < 1:
            raise ValueError("local_sgd_steps must be an integer >= 1, got %r"
                             % (local_sgd_steps,))
        if accelerator.num_processes > 1:
            raise own_ddp_refused(accelerator.num_processes, "the Accelerator",
                                  "accelerate launch or torchrun")
        self.accelerator, self.model = accelerator, model
        self.local_sgd_steps, self.enabled = local_sgd_steps, bool(enabled)
        self.num_steps = 0  # step() calls, as Accelerate's
        self.worker: Optional[Worker] = None
        self.sync: Optional[PeriodicSync] = None
        self.final_result: Optional[Dict[str, Any]] = None
        self._counter: Optional[StepCounter] = None
        self._pending = 0  # real optimizer steps not yet given to the sync
        self._closed = False
        self._own_worker = False
        self._directory: Optional[str] = None  # workerK in a job of several workers
        if not self.enabled:
            return
        optimizers = list(getattr(accelerator, "_optimizers", []))
        if len(optimizers) != 1:
            raise ValueError("platoon's LocalSGD counts the steps of the one optimizer the "
                             "accelerator prepared; it prepared %d: build LocalSGD after "
                             "accelerator.prepare(model, optimizer, ...), with one optimizer"
                             % len(optimizers))
        self._own_worker = worker is None
        self.worker = Worker() if worker is None else worker
        slot = worker_slot(self.worker)
        if slot is not None:  # each worker shuffles and draws dropout its own way
            torch.manual_seed((torch.initial_seed() + slot[1]) % 2 ** 64)
            own_project_directories(accelerator, slot[0])
            self._directory = slot[0]
        try:
            self.sync = PeriodicSync(self.worker, accelerator.unwrap_model(model), None,
                                     sync_every=local_sgd_steps, rule=rule, buffers=buffers,
                                     report_every_s=report_every_s, evaluate=evaluate)
            self._counter = StepCounter(optimizers[0], self._stepped)
        except BaseException:
            if self._own_worker:
                self.worker.close()
            raise

    def worker_path(self, path: str) -> str:
        """`path` made this worker's own: ``path/workerK`` in a job of several workers (in an
        elastic job ``path/NODE/workerK``), `path` itself alone or disabled. For
        ``accelerator.save_state(local_sgd.worker_path(DIR))`` and its ``load_state``."""
        return path if self._directory is None else os.path.join(path, self._directory)

    def _stepped(self):
        self._pending += 1

    def __enter__(self) -> "LocalSGD":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finish=exc_type is None)

    def step(self) -> None:
        """Count this call; sync with the centre when the real optimizer steps since the
        last call reach a multiple of `local_sgd_steps` (no barrier: the rule's sync)."""
        self.num_steps += 1
        self._give_pending()

    def _give_pending(self):
        while self._pending and self.sync is not None and not self._closed:
            self._pending -= 1
            self.sync.step()

    def state_dict(self) -> Dict[str, Any]:
        """The sync phase (``{"platoon_steps": n}``): ``accelerator.register_for_checkpointing
        (local_sgd)`` saves it with ``save_state`` and ``load_state`` restores it."""
        return {"platoon_steps": 0 if self.sync is None else self.sync.steps,
                "num_steps": self.num_steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.num_steps = int(state.get("num_steps", self.num_steps))
        if self.sync is not None:
            self.sync.load_state_dict({"platoon_steps": state["platoon_steps"]})

    def close(self, finish: bool = True) -> None:
        """Stop counting; with `finish`, give the sync the steps not yet given, finish it and
        take part in the final evaluation; close the worker made here. Idempotent."""
        if self._counter is not None:
            self._counter.remove()
            self._counter = None
        if self._closed:
            return
        if self.sync is not None and finish:
            self._give_pending()
            self.final_result = self.sync.finish()
        self._closed = True
        if self.worker is not None and self._own_worker:
            self.worker.close()


__all__ = ["LocalSGD"]
