"""Reports one minibatch every 0.1 s for about 3 s, so the launcher's status line moves."""

import time

import numpy as np

from platoon import EASGD, Worker

with Worker(timeout_s=30) as w:
    w.init_shared_params([np.zeros(10)], EASGD(0.5))
    for _ in range(30):
        time.sleep(0.1)  # the workload: progress spread over the run
        w.report(minibatches=1, loss=0.5)
