"""Soak-test worker: STEPS rounds of a local change, an ASGD sync and a control request;
then reports its total change. Any lost reply raises (and the exit code says so).

usage: soak_worker.py PORT STEPS
"""

import sys

import numpy as np

from platoon import ASGD, Worker

SIZE = 64

port, steps = int(sys.argv[1]), int(sys.argv[2])
with Worker(port, timeout_s=30) as w:
    params = [np.zeros(SIZE)]
    w.init_shared_params(params, ASGD())
    w.barrier(timeout_s=120)  # the last of 16 workers' imports, on 2 cores
    rng = np.random.default_rng(w.worker_id)
    total = np.zeros(SIZE)
    for _i in range(steps):
        change = rng.normal(size=SIZE)
        params[0] += change
        total += change
        w.sync_params()
        assert isinstance(w.send_req("step"), int)
    w.send_req("total", total.tolist())
