"""A worker that says where it runs, then is tests/procs/elastic_worker.py (same arguments):
prints "WHERE host HOSTNAME netns NETNS ssh SSH_CONNECTION" (its hostname, its network
namespace as /proc/self/ns/net names it, and the ssh session it descends from, "-" if none)."""

import os
import runpy
import socket
import sys

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")

if __name__ == "__main__":
    print("WHERE host %s netns %s ssh %s" % (
        socket.gethostname(), os.readlink("/proc/self/ns/net"),
        os.environ.get("SSH_CONNECTION", "-").replace(" ", ",")), flush=True)
    sys.argv[0] = WORKER
    runpy.run_path(WORKER, run_name="__main__")
