"""What the tests share that is not a fixture: the repository's paths, child processes whose
output is read line by line, the shared memory and processes a test may leave, a controller
that answers None, a bounded wait. (Fixtures are in conftest.py.)"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from platoon import Controller
from platoon._os.process import proc_stat

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROCS = os.path.join(HERE, "procs")
EXPERIMENTS = os.path.join(HERE, "experiments")
SHM = "/dev/shm"


def platoon_segments():
    try:
        return {n for n in os.listdir(SHM) if n.startswith("platoon")}
    except FileNotFoundError:
        return set()


def child_pids():
    """Pids whose parent is this process (zombies included), or that live in the session of a
    process this session started (a forked child outliving its parent)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        found_stat = proc_stat(int(entry))
        if found_stat is None:
            continue
        if found_stat.ppid == me or (found_stat.session in SPAWNED and found_stat.state != "Z"):
            found.append(int(entry))
    return found


SPAWNED = set()  # pids of the processes this session started


def session_members(session):
    """Pids of the live (not zombie) processes in session `session`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found_stat = proc_stat(int(entry))
            if found_stat is not None and found_stat.session == session \
                    and found_stat.state != "Z":
                found.append(int(entry))
    return found


class Proc:
    """A child Python process whose output is collected line by line."""

    def __init__(self, args, env=None):
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                        OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        full_env.update(env or {})
        self.args = args
        self.popen = subprocess.Popen([sys.executable] + list(args), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=full_env, text=True,
                                      start_new_session=True)
        self.pid = self.popen.pid
        SPAWNED.add(self.pid)
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)  # end of output
            self._cond.notify_all()

    @property
    def output(self):
        return "\n".join(line for line in self.lines if line is not None)

    def wait_for_line(self, prefix, timeout=20.0):
        """The first output line starting with `prefix`; fails the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line is None:
                        pytest.fail("%s exited (code %s) before printing %r:\n%s" % (
                            self.args[0], self.popen.poll(), prefix, self.output))
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail("no line %r from %s within %.3g s:\n%s"
                                % (prefix, self.args[0], timeout, self.output))
                self._cond.wait(left)

    def wait_for_match(self, pattern, timeout=20.0, start=0):
        """(the re.Match, its line's index) of the first output line from index `start` on
        that matches regular expression `pattern`; fails the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._cond:
            while True:
                for index in range(start, len(self.lines)):
                    line = self.lines[index]
                    if line is None:
                        pytest.fail("%s exited (code %s) before printing a line matching %r:\n%s"
                                    % (self.args[0], self.popen.poll(), pattern, self.output))
                    match = regex.match(line)
                    if match:
                        return match, index
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail("no line matching %r from %s within %.3g s:\n%s"
                                % (pattern, self.args[0], timeout, self.output))
                self._cond.wait(left)

    def wait(self, timeout=30.0):
        """Exit code; fails the test (the process is killed in teardown) after `timeout` s."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("%s still running after %.3g s:\n%s" % (self.args[0], timeout, self.output))
        self._reader.join(5)
        return code

    def kill(self):
        """SIGKILL the process and everything in its session (a forked child outlives it)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered asynchronously: wait (bounded) until the session's other
        # processes, such as a forked child whose parent is gone, have died too.
        deadline = time.monotonic() + 5.0
        while session_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._reader.join(5)


class Nothing(Controller):
    """A controller that answers every request with None."""

    def handle_control(self, req, worker_id, req_info):
        return None


def wait_until(condition, timeout, what):
    """Poll `condition` (state owned by other processes: reaped pids, unlinked files, a
    handler installed) until it holds; fails the test, naming `what`, after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.3g s waiting for %s" % (timeout, what))
        time.sleep(0.02)  # bounded by the deadline
