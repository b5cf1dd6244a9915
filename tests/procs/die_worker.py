"""A worker that shares parameters, syncs, prints READY and then waits at a barrier or syncs
forever (until killed); exits by itself after 60 s so nothing outlives a broken test.

usage: die_worker.py PORT MODE   (MODE: barrier | sync | hold)
"""

import sys
import time

import numpy as np

from platoon import EASGD, Worker

port, mode = int(sys.argv[1]), sys.argv[2]
with Worker(port, timeout_s=60) as w:
    params = [np.zeros(100000)]
    w.init_shared_params(params, EASGD(0.5))
    print("READY %d" % w.worker_id, flush=True)
    deadline = time.monotonic() + 60
    if mode == "barrier":
        try:
            w.barrier(timeout_s=None)
        except Exception as exc:
            print("RAISED %s: %s" % (type(exc).__name__, exc), flush=True)
            raise
    elif mode == "hold":
        w.lock()
        params[0][:] = 1.0
        w.shared_params[0][:50000] = 5.0  # half-way through an update of the centre
        print("HOLDING", flush=True)
        time.sleep(60)
    else:
        try:
            while time.monotonic() < deadline:
                params[0] += 1.0
                w.sync_params()
        except Exception as exc:
            print("RAISED %s: %s" % (type(exc).__name__, exc), flush=True)
            raise
