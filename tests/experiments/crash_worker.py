"""Worker 1 crashes once after the centre exists (its replacement, which gets id 1 again,
does not); the others wait at a barrier. Runs in the test's temporary directory."""

import os

import numpy as np

from platoon import EASGD, Worker

with Worker(timeout_s=30) as w:
    w.init_shared_params([np.zeros(10)], EASGD(0.5))
    if w.worker_id == 1 and not os.path.exists("worker1-crashed"):
        open("worker1-crashed", "w").close()
        raise RuntimeError("deliberate crash in worker 1")
    w.barrier()
