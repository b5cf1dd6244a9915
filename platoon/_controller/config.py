"""A controller's settings: its keyword arguments, checked, with the launcher's defaults."""

import dataclasses
import os
import re
import secrets
from dataclasses import dataclass
from typing import Optional

from .. import protocol
from .._os.checks import MAX_SECONDS, check_count, check_seconds  # noqa: F401 (names of here)
from .._os.environment import JobEnvironment


def check_port(port, name: str) -> int:
    """`port` for the socket `name` ("control", "data"), checked: 0 or None (a free one, as
    0) or 1-65535. Raises ValueError naming the bad value (ZeroMQ would take 70001 as 4465)."""
    if port is None:
        return 0
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError("%s_port must be a tcp port, 1 to 65535, or 0 (or None) for a free "
                         "one; got %r" % (name, port))
    return port


LIVENESS_INTERVAL_S = (0.01, 3600.0)  # shorter spins serve; longer is a dead worker unseen
MIN_REQUEST_BYTES = 1024  # a registration must fit
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # it names /dev/shm segments and files


def default_max_shared_bytes() -> int:
    """Half of the smaller of physical memory and /dev/shm: what one job may hold."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        pass
    try:
        stat = os.statvfs("/dev/shm")
        sizes.append(stat.f_blocks * stat.f_frsize)
    except OSError:
        pass
    return min(sizes) // 2 if sizes else 1 << 34


@dataclass(frozen=True)
class ControllerConfig:
    """The settings of a `Controller` (its keyword arguments but the ports and node link).

    num_workers: if given, `serve` returns only once that many workers have
        registered and all are done, and barriers wait for all of them
        (under the launcher: the number of workers it starts).
    host: interface to bind; 127.0.0.1 unless the job spans machines.
    transport: "tcp", or "ipc" for Unix-domain sockets (one machine only, faster):
        pass port 0, and give workers `control_address` / `data_address`
        instead of ports; the socket files live in a private temporary
        directory removed by `close`.
    job_id: unique id of the job (names its shared memory); random by default.
    max_request_bytes: larger control requests get an error reply (a Worker
        refuses to send them, naming the limit).
    max_shared_bytes: shared memory the job's workers may have the controller
        allocate, centre, shared states, all_reduce buffers and the stop
        signal (8 KiB) together
        (default: half of the smaller of RAM and /dev/shm); a request that
        would exceed it gets an error reply.
    restarts: how many dead workers a replacement is expected for (the
        launcher's --restart); a death within that budget is not an error.
    checkpoint_path: file to snapshot the centre to, atomically, every
        `checkpoint_every_s` seconds (if given) and when `serve` ends. Periodic
        checkpoints are written on a thread of their own while serving goes on;
        one that fails (the lock not free within `checkpoint_lock_timeout_s`, a
        full disk) is logged and retried a period later, never fatal.
    resume_from: a checkpoint (file or directory) to initialise the centre from;
        read and checked here: CheckpointError if it is unreadable, or holds NaN
        or Inf unless `allow_nonfinite`.
    liveness_interval_s: how often local workers' pids are checked.
    replacement_timeout_s: how long to wait for the replacement of a dead
        worker (within `restarts`) before carrying on without it.
    keys_file: CURVE keys (see `platoon.security`): only peers holding the
        job's client key may connect. Binding beyond loopback without them
        logs a warning.
    allow_nonfinite: resume from a checkpoint holding NaN or Inf.
    checkpoint_lock_timeout_s: how long a checkpoint waits for the centre's lock.

    Each setting is checked here, at construction and whenever one is changed (every change
    makes a new config): ValueError naming the setting and what it accepts. Durations are
    finite seconds: liveness_interval_s from 0.01 to 3600, checkpoint_every_s and
    checkpoint_lock_timeout_s more than 0, replacement_timeout_s 0 or more (all at most
    1e9); max_request_bytes at least 1024; max_shared_bytes at least 1 (None: the default);
    num_workers at least 1 and restarts at least 0, integers; job_id 1 to 64 letters,
    digits, '_', '.' or '-' (it names the job's shared memory); transport "tcp" or "ipc".
    """

    num_workers: Optional[int] = None
    host: str = "127.0.0.1"
    job_id: Optional[str] = None
    max_request_bytes: int = protocol.DEFAULT_MAX_REQUEST_BYTES
    max_shared_bytes: Optional[int] = None
    restarts: Optional[int] = None
    checkpoint_path: Optional[str] = None
    checkpoint_every_s: Optional[float] = None
    resume_from: Optional[str] = None
    liveness_interval_s: float = 0.5
    keys_file: Optional[str] = None
    replacement_timeout_s: float = 120.0
    transport: str = "tcp"
    allow_nonfinite: bool = False
    checkpoint_lock_timeout_s: float = 10.0

    def __post_init__(self):
        if self.transport not in ("tcp", "ipc"):
            raise ValueError("transport must be 'tcp' or 'ipc', got %r" % (self.transport,))
        check_count("num_workers", self.num_workers, 1, none="(not known)")
        if self.job_id is not None and not (isinstance(self.job_id, str)
                                            and JOB_ID.fullmatch(self.job_id)):
            raise ValueError("job_id must be 1 to 64 letters, digits, '_', '.' or '-' (it names "
                             "the job's shared memory), or None for a random one; got %r"
                             % (self.job_id,))
        check_count("max_request_bytes", self.max_request_bytes, MIN_REQUEST_BYTES,
                    what=" number of bytes")
        check_count("max_shared_bytes", self.max_shared_bytes, 1, what=" number of bytes",
                    none="for the default")
        check_count("restarts", self.restarts, 0, none="(the launcher's, else 0)")
        check_seconds("checkpoint_every_s", self.checkpoint_every_s,
                      none="for no periodic checkpoints")
        check_seconds("liveness_interval_s", self.liveness_interval_s, *LIVENESS_INTERVAL_S,
                      zero=True)
        check_seconds("replacement_timeout_s", self.replacement_timeout_s, zero=True)
        check_seconds("checkpoint_lock_timeout_s", self.checkpoint_lock_timeout_s)

    def with_environment(self, env: JobEnvironment) -> "ControllerConfig":
        """These settings, those not given taken from the launcher's `env`, then defaults."""
        return dataclasses.replace(
            self,
            num_workers=env.num_workers if self.num_workers is None else self.num_workers,
            job_id=self.job_id or env.job_id or secrets.token_hex(8),
            max_shared_bytes=self.max_shared_bytes or default_max_shared_bytes(),
            restarts=self.restarts if self.restarts is not None else (env.restarts or 0),
            checkpoint_path=self.checkpoint_path or env.checkpoint_path,
            checkpoint_every_s=self.checkpoint_every_s or env.checkpoint_every_s,
            resume_from=self.resume_from or env.resume_from,
            keys_file=self.keys_file or env.keys_file)
