"""The default controller; prints the arguments the launcher gave it (-c)."""

import sys

from platoon import Controller

print("CONTROLLER ARGV %r" % sys.argv[1:], flush=True)
with Controller() as ctl:
    ctl.serve()
