"""Settings the launcher hands to the processes it starts, read in one place.

The launcher sets ``PLATOON_*`` environment variables; `Controller()` and
`Worker()` called without ports use them, so one script runs both under the
launcher and by hand with explicit arguments.
"""

import dataclasses
import os
import typing
from dataclasses import dataclass
from typing import Optional


def _number(name, kind=int):
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError("environment variable %s=%r is not %s" % (
            name, text, "an integer" if kind is int else "a number")) from None


@dataclass(frozen=True)
class JobEnvironment:
    """What the launcher told this process. Fields are None when not launched."""

    control_port: Optional[int] = None
    data_port: Optional[int] = None
    job_id: Optional[str] = None
    num_workers: Optional[int] = None
    device: Optional[str] = None
    worker_index: Optional[int] = None
    status_file: Optional[str] = None
    ready_fd: Optional[int] = None
    restarts: Optional[int] = None
    checkpoint_path: Optional[str] = None
    log_dir_fd: Optional[int] = None  # the log directory, opened by the launcher: the
    # controller writes status_file and checkpoint_path (both in it) relative to it
    checkpoint_every_s: Optional[float] = None
    resume_from: Optional[str] = None
    keys_file: Optional[str] = None
    launcher_pid: Optional[int] = None  # child processes exit if it is gone
    log_level: Optional[str] = None
    host: Optional[str] = None  # the interface a node's controller binds (platoon.mpi)
    mpi_node: Optional[int] = None  # 1: this controller is a rank of python -m platoon.mpi
    mpi_timeout_s: Optional[float] = None  # a node this late to a collective hangs
    assume_gpus: Optional[str] = None  # the launcher takes these GPUs ("0,3") as present

    @classmethod
    def read(cls, *names):
        """The settings in this process's environment (only those `names`, if given: the
        others are then None and their variables are not checked)."""
        values = {}
        for field in dataclasses.fields(cls):
            if names and field.name not in names:
                continue
            kind = typing.get_args(field.type)[0]  # Optional[kind]
            name = _variable(field.name)
            values[field.name] = (os.environ.get(name) or None) if kind is str \
                else _number(name, kind)
        return cls(**values)

    def to_env(self):
        """The environment variables that carry these settings (None fields left out)."""
        return {_variable(field.name): str(getattr(self, field.name))
                for field in dataclasses.fields(self) if getattr(self, field.name) is not None}


def without_job_variables(env, *names):
    """A copy of the environment mapping `env` without the variables of settings `names`
    (every ``PLATOON_*`` variable if none are given)."""
    if names:
        drop = {_variable(name) for name in names}
        return {k: v for k, v in env.items() if k not in drop}
    return {k: v for k, v in env.items() if not k.startswith("PLATOON_")}


def _variable(field_name):
    """The environment variable of a setting: PLATOON_ and its name in capitals."""
    return "PLATOON_" + field_name.upper()
