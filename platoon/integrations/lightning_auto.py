"""One line makes a Lightning ``Trainer(...)`` script a platoon worker::

    import platoon.integrations.lightning_auto  # every Trainer made from here: a worker

Every ``Trainer`` of ``lightning`` and ``pytorch_lightning`` (whichever are installed) made
after this import, its ``strategy`` not given (or ``"auto"``), gets a `PlatoonStrategy` with
its defaults, as ``Trainer(..., strategy=PlatoonStrategy())`` would. A Trainer given a strategy
keeps it (``strategy=PlatoonStrategy(sync_every=8)`` for other settings; Lightning's DDP is
refused at ``fit`` as always). A LightningCLI script needs no line: ``--trainer.strategy``
(docs/lightning.md). Needs Lightning (the ``lightning`` extra).
"""

import functools
import importlib
from typing import Any

from .lightning import PACKAGES, installed, lightning_module, strategy_class


def strategy_for_every_trainer(package: str) -> None:
    """Make `package`'s ``Trainer.__init__`` take a `PlatoonStrategy` where it is given no
    strategy (once per process and package)."""
    trainer = importlib.import_module(lightning_module(package)).Trainer
    init = trainer.__init__
    if getattr(init, "platoon_strategy", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("strategy", "auto") == "auto":
            kwargs["strategy"] = strategy_class(package)()
        init(self, *args, **kwargs)
    __init__.platoon_strategy = True  # type: ignore[attr-defined]
    trainer.__init__ = __init__


for _package in PACKAGES:
    if installed(_package):
        strategy_for_every_trainer(_package)

__all__ = ["strategy_for_every_trainer"]
