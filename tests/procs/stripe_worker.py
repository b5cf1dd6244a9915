"""A worker for stripe tests: adds 1 to every parameter each round and syncs, freely.

usage: stripe_worker.py PORT ROUNDS MODE RULE OUT
  MODE  sync: p += 1, then sync_params()
        async: start_sync(), p += 1 while it is in flight, then wait()
  RULE  easgd (alpha 0.5) or asgd
Ends with one sync_params(), so every local change has reached the centre under ASGD.
"""

import sys

import numpy as np

from platoon import ASGD, EASGD, Worker

# About 14 MiB: 14 stripes, one of them spanning both parameters.
SHAPES = [((1500, 1000), np.float64), ((500_000,), np.float32)]


def main():
    port, rounds, mode, rule_name, out = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                          sys.argv[4], sys.argv[5])
    params = [np.zeros(shape, dtype) for shape, dtype in SHAPES]
    rule = EASGD(0.5) if rule_name == "easgd" else ASGD()
    with Worker(control_port=port, timeout_s=20) as w:
        w.init_shared_params(params, param_sync_rule=rule)
        w.barrier()
        for _ in range(rounds):
            if mode == "sync":
                for p in params:
                    p += 1
                w.sync_params()
            else:
                handle = w.start_sync()
                for p in params:
                    p += 1
                handle.wait()
        w.sync_params()
        np.savez(out % w.worker_id, *params)
        print("DONE %d %r" % (w.worker_id, w.sync_stats), flush=True)


if __name__ == "__main__":
    main()
