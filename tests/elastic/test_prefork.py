"""platoon.node.prefork: an elastic node's workers forked once it imported torch, each
running its script as ``python script.py`` would (real forks, from a driver process)."""

import os
import re
import sys

from helpers import Proc

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "..", "procs", "prefork_driver.py")
SCRIPT = os.path.join(HERE, "..", "procs", "prefork_script.py")


def _drive(count, *args, env=None):
    proc = Proc([DRIVER, str(count), SCRIPT] + list(args), env=env)
    try:
        assert proc.wait(60) == 0, proc.output
    finally:
        proc.kill()
    return proc.output


def test_forked_workers_find_torch_loaded_and_run_their_script_as_python_would():
    """Each worker finds torch imported at its script's first line; its script runs as
    ``__main__`` with its own argv, sys.path[0] (the script's folder), environment (MARK),
    numpy random state (the two draw differently, where a fork would copy one state),
    logging (basicConfig takes effect: the node's handlers are gone) and exit code; its
    atexit handlers run."""
    out = _drive(2, "3")
    assert "FORKED 2" in out
    draws = []
    for i in (0, 1):
        assert "CODE %d 3" % i in out
        match = re.search(r"OUT %d LOADED True NAME __main__ ARGV \S+prefork_script.py 3 PATH0 "
                          r"(\S+) MARK %d RANDOM (\d+)" % (i, i), out)
        assert match, out
        assert os.path.samefile(match.group(1), os.path.dirname(SCRIPT))
        draws.append(match.group(2))
        assert "ERR %d LOG shown" % i in out and "OUT %d ATEXIT" % i in out
    assert draws[0] != draws[1]


def test_a_forked_workers_uncaught_error_is_printed_as_its_own_and_exits_1():
    out = _drive(1, "raise")
    assert "CODE 0 1" in out
    traceback = [line[len("ERR 0 "):] for line in out.splitlines() if line.startswith("ERR 0 ")
                 and not line.startswith("ERR 0 LOG")]
    assert traceback[0] == "Traceback (most recent call last):", out
    assert "prefork_script.py" in traceback[1], out  # the node's frames left out
    assert traceback[-1] == "ValueError: the script's own error"
    assert "prefork.py" not in out


def test_a_forked_worker_never_started_exits_at_once():
    out = _drive(2, "3", env={"GIVE_UP": "1"})
    assert "FORKED 2" in out and "CODE 0 0" in out and "CODE 1 0" in out, out
    assert "OUT" not in out and "ERR" not in out


def test_workers_are_new_processes_where_asked_or_where_they_run_no_python_script():
    from platoon.node.prefork import script_of
    assert "FORKED 0" in _drive(1, "0", env={"PLATOON_PREFORK": "0"})
    assert script_of([sys.executable, "train.py", "--lr", "1"]) == ("path", "train.py")
    assert script_of([sys.executable, "-m", "pkg.train", "x"]) == ("module", "pkg.train")
    assert script_of([sys.executable, "-X", "importtime", "train.py"]) is None
    assert script_of(["./train.sh"]) is None and script_of([sys.executable, "-m"]) is None
