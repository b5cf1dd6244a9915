"""Bootstrap of every process the launcher starts.

``python -m platoon.launch.child LABEL SCRIPT [ARGS...]`` configures logging (level
from PLATOON_LOG_LEVEL, lines tagged with LABEL), makes the process die with
the launcher (PR_SET_PDEATHSIG), turns SIGTERM into SystemExit so `finally`
blocks and finalizers release sockets and shared memory, prints an uncaught
exception's traceback from the script's own frames on (for platoon's ControllerGone, one
line: the launcher reports why the controller stopped), then runs SCRIPT as
``__main__`` (SCRIPT ``-m:MODULE`` calls ``MODULE.main()`` instead, and
``-x:PROGRAM`` executes that program, which keeps the death signal). A script that
ends with a non-zero exit status has failed, whatever it said before: a Worker it left open
tells the controller so at exit, as the launcher sees it.
"""

import importlib
import logging
import os
import runpy
import signal
import sys

from .._os.environment import JobEnvironment
from .._os.process import die_with_parent, raise_system_exit


def main() -> None:
    """Run as ``python -m platoon.launch.child LABEL SCRIPT [ARGS...]``."""
    if len(sys.argv) < 3:
        sys.exit("usage: python -m platoon.launch.child LABEL SCRIPT [ARGS...]")
    label, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    env = JobEnvironment.read("launcher_pid", "log_level")
    if die_with_parent() and env.launcher_pid and os.getppid() != env.launcher_pid:
        sys.exit("platoon: the launcher is gone; exiting")  # it died before prctl took effect
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.excepthook = _from_the_scripts_frames
    logging.basicConfig(
        level=(env.log_level or "INFO").upper(),
        format="%(asctime)s " + label + " %(levelname)s %(name)s: %(message)s")
    if target.startswith("-x:"):
        os.execv(target[3:], [target[3:]] + args)
    try:
        if target.startswith("-m:"):
            sys.argv = [target[3:]] + args
            sys.exit(importlib.import_module(target[3:]).main())  # its exit code, if any
        else:
            sys.argv = [target] + args
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        _note_failed_exit(exc.code)
        raise
    except BaseException:
        if _terminated:  # SIGTERM's SystemExit, turned into another error on its way out (an
            # extension module's import cut short raises ImportError): the stop, not a failure
            sys.exit(128 + signal.SIGTERM)
        raise


_terminated = False  # SIGTERM came (the launcher stops the job)


def _on_sigterm(signum, frame) -> None:
    """SIGTERM's handler: remember it, then exit through SystemExit (`raise_system_exit`)."""
    global _terminated
    _terminated = True
    raise_system_exit(signum, frame)


def _from_the_scripts_frames(exc_type, exc, tb) -> None:
    """sys.excepthook: print an uncaught exception's traceback from the script's frames on,
    without the frames of this bootstrap and runpy above them."""
    internal = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None and tb.tb_next is not None and (
            os.path.abspath(tb.tb_frame.f_code.co_filename) in internal
            or tb.tb_frame.f_code.co_filename.startswith("<frozen ")):
        tb = tb.tb_next
    if exc is not None:
        exc.__traceback__ = tb  # (what Python's hook prints)
    if exc_type.__module__ == "platoon.errors" and exc_type.__name__ == "ControllerGone":
        print(_controller_gone(exc, tb), file=sys.stderr, flush=True)
        return
    sys.__excepthook__(exc_type, exc, tb)


def _controller_gone(exc, tb) -> str:
    """One line for a worker stopped by platoon.errors.ControllerGone: the controller stopped
    for a reason of its own or another process's, which the launcher reports; platoon's
    internal frames (and the socket errors under them) would only hide it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    where = None
    while tb is not None:  # the script's last frame: where it stopped
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(package + os.sep):
            where = "%s, line %d, in %s" % (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return ("platoon.errors.ControllerGone: %s%s (the launcher reports why the job stopped)"
            % (exc, " (at %s)" % where if where else ""))


def _note_failed_exit(code) -> None:
    """sys.exit(code): if it is a failure and the script's process holds platoon's worker
    side, have an unclosed Worker's goodbye at exit say it failed (the launcher counts this
    exit as a failure; the controller must too, or a replacement could not take its id)."""
    if code is None or code == 0:
        return
    client = sys.modules.get("platoon._worker.client")  # loaded with a Worker; never imported here
    if client is not None:
        client.note_failed_exit(code)


if __name__ == "__main__":
    main()
