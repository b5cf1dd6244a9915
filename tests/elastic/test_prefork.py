"""platoon.node.prefork: an elastic node's workers forked once it imported torch, each
running its script as ``python script.py`` would (real forks, from a driver process)."""

import os
import re
import signal
import sys

from platoon._os.process import pid_alive

from helpers import Proc, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "..", "procs", "prefork_driver.py")
PROCS = os.path.join(HERE, "..", "procs")
SCRIPT = os.path.join(PROCS, "prefork_script.py")


def _drive(count, *args, env=None, script=SCRIPT):
    """The driver's output, forking `count` workers of ``python SCRIPT ARGS...`` (`script`
    a path, or a list: ["-m", module])."""
    script = [script] if isinstance(script, str) else script
    proc = Proc([DRIVER, str(count)] + script + list(args), env=env)
    try:
        assert proc.wait(60) == 0, proc.output
    finally:
        proc.kill()
    return proc.output


def test_forked_workers_find_torch_loaded_and_run_their_script_as_python_would(tmp_path):
    """Each worker finds torch imported at its script's first line; its script (run through
    a symlink, by a relative path) runs as ``__main__`` with its own argv, sys.path[0] (the
    folder of the script's real file: its sibling modules import), environment (MARK),
    numpy and torch random states (the two draw differently, where a fork would copy one
    state), __file__ (the path given, made absolute as Python 3.9+ makes it: a script that
    changes its directory still finds its files), __cached__, __loader__ and sys.orig_argv
    (its own command: not its node's), logging (basicConfig takes effect: the node's
    handlers are gone) and exit code; its atexit handlers run."""
    link = tmp_path / "train.py"
    link.symlink_to(os.path.abspath(SCRIPT))
    given = os.path.relpath(str(link))
    out = _drive(2, "3", script=given)
    assert "FORKED 2" in out
    draws, torch_draws = [], []
    for i in (0, 1):
        assert "CODE %d 3" % i in out
        match = re.search(r"OUT %d LOADED True NAME __main__ ARGV (\S+) 3 PATH0 (\S+) MARK %d "
                          r"RANDOM (\d+)" % (i, i), out)
        assert match and match.group(1) == given, out
        assert match.group(2) == os.path.realpath(PROCS), out
        draws.append(match.group(3))
        match = re.search(r"OUT %d FILE (\S+) CACHED None LOADER SourceFileLoader ORIG (.+) "
                          r"TORCH (\d+)" % i, out)
        assert match, out
        assert match.group(1) == os.path.join(os.getcwd(), given), out
        assert match.group(2) == given + " 3", out
        torch_draws.append(match.group(3))
        assert "ERR %d LOG shown" % i in out and "OUT %d ATEXIT" % i in out
    assert draws[0] != draws[1] and torch_draws[0] != torch_draws[1], out


def test_forked_scripts_end_as_python_ends_them_with_their_files_and_their_main():
    """Once a script's body has ended (here run with -m), its non-daemon threads run on
    (joined) and its atexit handlers run, with its files open (the node's objects for the
    other workers' pipes, freed as the script ends, close nothing of the script's: the second
    worker opened its file under a number the first's pipe had in the node) and ``__main__``
    still its own module."""
    out = _drive(2, script=["-m", "prefork_ending"], env={"PYTHONPATH": os.pathsep.join(
        [PROCS, os.environ.get("PYTHONPATH", "")])})
    for i in (0, 1):
        assert "CODE %d 0" % i in out, out
        assert "OUT %d THREAD wrote, own main True" % i in out, out
        assert "OUT %d ATEXIT read thread, own main True" % i in out, out
    assert "ERR" not in out, out


def test_a_forked_workers_uncaught_error_is_printed_as_its_own_and_exits_1():
    out = _drive(1, "raise")
    assert "CODE 0 1" in out
    traceback = [line[len("ERR 0 "):] for line in out.splitlines() if line.startswith("ERR 0 ")
                 and not line.startswith("ERR 0 LOG")]
    assert traceback[0] == "Traceback (most recent call last):", out
    assert "prefork_script.py" in traceback[1], out  # the node's frames left out
    assert traceback[-1] == "ValueError: the script's own error"
    assert "prefork.py" not in out


def test_a_forked_workers_keyboard_interrupt_is_printed_as_its_own_and_ends_it_by_sigint():
    """As Python ends a script interrupted (^C: the node's terminal sends SIGINT to its
    workers too): its traceback, without the node's frames, and SIGINT its end."""
    out = _drive(1, "interrupt")
    assert "CODE 0 -%d" % signal.SIGINT in out, out
    traceback = [line[len("ERR 0 "):] for line in out.splitlines() if line.startswith("ERR 0 ")
                 and not line.startswith("ERR 0 LOG")]
    assert traceback[0] == "Traceback (most recent call last):", out
    assert "prefork_script.py" in traceback[1], out
    assert traceback[-1] == "KeyboardInterrupt" and "prefork.py" not in out, out


def test_a_forked_worker_never_started_exits_at_once():
    out = _drive(2, "3", env={"GIVE_UP": "1"})
    assert "FORKED 2" in out and "CODE 0 0" in out and "CODE 1 0" in out, out
    assert "OUT" not in out and "ERR" not in out


def test_forked_workers_waiting_for_their_start_die_with_their_node():
    """Its node killed -9 (no cleanup of its own), its forked workers still waiting for their
    start die with it (PR_SET_PDEATHSIG): none is left behind."""
    proc = Proc([DRIVER, "2", SCRIPT, "0"], env={"HOLD": "1"})
    try:
        pids = [int(pid) for pid in proc.wait_for_line("PIDS ", 60).split()[1:]]
        assert len(pids) == 2 and all(pid_alive(pid) for pid in pids), proc.output
        os.kill(proc.pid, signal.SIGKILL)  # (the driver only: not its process group)
        wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10,
                   "the forked workers to die with their node")
    finally:
        proc.kill()


def test_workers_are_new_processes_where_asked_or_where_they_run_no_python_script():
    from platoon.node.prefork import script_of
    assert "FORKED 0" in _drive(1, "0", env={"PLATOON_PREFORK": "0"})
    assert script_of([sys.executable, "train.py", "--lr", "1"]) == ("path", "train.py")
    assert script_of([sys.executable, "-m", "pkg.train", "x"]) == ("module", "pkg.train")
    assert script_of([sys.executable, "-X", "importtime", "train.py"]) is None
    assert script_of(["./train.sh"]) is None and script_of([sys.executable, "-m"]) is None
    # this Python by a name its PATH finds (`-- python train.py`), not another's
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ["PATH"]
    try:
        os.environ["PATH"] = bin_dir + os.pathsep + path
        name = os.path.basename(sys.executable)
        assert script_of([name, "train.py"]) == ("path", "train.py")
        os.environ["PATH"] = "/nonexistent"
        assert script_of([name, "train.py"]) is None
    finally:
        os.environ["PATH"] = path
