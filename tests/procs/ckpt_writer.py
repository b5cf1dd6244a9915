"""A controller of job JOB_ID that writes checkpoints of a 64 MiB centre to PATH, one after
another, until killed (the test SIGKILLs it mid-write); prints WRITTEN once the first is
written; gives up by itself after 60 s.

usage: ckpt_writer.py PATH JOB_ID
"""

import sys
import threading
import time

import numpy as np

from platoon import EASGD, Controller, Worker

path, job_id = sys.argv[1], sys.argv[2]
with Controller(control_port=0, job_id=job_id, checkpoint_path=path) as ctl:
    threading.Thread(target=ctl.serve, kwargs={"timeout_s": 60}, daemon=True).start()
    with Worker(ctl.control_port, timeout_s=60) as w:
        w.init_shared_params([np.ones(16 << 20, np.float32)], EASGD(0.5))
        ctl.checkpoint()
        print("WRITTEN", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ctl.checkpoint()
