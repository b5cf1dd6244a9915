"""Worker 1 closes, then lingers 40 s as if stuck in teardown; the others just finish."""

import time

import numpy as np

from platoon import EASGD, Worker
from platoon._os.environment import JobEnvironment

with Worker(timeout_s=30) as w:
    w.init_shared_params([np.zeros(10)], EASGD(0.5))
    w.sync_params()
if JobEnvironment.read().worker_index == 1:
    print("LINGERING after close()", flush=True)
    time.sleep(40)  # the workload under test: the launcher must not wait for it
