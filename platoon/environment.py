"""Settings the launcher hands to the processes it starts, read in one place.

The launcher sets ``PLATOON_*`` environment variables; `Controller()` and
`Worker()` called without ports use them, so one script runs both under the
launcher and by hand with explicit arguments.
"""

import os
from dataclasses import dataclass
from typing import Optional


def _int(name):
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError("environment variable %s=%r is not an integer" % (name, text)) from None


def _float(name):
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError("environment variable %s=%r is not a number" % (name, text)) from None


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
    checkpoint_every_s: Optional[float] = None
    resume_from: Optional[str] = None
    keys_file: Optional[str] = None

    @classmethod
    def read(cls):
        """The settings in this process's environment."""
        return cls(
            control_port=_int("PLATOON_CONTROL_PORT"),
            data_port=_int("PLATOON_DATA_PORT"),
            job_id=os.environ.get("PLATOON_JOB_ID") or None,
            num_workers=_int("PLATOON_NUM_WORKERS"),
            device=os.environ.get("PLATOON_DEVICE") or None,
            worker_index=_int("PLATOON_WORKER_INDEX"),
            status_file=os.environ.get("PLATOON_STATUS_FILE") or None,
            ready_fd=_int("PLATOON_READY_FD"),
            restarts=_int("PLATOON_RESTARTS"),
            checkpoint_path=os.environ.get("PLATOON_CHECKPOINT_PATH") or None,
            checkpoint_every_s=_float("PLATOON_CHECKPOINT_EVERY_S"),
            resume_from=os.environ.get("PLATOON_RESUME_FROM") or None,
            keys_file=os.environ.get("PLATOON_KEYS_FILE") or None,
        )

    def to_env(self):
        """The environment variables that carry these settings (None fields left out)."""
        names = {"control_port": "PLATOON_CONTROL_PORT", "data_port": "PLATOON_DATA_PORT",
                 "job_id": "PLATOON_JOB_ID",
                 "num_workers": "PLATOON_NUM_WORKERS", "device": "PLATOON_DEVICE",
                 "worker_index": "PLATOON_WORKER_INDEX", "status_file": "PLATOON_STATUS_FILE",
                 "ready_fd": "PLATOON_READY_FD", "restarts": "PLATOON_RESTARTS",
                 "checkpoint_path": "PLATOON_CHECKPOINT_PATH",
                 "checkpoint_every_s": "PLATOON_CHECKPOINT_EVERY_S",
                 "resume_from": "PLATOON_RESUME_FROM", "keys_file": "PLATOON_KEYS_FILE"}
        return {env: str(getattr(self, field)) for field, env in names.items()
                if getattr(self, field) is not None}
