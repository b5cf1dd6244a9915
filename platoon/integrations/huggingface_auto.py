"""One line makes a Hugging Face Trainer script a platoon worker::

    import platoon.integrations.huggingface_auto  # every Trainer made from here: a worker

Every ``transformers.Trainer`` (and subclass) made after this import gets a
`PlatoonCallback` with its defaults, as ``PlatoonCallback.attach(trainer)`` at the end of
the Trainer's ``__init__`` would give it (a Trainer that already has one keeps it). For
other settings (``sync_every``, ``rule``, ...) attach the callback yourself instead
(docs/huggingface.md). Needs ``transformers`` (the ``huggingface`` extra).
"""

import functools
from typing import Any

from transformers import Trainer

from .huggingface import PlatoonCallback


def attach_to_every_trainer() -> None:
    """Make ``Trainer.__init__`` end by attaching a `PlatoonCallback` (once per process)."""
    init = Trainer.__init__
    if getattr(init, "platoon_attaches", False):
        return

    @functools.wraps(init)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not any(isinstance(callback, PlatoonCallback)
                   for callback in self.callback_handler.callbacks):
            PlatoonCallback.attach(self)
    __init__.platoon_attaches = True  # type: ignore[attr-defined]
    Trainer.__init__ = __init__  # type: ignore[method-assign]


attach_to_every_trainer()

__all__ = ["attach_to_every_trainer"]
