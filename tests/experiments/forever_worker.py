"""Syncs until stopped (gives up by itself after 60 s so nothing outlives a broken test), with
a pause of FOREVER_PAUSE_S seconds (default 0.002; 0: none) after each sync; says SHARED once
its parameters are in the centre. (Its tests check how a job stops, not how fast it syncs:
flat out, two workers and their controller kept both cores busy.)"""

import os
import time

import numpy as np

from platoon import EASGD, Worker

PAUSE_S = float(os.environ.get("FOREVER_PAUSE_S", "0.002"))

with Worker(timeout_s=30) as w:
    params = [np.zeros(1000)]
    w.init_shared_params(params, EASGD(0.5))
    print("SHARED", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        params[0] += 1.0
        w.sync_params()
        w.report(minibatches=1)
        if PAUSE_S:
            time.sleep(PAUSE_S)
