"""A worker for tests/gpu/test_gpu_registered.py: syncs a CUDA float32 tensor through the
registered centre (PLATOON_REGISTERED_CENTRE=require) in a loop until killed; exits by itself
after 60 s so nothing outlives a broken test.

usage: registered_worker.py PORT   prints "READY <worker_id>", then "SYNCING" after 3 syncs
"""

import os
import sys
import time

import torch

from platoon import EASGD, Worker

os.environ["PLATOON_REGISTERED_CENTRE"] = "require"
x = torch.zeros(32 * 2**20, device="cuda")  # 128 MiB: 64 stripes, a sync lasts milliseconds
with Worker(int(sys.argv[1]), timeout_s=60) as w:
    w.init_shared_params([x], EASGD(0.5))
    assert w._exchange.device is not None  # noqa: SLF001
    print("READY %d" % w.worker_id, flush=True)
    deadline, syncs = time.monotonic() + 60, 0
    while time.monotonic() < deadline:
        x += 1.0
        w.sync_params()
        syncs += 1
        if syncs == 3:
            print("SYNCING", flush=True)
