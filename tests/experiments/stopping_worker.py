"""Workers train until one of them (worker 0, after 20 syncs) asks the job to stop."""

import numpy as np

from platoon import EASGD, Worker

params = [np.zeros(100)]
with Worker(timeout_s=30) as w:
    w.init_shared_params(params, EASGD(0.5))
    while not w.stop_requested:
        params[0] += 0.1
        w.sync_params()
        if w.worker_id == 0 and w.syncs == 20:
            w.request_stop("target reached")
    print("worker %d stopped after %d syncs: %s" % (w.worker_id, w.syncs, w.stop_reason),
          flush=True)
