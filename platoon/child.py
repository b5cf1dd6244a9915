"""Bootstrap of every process the launcher starts.

``python -m platoon.child LABEL SCRIPT [ARGS...]`` configures logging (level
from PLATOON_LOG_LEVEL, lines tagged with LABEL), makes the process die with
the launcher (PR_SET_PDEATHSIG), turns SIGTERM into SystemExit so `finally`
blocks and finalizers release sockets and shared memory, then runs SCRIPT as
``__main__`` (SCRIPT ``-m:MODULE`` calls ``MODULE.main()`` instead, and
``-x:PROGRAM`` executes that program, which keeps the death signal).
"""

import ctypes
import importlib
import logging
import os
import runpy
import signal
import sys

from .controller import raise_system_exit

PR_SET_PDEATHSIG = 1


def die_with_parent(signum=signal.SIGTERM):
    """Have the kernel send `signum` to this process when its parent dies (Linux only;
    elsewhere the parent's own cleanup still applies). Returns whether it took effect."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: python -m platoon.child LABEL SCRIPT [ARGS...]")
    label, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    launcher = os.environ.get("PLATOON_LAUNCHER_PID")
    if die_with_parent() and launcher and os.getppid() != int(launcher):
        sys.exit("platoon: the launcher is gone; exiting")  # it died before prctl took effect
    signal.signal(signal.SIGTERM, raise_system_exit)
    logging.basicConfig(
        level=os.environ.get("PLATOON_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s " + label + " %(levelname)s %(name)s: %(message)s")
    if target.startswith("-x:"):
        os.execv(target[3:], [target[3:]] + args)
    if target.startswith("-m:"):
        sys.argv = [target[3:]] + args
        importlib.import_module(target[3:]).main()
    else:
        sys.argv = [target] + args
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
