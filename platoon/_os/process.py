"""Processes: signals, dying with the parent, pid checks, stopping, the ready pipe, job segments,
finding mpiexec.

Standard library only (no zmq, no numpy), so that every process the launcher,
the MPI runner or the reaper starts can use it without paying for the rest of
platoon.
"""

import ctypes
import json
import os
import select
import signal
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, List, NamedTuple, Optional

if TYPE_CHECKING:  # subprocess is loaded by `stop` only: workers import this module too
    import subprocess

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "/platoon-"  # POSIX name of every platoon segment: /platoon-JOB-KIND-TOKEN
PR_SET_PDEATHSIG = 1


# -- signals -----------------------------------------------------------------

def raise_system_exit(signum: int, frame) -> None:
    """Signal handler: exit through SystemExit (code 128 + signum), running `finally` blocks."""
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM raise SystemExit (in the main thread, if SIGTERM has no handler yet), so
    `finally` blocks and finalizers run; returns a function that restores the default."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None
    signal.signal(signal.SIGTERM, raise_system_exit)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return restore


def unlink_segments_on_sigterm(job_id: str) -> Callable[[], None]:
    """In the main thread: on SIGTERM, unlink job `job_id`'s segments in /dev/shm, then do
    what SIGTERM did before: by default raise SystemExit (128 + signum, as a launched worker
    does, so `finally` blocks and finalizers run); call the script's own handler instead, if it
    has one (the segments then go only if that handler raises: if it returns, the script
    carries on and its own exit cleans up); an ignored SIGTERM stays ignored. For the segments
    of a process that owns its job (a script run alone), which a scheduler's time limit would
    otherwise leave behind. Returns a function that puts the previous handler back, if this
    one is still installed."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() \
            or previous in (signal.SIG_IGN, None):  # None: set outside Python; leave it
        return lambda: None

    def on_sigterm(signum: int, frame) -> None:
        if callable(previous):
            try:
                previous(signum, frame)
            except BaseException:
                unlink_job_segments(job_id)
                raise
            return
        unlink_job_segments(job_id)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)
    return restore


def _find_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# found once, at import: `die_with_parent` runs in a child between fork and exec, where a
# dlopen or dlsym could wait forever on the loader's lock, held at the fork by another thread
# of the parent (an elastic node imports torch in a thread while it starts its workers)
_PRCTL = _find_prctl()


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send `signum` to this process when its parent dies (Linux only;
    elsewhere the parent's own cleanup still applies). Returns whether it took effect. Safe
    between fork and exec: no library is looked up."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0


def signal_name(signum: int) -> str:
    """'SIGTERM' for 15; 'signal N' for a number with no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


# -- pids --------------------------------------------------------------------

class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat that platoon uses."""

    state: str       # R, S, D, Z (zombie), ...
    ppid: int
    session: int
    start_time: int  # clock ticks since boot: with the pid, names one process for good


def proc_stat(pid: int) -> Optional[ProcStat]:
    """Process `pid`'s state, parent, session and start time; None if it is gone (or there is
    no /proc). The command name may hold spaces and parentheses: fields follow the last ')'."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[3]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """False once process `pid` has exited (zombies count as exited)."""
    if os.path.isdir("/proc/self"):
        found = proc_stat(pid)
        return found is not None and found.state != "Z"
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def start_time(pid: int) -> Optional[int]:
    """The start time of process `pid` (clock ticks since boot), or None if it is gone."""
    found = proc_stat(pid)
    return None if found is None else found.start_time


# -- stopping ----------------------------------------------------------------

def _send(proc: "subprocess.Popen", signum: int, group: bool) -> None:
    try:
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop(procs: Iterable["subprocess.Popen"], timeout_s: float, *, grace_s: float = 0.0,
         group: bool = True) -> None:
    """Stop `procs`: wait up to `grace_s` for them to exit by themselves, SIGTERM the rest,
    wait to a `timeout_s` deadline, SIGKILL what is left, and reap them all.

    With `group` (each leads its own session or group, as launched children do) the signals go
    to the whole process group, so grandchildren are stopped too. Processes already reaped are
    never signalled: their pids may have been reused.
    """
    import subprocess

    live = [p for p in procs if p.poll() is None]
    for wait_s, signum in ((grace_s, signal.SIGTERM), (timeout_s, signal.SIGKILL)):
        deadline = time.monotonic() + wait_s
        for proc in live:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _send(proc, signum, group)
    for proc in live:
        if group:
            _send(proc, signal.SIGKILL, group)  # stragglers in the group, if any
        proc.wait()


def read_to_end(fd: int) -> bytes:
    """What the pipe `fd` gives until its writers have all closed it (blocking)."""
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


# -- the ready pipe ----------------------------------------------------------

def announce(fd: int, message: dict) -> None:
    """Write `message` as one JSON line on the ready pipe `fd`, then close it; raises OSError."""
    try:
        os.write(fd, (json.dumps(message) + "\n").encode())
    finally:
        os.close(fd)


def read_announcement(fd: int, timeout_s: Optional[float]) -> Optional[dict]:
    """The JSON line announced on the pipe `fd` (left open); None if none came within
    `timeout_s` seconds (None: wait forever) or the writer closed the pipe first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        if not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None  # the writer exited (or closed the pipe) first
        data += chunk
    return json.loads(data.split(b"\n", 1)[0])


# -- job segments ------------------------------------------------------------

def own_segments(prefix: str = SEGMENT_PREFIX, shm_dir: str = SHM_DIR) -> List[str]:
    """Paths in `shm_dir` named `prefix`* (a POSIX name: its leading '/' is dropped) that are
    regular files of this user. Found with lstat only: a FIFO or device named like a segment
    (anyone can make one in /dev/shm) is never opened, a symlink never followed."""
    found: List[str] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return found
    for name in sorted(names):
        if not name.startswith(prefix.lstrip("/")):
            continue
        path = os.path.join(shm_dir, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            found.append(path)
    return found


def job_segments(job_id: str, shm_dir: str = SHM_DIR, *, kind: str = "") -> List[str]:
    """The shared-memory segments of job `job_id` (``platoon-JOB-*``; of one `kind` only,
    ``platoon-JOB-KIND-*``, if given) that this user owns."""
    return own_segments("%s%s-%s" % (SEGMENT_PREFIX, job_id, kind + "-" if kind else ""),
                        shm_dir)


def unlink_job_segments(job_id: str, shm_dir: str = SHM_DIR) -> List[str]:
    """Unlink job `job_id`'s segments (see `job_segments`); returns the paths removed."""
    removed = []
    for path in job_segments(job_id, shm_dir):
        try:
            os.unlink(path)
        except OSError:
            continue  # gone meanwhile
        removed.append(path)
    return removed


def find_mpiexec() -> Optional[str]:
    """The path of mpiexec: the one beside this Python (a virtual environment's, from pip's
    mpich) first, else the first on PATH; None when there is none."""
    import shutil  # (not loaded by the workers, which import this module too)

    return (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
            or shutil.which("mpiexec"))
