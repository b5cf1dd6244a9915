"""A worker for the segment-name tests: uses every kind of segment the controller makes
(the stop signal, the centre, a shared state, an all_reduce buffer), then syncs.

usage: segments_worker.py PORT
Prints "DONE <worker id> <all_reduce sum> <segment names>" at the end.
"""

import sys

import numpy as np

from platoon import EASGD, Worker


def main():
    with Worker(control_port=int(sys.argv[1]), timeout_s=20) as w:
        params = [np.full(4, float(w.worker_id))]
        w.init_shared_params(params, EASGD(0.5))
        state = w.shared_state("opt", [{"dtype": "<f8", "shape": [4]}])
        total = w.all_reduce(np.full(4, w.worker_id + 1.0), op="sum")
        for _ in range(3):
            params[0] += 1.0
            w.sync_params()
        w.barrier()
        assert state[0].shape == (4,)
        print("DONE %d %g" % (w.worker_id, total[0]), flush=True)


if __name__ == "__main__":
    main()
