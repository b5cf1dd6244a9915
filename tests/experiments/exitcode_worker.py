"""Worker 1's first attempt shares the centre, then ends with sys.exit(3): without closing
its Worker (platoon says goodbye at exit), or with `after-close` as the argument right after
close(). With `all` (`all-after-close`), every worker's first attempt does so (after-close:
once every worker has closed, so that none exits while the controller still serves). A
replacement prints its id and finishes; the other workers wait for it. Runs in the test's
temporary directory."""

import os
import sys
import time

import numpy as np

from platoon import EASGD, Worker

mode = sys.argv[1] if len(sys.argv) > 1 else "one"
index = int(os.environ["PLATOON_WORKER_INDEX"])
marker = "worker%d-exited" % index
w = Worker(timeout_s=30)
w.init_shared_params([np.zeros(10)], EASGD(0.5))
if (index == 1 or mode.startswith("all")) and not os.path.exists(marker):
    open(marker, "w").close()
    if mode.endswith("after-close"):
        workers = w.num_workers or 1
        w.close()
        open("closed%d" % index, "w").close()
        deadline = time.monotonic() + 10
        while mode == "all-after-close" and time.monotonic() < deadline and not all(
                os.path.exists("closed%d" % k) for k in range(workers)):
            time.sleep(0.02)  # every worker has closed (the controller finishes) before any exits
    sys.exit(3)
replacement = os.path.exists(marker)
print("REPLACEMENT" if replacement else "ORIGINAL", "worker", index, "has worker id",
      w.worker_id, flush=True)
if replacement:
    open("replaced", "w").close()
deadline = time.monotonic() + 30
while mode == "after-close" and not os.path.exists("replaced") and time.monotonic() < deadline:
    time.sleep(0.05)  # worker 0 waits (bounded) until worker 1's replacement has registered
w.close()
