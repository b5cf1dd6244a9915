"""A worker's controller ports where its node runner started it before the controller served
(``python -m platoon.elastic.node``, ``python -m platoon.mpi``: `platoon.node.runner.Workers`):
the ports held for the controller are in its environment from the start (for a script that
reads them itself); `Worker()` waits for those the controller announces, which come on the
pipe ``PLATOON_PORTS_FD`` names, so it connects only once the controller serves."""

import os
from typing import Optional

from .._os.environment import JobEnvironment
from .._os.process import read_announcement
from ..errors import ControllerGone, ControllerTimeout

_PORTS_FD = next(iter(JobEnvironment(ports_fd=0).to_env()))  # PLATOON_PORTS_FD
_VARIABLES = {"control_port": next(iter(JobEnvironment(control_port=0).to_env())),
              "data_port": next(iter(JobEnvironment(data_port=0).to_env()))}


def await_ports(timeout_s: Optional[float]) -> JobEnvironment:
    """This worker's settings, its controller's ports among them: where its node runner
    started it before its controller served (``PLATOON_PORTS_FD``), wait (at most `timeout_s`
    seconds; None: forever) for the ports the runner hands over on that pipe; they become
    ``PLATOON_CONTROL_PORT`` and ``PLATOON_DATA_PORT`` of this process (and of its children)
    and the pipe is closed. Raises ControllerTimeout when none came in time, ControllerGone
    when the runner closed the pipe first (its controller never served)."""
    env = JobEnvironment.read()
    if env.ports_fd is None:
        return env
    try:
        ready = read_announcement(env.ports_fd, timeout_s)
        closed = ready is None and _closed(env.ports_fd)
    finally:
        os.close(env.ports_fd)
        os.environ.pop(_PORTS_FD, None)
    if ready is None:
        if closed:
            raise ControllerGone("the node runner that started this worker closed its pipe "
                                 "before its controller served (the controller failed to "
                                 "start: see the node's log)")
        raise ControllerTimeout("this worker's node runner gave no controller ports within "
                                "%s s (its controller is slow to start: give the worker a "
                                "longer timeout_s)" % timeout_s)
    for name in ("control_port", "data_port"):  # none: the controller opened no such port
        os.environ.pop(_VARIABLES[name], None)
    os.environ.update(JobEnvironment(control_port=ready.get("control_port"),
                                     data_port=ready.get("data_port")).to_env())
    return JobEnvironment.read()


def _closed(fd: int) -> bool:
    """Whether the pipe `fd`'s writer is gone (a read now gives end of file)."""
    import select
    if not select.select([fd], [], [], 0)[0]:
        return False
    return os.read(fd, 1) == b""
