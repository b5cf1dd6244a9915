"""One line makes a Hugging Face Trainer script a platoon worker::

    import platoon.integrations.huggingface_auto  # every Trainer made from here: a worker

Every ``transformers.Trainer`` (and subclass) made after this import gets a
`PlatoonCallback` with its defaults, as ``PlatoonCallback.attach(trainer)`` at the end of
the Trainer's ``__init__`` would give it (a Trainer that already has one keeps it). For
other settings (``sync_every``, ``rule``, ...) attach the callback yourself instead
(docs/huggingface.md).

In a job of several workers (under ``platoon-launcher -n N``, ``python -m platoon.mpi``, an
elastic node) the worker is made, and joins the job, as the script's first
``TrainingArguments`` are made, and those arguments' ``output_dir`` is the worker's own
``output_dir/workerK`` from then on (`own_output_dir`): so a script that looks for its last
checkpoint itself before it makes its Trainer (transformers' run_mlm.py, run_clm.py, ...:
``get_last_checkpoint(training_args.output_dir)``) finds the worker's own and resumes from
it. Run alone, nothing changes before the Trainer. Needs ``transformers`` (the
``huggingface`` extra).
"""

import functools
from typing import Any, Dict, Optional

from transformers import Trainer, TrainingArguments

from .._os.environment import JobEnvironment
from ..worker import Worker
from .huggingface import OWN_DIR_ATTR, PlatoonCallback, own_output_dir

_worker: Optional[Worker] = None  # in a job: made with the first TrainingArguments
_claimed = False  # _worker given to the first Trainer's callback (which closes it)
_made: Dict[str, str] = {}  # each worker's output_dir given here: the script's it is under


def _in_a_job() -> bool:
    """Whether this process was started as a worker of a job (launcher, node runner)."""
    env = JobEnvironment.read("control_port", "ports_fd")
    return env.control_port is not None or env.ports_fd is not None


def give_arguments_the_workers_output_dir() -> None:
    """Make ``TrainingArguments.__post_init__`` end by making this process's worker (the first
    time, in a job of several workers only) and its ``output_dir`` the worker's own."""
    post_init = TrainingArguments.__post_init__
    if getattr(post_init, "platoon_own_dir", False):
        return

    @functools.wraps(post_init)
    def __post_init__(self: TrainingArguments) -> None:
        global _worker
        post_init(self)
        if _worker is None and not _claimed and _in_a_job():
            _worker = Worker()
        own = self.output_dir or ""
        if own in _made:  # arguments made again from a worker's (dataclasses.replace)
            setattr(self, OWN_DIR_ATTR, (_made[own], own))
        elif _worker is not None:
            shared = own_output_dir(self, _worker)
            _made[self.output_dir or ""] = shared
    __post_init__.platoon_own_dir = True  # type: ignore[attr-defined]
    TrainingArguments.__post_init__ = __post_init__  # type: ignore[method-assign]


def attach_to_every_trainer() -> None:
    """Make ``Trainer.__init__`` end by attaching a `PlatoonCallback` (once per process),
    with the worker made with the arguments, if any (it closes it after training)."""
    init = Trainer.__init__
    if getattr(init, "platoon_attaches", False):
        return

    @functools.wraps(init)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:
        global _claimed
        init(self, *args, **kwargs)
        if not any(isinstance(callback, PlatoonCallback)
                   for callback in self.callback_handler.callbacks):
            worker = None if _claimed else _worker  # None: the callback makes one
            _claimed = _claimed or worker is not None
            PlatoonCallback.attach(self, worker=worker, close_worker=True)
    __init__.platoon_attaches = True  # type: ignore[attr-defined]
    Trainer.__init__ = __init__  # type: ignore[method-assign]


give_arguments_the_workers_output_dir()
attach_to_every_trainer()

__all__ = ["attach_to_every_trainer", "give_arguments_the_workers_output_dir"]
