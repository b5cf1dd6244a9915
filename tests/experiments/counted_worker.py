"""Syncs once per minibatch until the job stops; never calls w.report."""

import numpy as np

from platoon import EASGD, Worker

with Worker(timeout_s=30) as w:
    params = [np.zeros(100)]
    w.init_shared_params(params, EASGD(0.5))
    w.init_mb_sock()
    while True:
        (batch,) = w.recv_mb(timeout_s=30)
        params[0] += batch.mean()
        w.sync_params()
