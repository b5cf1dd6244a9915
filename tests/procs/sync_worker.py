"""A worker for tests: applies known local changes and syncs, in turn or freely.

usage: sync_worker.py PORT NUM_WORKERS ROUNDS MODE RULE OUT
  MODE  ordered: in each round workers sync one after another, in worker-id order (barriers)
        free: every worker syncs whenever it likes
  RULE  easgd (alpha 0.5) or asgd
The local change of worker k in round r is local_delta(k, r) (tests/procs/shared_math.py).
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_math import initial_params, local_delta  # noqa: E402

from platoon import ASGD, EASGD, Worker  # noqa: E402


def main():
    port, num_workers, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mode, rule_name, out = sys.argv[4], sys.argv[5], sys.argv[6]
    dtype = np.float32 if mode == "ordered" else np.float64
    params = initial_params(dtype)
    rule = EASGD(0.5) if rule_name == "easgd" else ASGD()
    with Worker(control_port=port, timeout_s=20) as w:
        w.init_shared_params(params, param_sync_rule=rule)
        w.barrier()  # every worker starts from the same centre
        for r in range(rounds):
            for p, d in zip(params, local_delta(w.worker_id, r, dtype)):
                p += d
            if mode == "ordered":
                for turn in range(num_workers):
                    if turn == w.worker_id:
                        w.sync_params()
                    w.barrier()
            else:
                w.sync_params()
                w.send_req("step")
        np.savez(out % w.worker_id, *params)
        print("DONE %d" % w.worker_id, flush=True)


if __name__ == "__main__":
    main()
