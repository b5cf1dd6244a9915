"""Accelerate's ``LocalSGD`` with platoon's rules: `LocalSGD`, a drop-in for
``accelerate.local_sgd.LocalSGD``.

::

    from platoon.integrations.accelerate import LocalSGD   # instead of accelerate.local_sgd's
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for epoch in range(epochs):
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
            for batch in data:
                with accelerator.accumulate(model):
                    ...; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
                    local_sgd.step()

Each process is a platoon worker (under the launcher, ``python -m platoon.mpi``, or alone a
one-worker job), not a rank of Accelerate's own multi-process mode: instead of a blocking
average of the parameters across a fixed world, the model (its floating-point buffers too)
syncs with the job's centre every `local_sgd_steps` real optimizer steps under a platoon rule
(EASGD, DiLoCo, ...), with no barrier. The first ``LocalSGD`` on an accelerator makes the
worker; every later one (a new block per epoch, as Accelerate's examples write) continues it,
and the worker's training ends when the script does (or at `LocalSGD.finish`).
docs/accelerate.md tells the rest. Imported only by its users; needs ``accelerate`` (the
``accelerate`` extra).
"""

import atexit
import logging
import os
import traceback
import zlib
from typing import Any, Callable, Dict, Optional

try:
    from accelerate import Accelerator
    from accelerate.data_loader import SeedableRandomSampler, get_sampler
except ImportError as exc:
    raise ImportError("platoon.integrations.accelerate needs Hugging Face Accelerate: "
                      "pip install 'platoon-dp[accelerate]' (in platoon's clone: "
                      "pip install -e '.[accelerate]')") from exc

import torch

from .._worker.client import uncaught_error
from ..errors import PlatoonError
from ..rules import ParamSyncRule
from ..torch_sync import PeriodicSync
from ..worker import Worker
from ._core import StepCounter, job_workers, own_ddp_refused, worker_slot

log = logging.getLogger(__name__)


def sampler_seed_shift(offset: int) -> int:
    """What worker `offset` (`worker_slot`'s) adds to a sampler's seed: 0 for worker 0, else
    a 32-bit number spread from it (torch's CPU generator reads a seed's low 32 bits, and a
    ``SeedableRandomSampler`` seeds epoch e with seed + e: one worker's epochs must not run
    into another's, as consecutive shifts would)."""
    return 0 if offset == 0 else zlib.crc32(b"platoon sampler %d" % offset)


def own_project_directories(accelerator: Accelerator, directory: str) -> None:
    """Worker `directory` (``workerK``) under the accelerator's project and logging
    directories, where the script set them."""
    config = accelerator.project_configuration
    if config.logging_dir is not None and config.logging_dir != config.project_dir:
        config.logging_dir = os.path.join(config.logging_dir, directory)
    if config.project_dir is not None:
        project = os.path.join(config.project_dir, directory)
        if config.logging_dir == config.project_dir:
            config.logging_dir = project
        config.project_dir = project


def own_sampler_seeds(accelerator: Accelerator, offset: int) -> None:
    """Give each shuffling data loader the accelerator prepared this worker's own order:
    a ``SeedableRandomSampler`` (``DataLoaderConfiguration(use_seedable_sampler=True)``,
    which holds the seed of the moment ``prepare`` ran, or ``data_seed``) and a
    ``RandomSampler`` with a generator of its own get their seed moved (`sampler_seed_shift`); a
    plain ``RandomSampler`` draws from torch's reseeded generator. Once per sampler (marked:
    every block calls this)."""
    shift = sampler_seed_shift(offset)
    for loader in getattr(accelerator, "_dataloaders", []):
        sampler = get_sampler(loader)
        if sampler is None or getattr(sampler, "_platoon_seeded", False):
            continue
        if isinstance(sampler, SeedableRandomSampler):
            sampler.initial_seed = (sampler.initial_seed + shift) % 2 ** 63
        elif isinstance(sampler, torch.utils.data.RandomSampler) \
                and sampler.generator is not None:
            generator = sampler.generator
            generator.manual_seed((generator.initial_seed() + shift) % 2 ** 63)
        else:
            continue
        sampler._platoon_seeded = True  # noqa: SLF001 (the mark)


class _Job:
    """This process's part in the job, kept on the accelerator from the first `LocalSGD` to
    the end of the script: the worker, its `PeriodicSync`, the block counting now."""

    def __init__(self, accelerator, optimizer, model, local_sgd_steps, rule, buffers, worker,
                 evaluate, report_every_s):
        self.own_worker = worker is None
        self.worker = Worker() if worker is None else worker
        self.model = model
        self.final_result: Optional[Dict[str, Any]] = None
        self.finished = False
        self.block: Optional["LocalSGD"] = None  # the block open now: steps count
        self.pending = 0  # real optimizer steps counted, not yet given to the sync
        self.directory: Optional[str] = None  # workerK in a job of several workers
        self.seed_offset = 0
        self.auto = False  # accelerate_auto's worker: syncs in the step hook, no step() calls
        slot = worker_slot(self.worker)
        if slot is not None:  # each worker shuffles and draws dropout its own way
            self.directory, self.seed_offset = slot
            torch.manual_seed((torch.initial_seed() + self.seed_offset) % 2 ** 64)
            own_project_directories(accelerator, self.directory)
        try:
            self.sync = PeriodicSync(self.worker, model, None, sync_every=local_sgd_steps,
                                     rule=rule, buffers=buffers,
                                     report_every_s=report_every_s, evaluate=evaluate)
            self.counter = StepCounter(optimizer, self._stepped, job_workers(self.worker))
        except BaseException:
            if self.own_worker:
                self.worker.close()
            raise
        atexit.register(self._at_exit)

    def _stepped(self):
        if self.block is not None and not self.finished:
            self.pending += 1
            if self.auto:  # no step() to wait for: sync right after the optimizer's step
                self.give_pending()

    def own_path(self, path: str) -> str:
        """`path/workerK` in a job of several workers (`path` if it is already that), else
        `path`."""
        if self.directory is None or os.path.normpath(path).endswith(
                os.sep + os.path.normpath(self.directory)):
            return path
        return os.path.join(path, self.directory)

    def resumed_from(self, saved_by: Optional[str]) -> None:
        """A checkpoint's states were loaded; `saved_by`: the ``workerK`` that saved it (None:
        a run alone, or no platoon state). Another's (a run alone's, say, loaded by every
        worker) restored its RNG states in each worker alike: reseed torch as at the start, so
        that each worker draws its own batches and dropout again."""
        if self.directory is not None and saved_by != self.directory:
            torch.manual_seed((torch.initial_seed() + self.seed_offset) % 2 ** 64)

    def give_pending(self) -> None:
        """Give the sync the real steps counted (it syncs on its multiples)."""
        while self.pending and not self.finished:
            self.pending -= 1
            self.sync.step()

    def continue_with(self, local_sgd_steps: int, model, worker, evaluate) -> None:
        """A later block's settings: its `local_sgd_steps`, and its `evaluate` if given."""
        if self.finished:
            raise PlatoonError("this worker's training ended (LocalSGD.finish() or close()); "
                               "a new LocalSGD cannot continue it: call finish() once, at the "
                               "end of the script, or not at all (the script's end does it)")
        if model is not self.model:
            raise ValueError("platoon's LocalSGD syncs one model per accelerator: this block's "
                             "model is not the one the first LocalSGD shared; pass the same "
                             "prepared model to every LocalSGD")
        if worker is not None and worker is not self.worker:
            raise ValueError("this accelerator's worker was made by its first LocalSGD; a "
                             "later one continues it and takes no other worker")
        self.sync.sync_every = local_sgd_steps
        self.auto = False  # the script counts with step() from here
        if evaluate is not None:
            self.sync.evaluate = evaluate

    def open(self, block: "LocalSGD") -> None:
        """`block` counts from now (the block before it, if not left, gives what it
        counted and stops)."""
        self.give_pending()
        self.block = block

    def leave(self, block: "LocalSGD", give: bool) -> None:
        """`block` stops counting; with `give`, the sync gets what it counted."""
        if self.block is block:
            if give:
                self.give_pending()
            self.pending, self.block = 0, None

    def finish(self) -> Optional[Dict[str, Any]]:
        if self.finished:
            return self.final_result
        self.give_pending()
        self.block, self.finished = None, True
        self.counter.remove()
        atexit.unregister(self._at_exit)
        try:
            self.final_result = self.sync.finish()
        finally:
            if self.own_worker:
                self.worker.close()
        return self.final_result

    def close(self) -> None:
        """End without the final evaluation (after a failure)."""
        self.block, self.finished = None, True
        self.counter.remove()
        atexit.unregister(self._at_exit)
        if self.own_worker:
            self.worker.close()

    def _at_exit(self):
        # The script ended: finish, unless an exception ended it (the worker's farewell then
        # reports that failure to the controller).
        if self.finished or uncaught_error() is not None:
            return
        try:
            self.finish()
        except BaseException as exc:  # no one above us to catch it: say it, tell the controller
            traceback.print_exc()
            if self.own_worker:
                self.worker.close(error="%s: %s" % (type(exc).__name__, exc))


class LocalSGD:
    """``accelerate.local_sgd.LocalSGD``'s constructor and `step()`, syncing through platoon.

    Parameters (the first four as Accelerate's):
        accelerator: the ``Accelerator``, after ``accelerator.prepare(model, optimizer, ...)``
            (one optimizer); a single process (``num_processes == 1``).
        model: the prepared model (the same in every block).
        local_sgd_steps: sync every this many real optimizer steps (>= 1); not read when
            disabled (Accelerate's examples pass None with ``enabled=False``).
        enabled: False: no worker and no syncing (`step` only counts), as Accelerate's.
        rule: the sync rule; default as ``PeriodicSync``'s: ``EASGD(0.9 / workers)``, and
            ``ASGD()`` in a job of one worker (the script run alone trains as without
            platoon); ``DiLoCo(...)``, ``EASGD(...)`` or any platoon rule.
        buffers: "sync" (default): floating-point buffers (BatchNorm's statistics) are synced
            with the parameters; "exclude": each worker keeps its own.
        worker: this process's `platoon.Worker`; default one made here (closed when the
            worker's training ends).
        evaluate: ``evaluate(model) -> dict``: when the worker's training ends, the job's
            last worker evaluates the final centre with it once (the job's result, also
            `final_result` there).
        report_every_s: progress reports to the launcher's status line at most this often.

    The first enabled ``LocalSGD`` on an accelerator makes this process's worker (with
    `rule`, `buffers`, `worker` and `report_every_s`); a later one (a new ``with`` block per
    epoch) continues that worker, its job and its sync phase, with its own
    `local_sgd_steps` (and `evaluate`, if given). Leaving a block gives the sync the steps
    counted and leaves the worker training; the worker's training ends when the script ends
    (its exit, not an uncaught exception: the controller hears of that as a failure) or at
    `finish()`, which gives the final evaluation. Code after a block sees the worker's own
    model, not the centre.

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
    node's name and local rank) and moves the seed of the accelerator's prepared samplers
    (``use_seedable_sampler=True``'s, or one with a generator of its own) by a number made
    from K (`sampler_seed_shift`), so that each draws its own batches (build the first
    LocalSGD before iterating the data loader).
    Raises PlatoonError when the accelerator runs several processes (torchrun,
    ``accelerate launch``) or after `finish`, ValueError for a bad `local_sgd_steps`, for an
    accelerator that prepared no optimizer or several, or for another model than the first
    block's.
    """

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module,
                 local_sgd_steps: Optional[int], enabled: bool = True, *,
                 rule: Optional[ParamSyncRule] = None, buffers: str = "sync",
                 worker: Optional[Worker] = None,
                 evaluate: Optional[Callable[[torch.nn.Module], Dict[str, Any]]] = None,
                 report_every_s: Optional[float] = 1.0):
        self.accelerator, self.model = accelerator, model
        self.local_sgd_steps, self.enabled = local_sgd_steps, bool(enabled)
        self.num_steps = 0  # step() calls in this block, as Accelerate's
        self._job: Optional[_Job] = None
        if not self.enabled:
            return
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) \
                or local_sgd_steps < 1:
            raise ValueError("local_sgd_steps must be an integer >= 1, got %r (to train "
                             "without syncing, pass enabled=False, as Accelerate's examples "
                             "do: enabled=local_sgd_steps is not None)" % (local_sgd_steps,))
        if accelerator.num_processes > 1:
            raise own_ddp_refused(accelerator.num_processes, "the Accelerator",
                                  "accelerate launch or torchrun")
        optimizers = list(getattr(accelerator, "_optimizers", []))
        if len(optimizers) != 1:
            raise ValueError("platoon's LocalSGD counts the steps of the one optimizer the "
                             "accelerator prepared; it prepared %d: build LocalSGD after "
                             "accelerator.prepare(model, optimizer, ...), with one optimizer"
                             % len(optimizers))
        unwrapped = accelerator.unwrap_model(model)
        job = getattr(accelerator, "_platoon_job", None)
        if job is None:
            job = _Job(accelerator, optimizers[0], unwrapped, local_sgd_steps, rule, buffers,
                       worker, evaluate, report_every_s)
            accelerator._platoon_job = job  # noqa: SLF001 (the accelerator carries the worker)
        else:
            job.continue_with(local_sgd_steps, unwrapped, worker, evaluate)
        own_sampler_seeds(accelerator, job.seed_offset)
        self._job = job
        job.open(self)

    @property
    def worker(self) -> Optional[Worker]:
        """This process's `platoon.Worker` (the same in every block); None when disabled."""
        return None if self._job is None else self._job.worker

    @property
    def sync(self) -> Optional[PeriodicSync]:
        """The worker's `PeriodicSync` (the same in every block); None when disabled."""
        return None if self._job is None else self._job.sync

    @property
    def final_result(self) -> Optional[Dict[str, Any]]:
        """The job's result (the final centre evaluated once by `evaluate`), on the worker
        that evaluated it, once its training ended (`finish()`); else None."""
        return None if self._job is None else self._job.final_result

    def worker_path(self, path: str) -> str:
        """`path` made this worker's own: ``path/workerK`` in a job of several workers (in an
        elastic job ``path/NODE/workerK``), `path` itself alone or disabled. For
        ``accelerator.save_state(local_sgd.worker_path(DIR))`` and its ``load_state``."""
        directory = None if self._job is None else self._job.directory
        return path if directory is None else os.path.join(path, directory)

    def __enter__(self) -> "LocalSGD":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._job is not None:  # the worker trains on: the script's end finishes it
            self._job.leave(self, give=exc_type is None)

    def step(self) -> None:
        """Count this call (a batch: the progress reports' minibatches); sync with the centre
        when the real optimizer steps since the last call reach a multiple of
        `local_sgd_steps` (no barrier: the rule's sync)."""
        self.num_steps += 1
        if self._job is not None and self._job.block is self and not self._job.finished:
            self._job.sync.count_batches()  # a batch: the launcher's minibatches
            self._job.give_pending()

    def state_dict(self) -> Dict[str, Any]:
        """The sync phase (``{"platoon_steps": n, "num_steps": m}``) and, in a job of several
        workers, whose it is (``"worker": "workerK"``):
        ``accelerator.register_for_checkpointing(local_sgd)`` saves it with ``save_state``
        and ``load_state`` restores it."""
        state: Dict[str, Any] = {"platoon_steps": 0 if self.sync is None else self.sync.steps,
                                 "num_steps": self.num_steps}
        if self._job is not None and self._job.directory is not None:
            state["worker"] = self._job.directory
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the sync phase; a checkpoint another worker (or a run alone) saved
        reseeds torch after ``load_state`` restored its RNG states (`_Job.resumed_from`)."""
        self.num_steps = int(state.get("num_steps", self.num_steps))
        if self.sync is not None:
            self.sync.load_state_dict({"platoon_steps": state["platoon_steps"]})
        if self._job is not None:
            self._job.resumed_from(state.get("worker"))

    def finish(self) -> Optional[Dict[str, Any]]:
        """End this worker's training in the job now rather than at the script's end: give
        the sync the steps counted, finish it, take part in the final evaluation (returns
        its result on the worker that evaluated, else None), close the worker made here.
        Idempotent; no LocalSGD can continue the worker afterwards."""
        return None if self._job is None else self._job.finish()

    def close(self, finish: bool = True) -> None:
        """End this worker's training: with `finish`, as `finish()`; without, at once, with
        no final evaluation (after a failure). Idempotent."""
        if self._job is None:
            return
        if finish:
            self._job.finish()
        elif not self._job.finished:
            self._job.close()


def start_worker(accelerator: Accelerator, sync_every: int) -> Optional[LocalSGD]:
    """`accelerator`'s worker, syncing every `sync_every` real optimizer steps right after
    the step (no ``step()`` to call), made once the accelerator has prepared one model and
    one optimizer (`accelerate_auto`); None before that, or when a LocalSGD already made
    it. A script's own LocalSGD continues it (and counts with its ``step()`` from then)."""
    if getattr(accelerator, "_platoon_job", None) is not None \
            or len(getattr(accelerator, "_models", [])) != 1 \
            or len(getattr(accelerator, "_optimizers", [])) != 1:
        return None
    block = LocalSGD(accelerator=accelerator, model=accelerator._models[0],  # noqa: SLF001
                     local_sgd_steps=sync_every)
    assert block._job is not None  # noqa: SLF001
    block._job.auto = True  # noqa: SLF001
    return block


__all__ = ["LocalSGD", "start_worker"]
