"""Worker of the linear-regression example: SGD on its own data, EASGD with the centre.

Run by hand (several times):  python linear_worker.py --port 5567
"""

import argparse
import os

import numpy as np

from platoon import EASGD, Worker

FEATURES = 20


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("PLATOON_CONTROL_PORT", 5567)))
    parser.add_argument("--sync-every", type=int, default=10, help="minibatches between syncs")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    with Worker(control_port=args.port) as w:
        rng = np.random.default_rng(w.worker_id)
        true_w = np.arange(FEATURES, dtype=np.float32) / FEATURES
        weights = rng.normal(size=FEATURES).astype(np.float32)
        w.init_shared_params([weights], param_sync_rule=EASGD(alpha=0.5))
        while w.send_req("next") == "train":
            for _ in range(args.sync_every):
                x = rng.normal(size=(32, FEATURES)).astype(np.float32)
                y = x @ true_w + 0.01 * rng.normal(size=32).astype(np.float32)
                grad = x.T @ (x @ weights - y) / len(y)
                weights -= args.lr * grad
            w.sync_params()
            w.send_req("done", {"n": args.sync_every})
        print("worker %d: distance to the true weights %.4f"
              % (w.worker_id, float(np.linalg.norm(weights - true_w))))


if __name__ == "__main__":
    main()
