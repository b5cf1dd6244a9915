"""The original Platoon's names and call forms, so its scripts run with few or no edits:
`from platoon.channel import Controller, Worker` (and the older Lieutenant, Soldier).

These take the original keyword arguments too; those that belonged to the old launcher
(devices, experiment name, log directory, worker arguments, multi-node) are accepted and
ignored: platoon-launcher does that work now. See README, "Porting from Platoon".
"""

from ..controller import Controller as _Controller
from ..worker import Worker as _Worker

_LAUNCHER_KEYWORDS = ("devices", "experiment_name", "log_directory", "worker_args", "multi",
                      "data_hwm")


class Controller(_Controller):
    """`platoon.Controller`, also taking the original keywords: `workers` is `num_workers`,
    `data_hwm` the minibatch queue; the launcher's own keywords are ignored."""

    def __init__(self, control_port=None, data_port=None, *, workers=None, **kwargs):
        data_hwm = kwargs.get("data_hwm", 10)
        for key in _LAUNCHER_KEYWORDS:
            kwargs.pop(key, None)
        if workers is not None:
            kwargs.setdefault("num_workers", workers)
        super().__init__(control_port, None, **kwargs)
        if data_port is not None:
            self.init_data(data_port, hwm=data_hwm)


class Worker(_Worker):
    """`platoon.Worker`, also taking the original keywords: `port` for `control_port`,
    `socket_timeout` in milliseconds (becomes `timeout_s`); `data_hwm` is accepted and
    ignored."""

    def __init__(self, control_port=None, data_port=None, socket_timeout=None, data_hwm=None,
                 port=None, **kwargs):
        if socket_timeout is not None and "timeout" not in kwargs:
            kwargs.setdefault("timeout_s", socket_timeout / 1000.0)
        super().__init__(port if port is not None else control_port, data_port, **kwargs)


Lieutenant = Controller
Soldier = Worker

__all__ = ["Controller", "Worker", "Lieutenant", "Soldier"]
