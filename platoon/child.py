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


def _die_with_parent():
    launcher = os.environ.get("PLATOON_LAUNCHER_PID")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's own cleanup still applies
        return
    if launcher and os.getppid() != int(launcher):  # it died before prctl took effect
        sys.exit("platoon: the launcher is gone; exiting")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: python -m platoon.child LABEL SCRIPT [ARGS...]")
    label, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    _die_with_parent()
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
