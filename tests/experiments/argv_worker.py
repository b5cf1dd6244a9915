"""Prints the arguments the launcher gave it (-w), and exits."""

import sys

from platoon import Worker

print("WORKER ARGV %r" % sys.argv[1:], flush=True)
with Worker() as w:
    pass
