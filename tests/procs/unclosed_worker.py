"""A worker that registers, prints ID, then ends without calling close().

usage: unclosed_worker.py CONTROL_PORT HOW   (HOW: return | raise | exit3 | os_exit)
"""

import os
import sys

from platoon import Worker

port, how = int(sys.argv[1]), sys.argv[2]
w = Worker(port, timeout_s=30)
print("ID %d" % w.worker_id, flush=True)
if how == "raise":
    raise RuntimeError("the training script failed")
if how == "exit3":
    sys.exit(3)
if how == "os_exit":
    os._exit(0)  # no exit handlers: nothing is said
