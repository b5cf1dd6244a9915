"""Feeds 40 minibatches, then stops the job; never counts progress itself."""

import threading

import numpy as np

from platoon import Controller

with Controller() as ctl:
    ctl.init_data()

    def feed():
        for i in range(40):
            ctl.send_mb([np.full(4, i, np.float64)], timeout_s=30)
        ctl.flush_mb(timeout_s=30)  # every minibatch taken, and synced
        ctl.request_stop("fed every minibatch")

    threading.Thread(target=feed, name="feeder", daemon=True).start()
    ctl.serve()
