"""A watchdog that cleans up after a node's controller killed without warning.

When one MPI rank dies, ``mpiexec`` SIGKILLs every other rank, and an elastic node may be
SIGKILLed by its host: their controllers get no chance to unlink shared memory or stop their
workers. Each node runner therefore starts ``python -m platoon.node.reaper FD JOB_ID`` in its
own session. The reaper blocks reading the pipe FD, on which the controller
writes its workers' pids with their start times; at end of file (the controller
exited, however it exited) it SIGKILLs those still alive (the same processes: a
pid reused since has another start time) and unlinks ``/dev/shm/platoon-JOB_ID-*``
(regular files of this user only). After a clean exit there is nothing left and it
does nothing.
"""

import os
import signal
import subprocess
import sys

from .._os.process import read_to_end, start_time, unlink_job_segments


def start(job_id: str) -> int:
    """Start a reaper for `job_id`; return the pipe's write end (write pids, never close it)."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, True)
    subprocess.Popen([sys.executable, "-m", "platoon.node.reaper", str(read_fd), job_id],
                     pass_fds=(read_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read_fd)
    return write_fd


def watch(write_fd: int, pid: int) -> None:
    """Tell the reaper to kill `pid` if the controller dies."""
    started = start_time(pid)
    os.write(write_fd, b"%d %s\n" % (pid, b"-" if started is None else b"%d" % started))


def reap(read_fd: int, job_id: str) -> None:
    """Read pids to the pipe's end, then SIGKILL those still alive and unlink the job's
    shared memory."""
    for line in read_to_end(read_fd).splitlines():
        try:
            pid, started = line.decode().split()
            if str(start_time(int(pid))) == started:  # still the process we were told about
                os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    unlink_job_segments(job_id)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the job must not skip the cleanup
    reap(int(sys.argv[1]), sys.argv[2])
