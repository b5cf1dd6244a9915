"""A worker for DiLoCo-family tests: adds a fixed step to its parameters, then pushes.

usage: outer_worker.py PORT ROUNDS MODE DELAY
  MODE  sync: sync_params(); async: start_sync().wait() (the push runs in the background
        thread, stripe by stripe)
Each round: p += STEP, then one sync, so every push carries g = -STEP (up to rounding).
DELAY is DelayedNesterov's N.
"""

import sys

import numpy as np

from platoon import DelayedNesterov, Worker

# About 16 MiB of float64: several stripes, one of them spanning both parameters.
SHAPES = [(1200, 1000), (800_003,)]
STEP = 0.015625  # 2**-6
LR, MOMENTUM = 0.5, 0.9


def main():
    port, rounds, mode, delay = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    params = [np.zeros(shape) for shape in SHAPES]
    with Worker(control_port=port, timeout_s=30) as w:
        w.init_shared_params(params, DelayedNesterov(LR, MOMENTUM, delay=delay))
        w.barrier()
        for _ in range(rounds):
            for p in params:
                p += STEP
            if mode == "sync":
                w.sync_params()
            else:
                w.start_sync().wait(timeout_s=30)
        print("DONE %d %d" % (w.worker_id, w.syncs), flush=True)


if __name__ == "__main__":
    main()
