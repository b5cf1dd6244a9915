"""Helpers shared by the benchmarks: child processes that always die, and timing."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                     "BLIS_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1",
                     "NUMEXPR_NUM_THREADS": "1"}


class Child:
    """`python -m benchmarks._child ROLE ARGS...` in its own session, with single-threaded BLAS.

    Reads its stdout line by line; `close` kills its process group if it is
    still running (SIGTERM, then SIGKILL) and reaps it.
    """

    def __init__(self, role, *args):
        env = dict(os.environ, PYTHONUNBUFFERED="1", **SINGLE_THREAD_ENV)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._child", role] + [str(a) for a in args],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        self.role = role
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for text in self.popen.stdout:
            self._lines.put(text)
        self._lines.put(None)

    def line(self, prefix, timeout=60.0):
        """The next stdout line starting with `prefix` (others are skipped), as its words."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("benchmark child %s printed no %r within %.0f s"
                                   % (self.role, prefix, timeout)) from None
            if text is None:
                raise RuntimeError("benchmark child %s exited (code %s) before printing %r"
                                   % (self.role, self.popen.wait(), prefix))
            if text.startswith(prefix):
                return text.split()[1:]

    def send(self, text):
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()

    def wait(self, timeout=60.0):
        """Close the child's stdin (its cue to finish) and wait for its exit code."""
        try:
            self.popen.stdin.close()
        except OSError:
            pass
        return self.popen.wait(timeout)

    def close(self):
        if self.popen.poll() is None:
            for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.popen.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.popen.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:
            self.popen.stdin.close()
        except OSError:
            pass


class Children:
    """A context manager that closes every child started through it."""

    def __init__(self):
        self.started = []

    def start(self, role, *args):
        child = Child(role, *args)
        self.started.append(child)
        return child

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for child in self.started:
            child.close()


def best_time(fn, repeat, number=1):
    """The fastest of `repeat` timings of `number` calls of fn, in seconds per call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def interleaved(fns, rounds, number=1):
    """Best time per call of each function, measured in alternation so load hits all alike."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_time(fn, 1, number))
    return best
