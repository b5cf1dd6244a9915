"""A Hugging Face ``Trainer`` as a platoon worker, in two added lines: `PlatoonCallback`.

::

    from platoon.integrations.huggingface import PlatoonCallback
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    PlatoonCallback.attach(trainer)          # this process is a worker of the job
    trainer.train()

The callback syncs the model with the job's centre every `sync_every` real optimizer steps (a
``PeriodicSync`` counting the steps of the Trainer's own optimizer, through its post-step
hook: gradient accumulation's micro-batches are not steps, nor are the steps a GradScaler
skips, also those a fused optimizer is called for and skips itself); evaluates the final
centre once with the Trainer's own ``evaluate()`` as the job's result; and keeps its step
count in the Trainer's checkpoints, in the worker's own ``output_dir/workerK``, so that
``resume_from_checkpoint`` (True, "last", or a checkpoint's path under the script's
``output_dir``) resumes the worker's own weights and sync phase. docs/huggingface.md tells the
rest. Imported only by its users; needs ``transformers`` (the
``huggingface`` extra).
"""

import os
from typing import Any, Dict, Optional, Union

try:
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint
except ImportError as exc:
    raise ImportError("platoon.integrations.huggingface needs Hugging Face Transformers: "
                      "pip install 'platoon-dp[huggingface]' (in platoon's clone: "
                      "pip install -e '.[huggingface]')") from exc

import torch

from ..errors import PlatoonError
from ..rules import ParamSyncRule
from ..torch_sync import PeriodicSync
from ..worker import Worker
from ._core import StepCounter, job_workers, own_ddp_refused, worker_slot

STATE_KEY = "platoon"  # platoon's state in the checkpoint's trainer_state.json
OWN_DIR_ATTR = "_platoon_output_dirs"  # on TrainingArguments: (the script's, the worker's)
LAST = ("last", "true")  # resume_from_checkpoint strings that mean the worker's last checkpoint


def refuse_ddp(args: TrainingArguments) -> None:
    """Raise PlatoonError when the Trainer runs its own data parallelism across processes
    (torchrun, ``accelerate launch``, an MPI rank's environment): its all-reduce would tie
    platoon's workers step by step, each worker's gradient averaged with the others."""
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    world = max(world, int(args.world_size))
    if world > 1:
        raise own_ddp_refused(world, "the Trainer", "torchrun or accelerate launch, or "
                              "RANK/WORLD_SIZE/LOCAL_RANK in the environment")


def own_output_dir(args: TrainingArguments, worker: Worker) -> str:
    """Make `args.output_dir` `worker`'s own, ``output_dir/workerK`` (``output_dir/NODE/workerK``
    in an elastic job; unchanged in a job of one worker), once: arguments already made so
    (by `platoon.integrations.huggingface_auto` as they were made) are left as they are.
    Returns the script's output directory, the one the workers' are under."""
    made = getattr(args, OWN_DIR_ATTR, None)
    if made is not None and args.output_dir == made[1]:
        return str(made[0])
    shared = args.output_dir or "trainer_output"
    slot = worker_slot(worker)
    if slot is not None:
        args.output_dir = os.path.join(shared, slot[0])
        setattr(args, OWN_DIR_ATTR, (shared, args.output_dir))
    return shared


class PlatoonCallback(TrainerCallback):
    """Makes `trainer`'s process a worker of a platoon job; ``PlatoonCallback.attach(trainer)``
    adds one to the Trainer (or pass one to ``trainer.add_callback``).

    Parameters:
        trainer: the ``transformers.Trainer``, before ``train()``.
        sync_every: sync with the centre after every this many real optimizer steps (>= 1).
        rule: the sync rule; default as ``PeriodicSync``'s: ``EASGD(0.9 / workers)`` (with
            AdamW: a warm-up, ``sync_every=2`` and 1.5x one process's lr, twice it only
            for a long schedule; docs/choosing-a-rule.md), ``ASGD()`` in a job of one
            worker (the script run alone trains as without platoon).
        worker: this process's `platoon.Worker`; default one made here (under the launcher
            or ``python -m platoon.mpi`` a worker of the job, alone a one-worker job).
        close_worker: whether to close the worker at the end of training; default (None):
            only one made here.
        evaluate_centre: True: at the end of training, the job's last worker evaluates the
            final centre once with ``trainer.evaluate()`` (when the Trainer has an
            eval_dataset); the launcher's summary shows it as the job's result, and
            `final_result` holds it on that worker. Not in a job of one worker (the script
            run alone, ``-n 1``): its model is the result, and the script's own
            ``evaluate()`` its only evaluation.
        report_every_s: progress reports (steps, the logged loss) to the launcher's status
            line at most this often; None: never.

    In a job of several workers each worker writes its checkpoints under
    ``output_dir/workerK`` (K: its global rank) and seeds torch with ``seed + K``, so that
    workers shuffle the data and draw dropout differently, and the metrics tables it prints
    (``trainer.log_metrics``) are headed as its own, not the job's result; in an elastic job, under
    ``output_dir/NODE/workerK`` (its node's name, its local rank) with a seed offset made from
    both (`_core.worker_slot`). A resume finds the worker's own checkpoint
    (`own_checkpoint`): ``trainer.train(resume_from_checkpoint=...)`` (where scripts such as
    transformers' ``run_clm.py`` pass their ``--resume_from_checkpoint``) with True or
    "last" takes the last one in the worker's own directory, and a checkpoint's path under
    the script's ``output_dir`` (``out/checkpoint-500``) the worker's
    (``out/workerK/checkpoint-500``) when it has one.
    Raises PlatoonError when the Trainer runs its own DDP (`refuse_ddp`), ValueError for a
    bad `sync_every`.
    """

    def __init__(self, trainer: Trainer, *, sync_every: int = 4,
                 rule: Optional[ParamSyncRule] = None, worker: Optional[Worker] = None,
                 close_worker: Optional[bool] = None, evaluate_centre: bool = True,
                 report_every_s: Optional[float] = 1.0):
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError("sync_every must be an integer >= 1, got %r" % (sync_every,))
        refuse_ddp(trainer.args)
        self.trainer = trainer
        self.sync_every, self.rule = sync_every, rule
        self.evaluate_centre, self.report_every_s = evaluate_centre, report_every_s
        self._own_worker = worker is None if close_worker is None else close_worker
        self.worker = Worker() if worker is None else worker
        self.sync: Optional[PeriodicSync] = None  # made at the start of training
        self.final_result: Optional[Dict[str, Any]] = None
        self._counter: Optional[StepCounter] = None
        self._shared_dir = own_output_dir(trainer.args, self.worker)  # the script's
        slot = worker_slot(self.worker)
        if slot is not None:
            directory, offset = slot
            torch.manual_seed((trainer.args.seed + offset) % 2 ** 64)
            log_metrics = trainer.log_metrics

            def labelled(split: str, metrics: Dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                # Each worker prints its own tables (run_clm.py's after training): say whose.
                print("platoon %s: the %s metrics below are this worker's own (its model, its "
                      "training), not the job's result: that is the launcher's final result "
                      "(the final centre, evaluated once)" % (directory, split), flush=True)
                return log_metrics(split, metrics, *args, **kwargs)
            labelled.__doc__ = log_metrics.__doc__
            trainer.log_metrics = labelled
        # The one place the Trainer reads a resume's checkpoint before any callback runs:
        # its train() argument, made this worker's own here.
        train = trainer.train

        def own_train(resume_from_checkpoint: Union[str, bool, None] = None, *args: Any,
                      **kwargs: Any) -> Any:
            if not resume_from_checkpoint:
                self._say_if_not_resumed()
            return train(self.own_checkpoint(resume_from_checkpoint), *args, **kwargs)
        own_train.__doc__ = train.__doc__
        trainer.train = own_train  # type: ignore[method-assign]

    def _say_if_not_resumed(self) -> None:
        # A script that looks for its last checkpoint itself (transformers' run_mlm.py:
        # get_last_checkpoint(output_dir) before the Trainer is made) finds none in the shared
        # output_dir, where the workers' are not, and trains from scratch: say so.
        own_dir = self.trainer.args.output_dir
        if own_dir is None or own_dir == self._shared_dir or not os.path.isdir(own_dir):
            return
        last = get_last_checkpoint(own_dir)
        if last is not None:
            print("platoon %s: training starts from scratch although this worker's %s holds "
                  "%s; a script that looks for its last checkpoint in %s finds none there "
                  "(each worker's are under its own workerK): pass resume_from_checkpoint="
                  "\"last\" (--resume_from_checkpoint last) to resume each worker from its own"
                  % (os.path.relpath(own_dir, self._shared_dir), own_dir, os.path.basename(last),
                     self._shared_dir), flush=True)

    def own_checkpoint(self, checkpoint: Union[str, bool, None]) -> Union[str, bool, None]:
        """A ``resume_from_checkpoint`` made this worker's: True or "last" (any case; "true"
        too) are True, the Trainer's last checkpoint in ``args.output_dir`` (the worker's own
        ``workerK``); a path under the script's ``output_dir`` that is not already the
        worker's (``out/checkpoint-500``) is the worker's (``out/workerK/checkpoint-500``)
        when that exists, or when the given one does not (the Trainer's error then names
        the worker's); anything else as it is."""
        if isinstance(checkpoint, str) and checkpoint.strip().lower() in LAST \
                and not os.path.exists(checkpoint):
            return True
        own_dir = self.trainer.args.output_dir or self._shared_dir
        if not isinstance(checkpoint, (str, os.PathLike)) or own_dir == self._shared_dir:
            return checkpoint
        path = os.path.abspath(os.fspath(checkpoint))
        shared, own = os.path.abspath(self._shared_dir), os.path.abspath(own_dir)
        if os.path.commonpath([path, shared]) != shared or path == shared \
                or os.path.commonpath([path, own]) == own:
            return checkpoint
        mine = os.path.join(own_dir, os.path.relpath(path, shared))
        return mine if os.path.exists(mine) or not os.path.exists(path) else checkpoint

    @classmethod
    def attach(cls, trainer: Trainer, **options: Any) -> "PlatoonCallback":
        """A `PlatoonCallback` (`options` as its parameters), added to `trainer`'s callbacks."""
        callback = cls(trainer, **options)
        trainer.add_callback(callback)
        return callback

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        """Share the model (loaded from the checkpoint, when resuming) and count the steps of
        the Trainer's optimizer."""
        if self.sync is not None:
            raise PlatoonError("a PlatoonCallback serves one trainer.train(): its worker was "
                               "closed at the end of the first; attach a new one")
        alone = self.worker.num_workers == 1 and self.worker.global_size == 1
        evaluate = self._evaluate if self.evaluate_centre and not alone and \
            self.trainer.eval_dataset is not None else None
        self.sync = PeriodicSync(self.worker, model, None, sync_every=self.sync_every,
                                 rule=self.rule, report_every_s=self.report_every_s,
                                 evaluate=evaluate)
        saved = (state.stateful_callbacks or {}).get(STATE_KEY)
        if saved:  # resume_from_checkpoint: the sync phase goes on
            self.sync.load_state_dict(saved)
        self._counter = StepCounter(optimizer, self.sync.step,  # real optimizer steps
                                    job_workers(self.worker))
        self._keep_state(state)

    def _keep_state(self, state):
        # Read when the Trainer saves a checkpoint (trainer_state.json), as its own callbacks'.
        if self.sync is not None:
            if not isinstance(state.stateful_callbacks, dict):
                state.stateful_callbacks = {}
            state.stateful_callbacks[STATE_KEY] = self.sync.state_dict()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.sync is not None:  # a step's last batch: the launcher counts batches
            self.sync.count_batches()

    def on_substep_end(self, args, state, control, **kwargs):
        if self.sync is not None:  # a batch of gradient accumulation before the step's last
            self.sync.count_batches()

    def on_step_end(self, args, state, control, **kwargs):
        self._keep_state(state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._keep_state(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.sync is not None and logs and "loss" in logs:
            self.sync.report_loss(logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        """Finish the last sync, take part in the final evaluation, close the worker."""
        if self._counter is not None:
            self._counter.remove()
            self._counter = None
        if self.sync is not None:
            self.final_result = self.sync.finish()  # the worker logs the result
        if self._own_worker:
            self.worker.close()

    def _evaluate(self, model):
        return self.trainer.evaluate()  # the model holds the centre (PeriodicSync.finish)


__all__ = ["PlatoonCallback", "own_output_dir", "refuse_ddp", "STATE_KEY"]
