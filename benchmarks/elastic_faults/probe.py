"""Runs an ordinary training script as its own ``__main__`` (argv, sys.path[0] as `python
SCRIPT` gives them) and appends to EVENTS (JSON lines, one write each: a kill -9 loses none
written) when its start-up's steps ended, for the fault race's joiner breakdown
(`benchmarks.elastic_faults.script`); the script is not changed and prints nothing more.

usage: python benchmarks/elastic_faults/probe.py EVENTS SCRIPT [ARGS...]

Events: "probe" (the process's start from /proc and this file's first line: python's own
start-up), "imported" (torch, platoon: when the script's import of each returned), "returned"
(each call the script's `main` makes, by qualified name, when it returned, until its sync is
set up: `PeriodicSync.__init__` or `Worker.init_shared_params`; none after, so its training
runs untraced). Standard library only, run by path: nothing of the benchmarks is imported
before the script's own first line.
"""

import builtins
import json
import os
import sys
import time

FIRST_LINE = time.time()
WATCHED = ("torch", "platoon")
SET_UP = ("PeriodicSync.__init__", "Worker.init_shared_params")
MAX_EVENTS = 500  # calls of `main` traced at most (a script without a sync set-up)


def process_start_time():
    """When this process started (time.time() seconds), from /proc (None where it cannot
    say)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Probe:
    """The hooks: an `__import__` that notes when torch and platoon first arrive, then a
    profile function on `main`'s calls until the sync is set up."""

    def __init__(self, events_path, script):
        self.fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.script = os.path.abspath(script)
        self.real_import = builtins.__import__
        self.waiting = [n for n in WATCHED if n not in sys.modules]
        self.count = 0

    def event(self, ev, **fields):
        fields.update(ev=ev, t=time.time())
        os.write(self.fd, (json.dumps(fields) + "\n").encode())

    def install(self):
        self.event("probe", process_started=process_start_time(), first_line=FIRST_LINE,
                   pid=os.getpid())
        if self.waiting:
            builtins.__import__ = self._import
        else:
            sys.setprofile(self._profile)

    def _import(self, name, *args, **kwargs):
        first = name in self.waiting and name not in sys.modules
        module = self.real_import(name, *args, **kwargs)
        if first:
            self.waiting.remove(name)
            self.event("imported", name=name)
            if not self.waiting:  # the rest untraced; `main`'s calls from now on
                builtins.__import__ = self.real_import
                sys.setprofile(self._profile)
        return module

    def _profile(self, frame, event, arg):
        if event == "return":
            caller, name = frame.f_back, frame.f_code.co_qualname
        elif event == "c_return":
            caller, name = frame, getattr(arg, "__qualname__", repr(arg))
        else:
            return
        if caller is None or caller.f_code.co_name != "main" \
                or caller.f_code.co_filename != self.script:
            return
        self.event("returned", name=name)
        self.count += 1
        if name in SET_UP or self.count >= MAX_EVENTS:
            sys.setprofile(None)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: python %s EVENTS SCRIPT [ARGS...]" % sys.argv[0])
    events_path, script = sys.argv[1], sys.argv[2]
    Probe(events_path, script).install()
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    import runpy
    runpy.run_path(os.path.abspath(script), run_name="__main__")


if __name__ == "__main__":
    main()
