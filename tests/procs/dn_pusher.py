"""A DelayedNesterov worker that pushes g = STEP (exactly) over and over, for kill tests.

usage: dn_pusher.py PORT ORDER SYNCS
  ORDER  C or F: the memory order of the worker's parameter array
  SYNCS  how many syncs; 0: until killed (exits by itself after 60 s)
Prints READY after its first sync and DONE after the last. Each round takes the centre
(x = c) and moves by -STEP, so every push carries g = c - (c - STEP) = STEP: the values
stay on a dyadic grid where that is exact.
"""

import sys
import time

import numpy as np

from platoon import DelayedNesterov, Worker

SHAPE = (1000, 2000)  # 16 MB of float64: several stripes, each of several blocks
STEP = 0.015625  # 2**-6
LR, MOMENTUM, DELAY = 0.5, 0.5, 4


def main():
    port, order, syncs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    params = [np.zeros(SHAPE, order=order)]
    with Worker(control_port=port, timeout_s=30) as w:
        w.init_shared_params(params, DelayedNesterov(LR, MOMENTUM, delay=DELAY))
        deadline = time.monotonic() + 60
        done = 0
        while (done < syncs or not syncs) and time.monotonic() < deadline:
            params[0] -= STEP
            w.sync_params()
            done += 1
            if done == 1:
                print("READY", flush=True)
        print("DONE %d" % done, flush=True)


if __name__ == "__main__":
    main()
