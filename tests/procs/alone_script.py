"""A training script run alone (no launcher, no port): a one-worker job with its controller in
this process. It prints READY and the job id, then syncs until signalled (at most 30 s).

usage: alone_script.py [own-handler]
  own-handler: install the script's own SIGTERM handler before the worker, which says so
  and exits with code 3
"""

import signal
import sys
import time

import numpy as np

import platoon

# As in a terminal: Ctrl-C raises KeyboardInterrupt (a background parent may have left
# SIGINT ignored, and then Python keeps it ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[1:] == ["own-handler"]:
    def own(signum, frame):
        print("the script's own handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, own)

w = platoon.Worker(timeout_s=10)
x = np.ones(1000, dtype=np.float32)
w.init_shared_params([x], platoon.EASGD(0.5))
print("READY", w.job_id, flush=True)
deadline = time.monotonic() + 30.0
while time.monotonic() < deadline:
    x += 1.0
    w.sync_params()
    time.sleep(0.001)
