"""The second worker to register crashes after the centre exists; the first waits at a barrier."""

import numpy as np

from platoon import EASGD, Worker

with Worker(timeout_s=30) as w:
    w.init_shared_params([np.zeros(10)], EASGD(0.5))
    if w.worker_id == 1:
        raise RuntimeError("deliberate crash in worker 1")
    w.barrier()
