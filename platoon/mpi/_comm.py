"""MPI plumbing shared by the node link and the centre tie: import, patient waits, abort."""

import sys
import threading
import time
from typing import Any, Optional

from ..errors import PlatoonError


class Cancelled(PlatoonError):
    """A collective was left unfinished because its thread was told to end (`wait`'s
    `cancel`): the job is going down, and the data it would have brought is not wanted."""

# How long a rank's last words get to reach mpiexec before MPI_Abort tears the job down
# (MPICH drops output still in transit: the reason for an abort went missing without it).
ABORT_GRACE_S = 0.5


def import_mpi() -> Any:
    """mpi4py's MPI module; raises PlatoonError saying how to install it."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # RuntimeError: mpi4py without an MPI library
        raise PlatoonError("multi-node platoon needs mpi4py and an MPI library: pip install "
                           "mpi4py mpich (in platoon's clone: pip install -e '.[mpi]') - %s"
                           % exc) from None
    return MPI


def wait(request: Any, timeout_s: Optional[float] = None, spin_s: float = 100e-6,
         cancel: Optional[threading.Event] = None) -> bool:
    """Complete a non-blocking MPI request without spinning a core while a peer is late or
    a slow link carries the data.

    MPI's blocking calls busy-poll; a controller waiting for a slower node, or for a
    message crossing a slow link, would take a core from its own workers. So: poll for
    `spin_s`, then sleep between polls with a backoff capped at 0.5 ms (each poll also
    moves the data along). Returns False if the request did not complete within
    `timeout_s` (None: forever), or once `cancel` (a threading.Event) is set.
    """
    spin_until = time.perf_counter() + spin_s
    while time.perf_counter() < spin_until:
        if request.Test():
            return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = 20e-6
    while not request.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        if cancel is not None and cancel.is_set():
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.5e-3)
    return True


def abort(comm, code):
    """MPI_Abort on `comm`, once this rank's stderr and stdout have had time to reach mpiexec."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)
