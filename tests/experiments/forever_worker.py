"""Syncs until stopped (gives up by itself after 60 s so nothing outlives a broken test); says
SHARED once its parameters are in the centre."""

import time

import numpy as np

from platoon import EASGD, Worker

with Worker(timeout_s=30) as w:
    params = [np.zeros(1000)]
    w.init_shared_params(params, EASGD(0.5))
    print("SHARED", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        params[0] += 1.0
        w.sync_params()
        w.report(minibatches=1)
