"""Forks workers as an elastic node does (`platoon.node.prefork`), from a process of its own
(a fork continues its parent's frames: never pytest's): python prefork_driver.py COUNT
SCRIPT ARGS... Starts each with MARK=its index (gives each up, never started, with
GIVE_UP=1; with HOLD=1, prints "PIDS p q ..." and sleeps, never starting them), then prints
"FORKED n", each worker's "CODE i c", its stdout lines as "OUT i LINE" and stderr lines as
"ERR i LINE"."""

import os
import signal
import sys
import time

from platoon.node.prefork import prefork


def preload():
    import torch  # noqa: F401


def main():
    # ^C as from a terminal: a suite started in the background of a shell script has SIGINT
    # ignored, and workers (forked or new) inherit that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    count, command = int(sys.argv[1]), [sys.executable] + sys.argv[2:]
    workers = prefork(command, count, preload)
    print("FORKED %d" % len(workers), flush=True)
    if os.environ.get("HOLD"):
        print("PIDS %s" % " ".join(str(worker.pid) for worker in workers), flush=True)
        time.sleep(60)  # (the test kills it)
        return
    if os.environ.get("GIVE_UP"):
        for i, worker in enumerate(workers):
            worker.give_up()
            print("CODE %d %d" % (i, worker.returncode))
        return
    for i, worker in enumerate(workers):
        worker.start(dict(os.environ, MARK=str(i), PYTHONUNBUFFERED="1"))
    for i, worker in enumerate(workers):
        print("CODE %d %d" % (i, worker.wait(60)))
        for kind, stream in (("OUT", worker.stdout), ("ERR", worker.stderr)):
            for line in stream.read().decode().splitlines():
                print("%s %d %s" % (kind, i, line))
            stream.close()


if __name__ == "__main__":
    main()
