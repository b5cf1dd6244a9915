"""One line makes an Accelerate script a platoon worker, with or without LocalSGD::

    import platoon.integrations.accelerate_auto  # each Accelerator's model: a worker

For scripts that have no ``LocalSGD`` to replace (a plain loop: ``prepare``, ``backward``,
``optimizer.step()``, ``save_state``/``load_state``). The first ``accelerator.prepare(...)``
after which the accelerator holds one model and one optimizer makes the process a worker of
the job, as platoon's `LocalSGD` with ``local_sgd_steps=SYNC_EVERY`` would, but syncing right
after every `SYNC_EVERY`-th real optimizer step (there is no ``local_sgd.step()`` to call);
each ``accelerator.backward`` is a batch for the launcher's count. In a job of several
workers ``save_state(DIR)`` writes worker K's ``DIR/workerK`` and ``load_state(DIR)`` reads
it, or ``DIR`` itself where there is none (a run alone's checkpoint, taken by every worker);
``platoon_state.json`` beside the states keeps the sync phase. Alone the script trains as
without platoon. A script's own platoon ``LocalSGD`` continues the worker. For other
settings (``rule``, ``evaluate``, ...) use `LocalSGD` instead (docs/accelerate.md). Needs
``accelerate`` (the ``accelerate`` extra).
"""

import functools
import json
import os
import re
from typing import Any, Optional

from accelerate import Accelerator

from .accelerate import start_worker

SYNC_EVERY = 4  # real optimizer steps between syncs, as the Trainer's and Lightning's default
STATE_FILE = "platoon_state.json"  # the sync phase, beside save_state's files


def _job(accelerator: Accelerator) -> Any:
    return getattr(accelerator, "_platoon_job", None)


def latest_automatic_checkpoint(accelerator: Accelerator) -> Optional[str]:
    """The folder ``load_state()`` (no directory) reads under automatic checkpoint naming:
    the highest-numbered of the project directory's ``checkpoints``."""
    config = accelerator.project_configuration
    folder = os.path.join(config.project_dir or "", "checkpoints")
    if not config.automatic_checkpoint_naming or not os.path.isdir(folder):
        return None
    names = [n for n in os.listdir(folder) if re.fullmatch(r"checkpoint_\d+", n)]
    return os.path.join(folder, max(names, key=lambda n: int(n.split("_")[1]))) \
        if names else None


def patch_accelerator() -> None:
    """Wrap ``Accelerator.prepare``, ``backward``, ``save_state`` and ``load_state`` (once per
    process)."""
    if getattr(Accelerator.prepare, "platoon_worker", False):
        return
    prepare, backward = Accelerator.prepare, Accelerator.backward
    save_state, load_state = Accelerator.save_state, Accelerator.load_state

    @functools.wraps(prepare)
    def prepare_(self: Accelerator, *args: Any, **kwargs: Any) -> Any:
        result = prepare(self, *args, **kwargs)
        start_worker(self, SYNC_EVERY)
        return result

    @functools.wraps(backward)
    def backward_(self: Accelerator, loss: Any, **kwargs: Any) -> Any:
        result = backward(self, loss, **kwargs)
        job = _job(self)
        if job is not None and job.auto and not job.finished:
            job.sync.count_batches()  # a batch trained: the launcher's minibatches
        return result

    @functools.wraps(save_state)
    def save_state_(self: Accelerator, output_dir: Optional[str] = None, *args: Any,
                    **kwargs: Any) -> Any:
        job = _job(self)
        if job is not None and output_dir is not None:
            output_dir = job.own_path(os.fspath(output_dir))
        location = save_state(self, output_dir, *args, **kwargs)
        if job is not None and location is not None and self.is_main_process:
            with open(os.path.join(location, STATE_FILE), "w") as f:
                json.dump({"platoon_steps": job.sync.steps, "worker": job.directory}, f)
        return location

    @functools.wraps(load_state)
    def load_state_(self: Accelerator, input_dir: Optional[str] = None, *args: Any,
                    **kwargs: Any) -> Any:
        job = _job(self)
        if job is not None and input_dir is not None:
            own = job.own_path(os.fspath(input_dir))
            if os.path.isdir(own):
                input_dir = own
        result = load_state(self, input_dir, *args, **kwargs)
        if job is not None:
            folder = input_dir if input_dir is not None else latest_automatic_checkpoint(self)
            state = {}
            if folder is not None and os.path.exists(os.path.join(folder, STATE_FILE)):
                with open(os.path.join(folder, STATE_FILE)) as f:
                    state = json.load(f)
            if "platoon_steps" in state:
                job.sync.load_state_dict({"platoon_steps": state["platoon_steps"]})
            job.resumed_from(state.get("worker"))
        return result

    prepare_.platoon_worker = True  # type: ignore[attr-defined]
    Accelerator.prepare = prepare_
    Accelerator.backward = backward_
    Accelerator.save_state = save_state_
    Accelerator.load_state = load_state_


patch_accelerator()

__all__ = ["patch_accelerator", "SYNC_EVERY", "STATE_FILE"]
