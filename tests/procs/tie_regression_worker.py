"""A worker of a multi-node linear regression (python -m platoon.mpi ... -- THIS_FILE SYNCS [nan]
[rounds=N]):
SGD toward known true weights (256 float32 features: one block of the int8 and int4 codecs),
EASGD with its node's centre, which the centre tie links to the other node's.

Every worker starts from the same far point and trains on data of its own for SYNCS syncs
(argv[1], default 40), 5 steps each; prints "DIST d" (its distance to the true weights).
With "nan", node 1's worker 0 diverges (a NaN in its weights, hence in its node's centre)
after 10 syncs. With "rounds=N" it trains on until its node's tie has run N rounds (asked of
centre_controller.py; for at most 30 s), so that however fast the job, rounds cross the link
in the tie's codec.
"""

import sys
import time

import numpy as np

from platoon import EASGD, Worker

FEATURES = 256


def main():
    syncs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    true_w = (np.arange(FEATURES) / FEATURES).astype(np.float32)
    with Worker(timeout_s=30) as w:
        weights = np.random.default_rng(0).normal(size=FEATURES).astype(np.float32)
        w.init_shared_params([weights], EASGD(0.5))
        data = np.random.default_rng(100 + w.global_rank)
        diverges = "nan" in sys.argv[2:] and w.node_rank == 1 and w.local_rank == 0
        min_tie_rounds = max([int(arg[7:]) for arg in sys.argv[2:] if arg.startswith("rounds=")],
                             default=0)

        def train_and_sync():
            for _ in range(5):
                x = data.normal(size=(64, FEATURES)).astype(np.float32)
                y = x @ true_w + np.float32(0.01) * data.normal(size=64).astype(np.float32)
                weights[...] -= np.float32(0.1) * (x.T @ (x @ weights - y)) / np.float32(len(y))
            w.sync_params()

        for i in range(syncs):
            if diverges and i == 10:
                weights[7] = np.nan
                sys.stdout.write("DIVERGED node 1 worker 0\n")
                sys.stdout.flush()
            train_and_sync()
        deadline = time.monotonic() + 30
        while min_tie_rounds and w.send_req("tie_rounds") < min_tie_rounds \
                and time.monotonic() < deadline:
            train_and_sync()
        sys.stdout.write("DIST %.6f node %d worker %d\n" % (
            float(np.linalg.norm(weights - true_w)), w.node_rank, w.local_rank))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
