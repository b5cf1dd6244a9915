"""A worker of an elastic job (python -m platoon.elastic.node ... -- THIS_FILE SECONDS [STOP
[FEATURES]]): SGD on a linear regression toward known true weights (FEATURES float32 features,
default 256: another number is another model), EASGD with its
node's centre, for SECONDS seconds of training (less if file STOP exists); its data is picked
by its node's name (PLATOON_ELASTIC_NODE). Prints "TORCH LOADED True" when it found torch
imported (its node forked it: `platoon.node.prefork`; it imports none itself), "DISTRIBUTED
none" (or the MPI/torchrun rank variables it sees), "SHARD i j ..." (its part of 12 items,
`platoon.shard`) or "SHARD refused: why", "SYNCS k" after every 50th sync, and "DIST d node
NAME" (its distance to the true weights). With ELASTIC_WORKER_EVALUATE=1 in its environment
it then evaluates the job's final centre (`Worker.final_evaluation`: its distance to the true
weights, "dist")."""

import os
import sys
import time
import zlib

import numpy as np

from platoon import EASGD, Worker, shard
from platoon._os.environment import DISTRIBUTED_PREFIXES, DISTRIBUTED_VARIABLES

FEATURES = 256
TORCH_LOADED = "torch" in sys.modules  # (none of the imports above imports it)


def main():
    seconds = float(sys.argv[1])
    features = int(sys.argv[3]) if len(sys.argv) > 3 else FEATURES
    node = os.environ["PLATOON_ELASTIC_NODE"]
    ranks = sorted(k for k in os.environ
                   if k.startswith(DISTRIBUTED_PREFIXES) or k in DISTRIBUTED_VARIABLES)
    print("TORCH LOADED %s" % TORCH_LOADED, flush=True)
    print("DISTRIBUTED %s" % (",".join(ranks) or "none"), flush=True)
    true_w = (np.arange(features) / features).astype(np.float32)
    with Worker(timeout_s=30) as w:
        try:
            print("SHARD %s" % " ".join(map(str, shard(12, w))), flush=True)
        except ValueError as exc:
            print("SHARD refused: %s" % exc, flush=True)
        weights = np.random.default_rng(0).normal(size=features).astype(np.float32)
        w.init_shared_params([weights], EASGD(0.5))
        assert w.start_together() is False  # as PeriodicSync does: no barrier across nodes
        data = np.random.default_rng(zlib.crc32(node.encode()) + w.local_rank)
        end = time.monotonic() + seconds
        stop = sys.argv[2] if len(sys.argv) > 2 else None
        syncs = 0
        while time.monotonic() < end and not (stop and os.path.exists(stop)):
            for _ in range(5):
                x = data.normal(size=(64, features)).astype(np.float32)
                y = x @ true_w + np.float32(0.01) * data.normal(size=64).astype(np.float32)
                weights -= np.float32(0.05) * (x.T @ (x @ weights - y)) / np.float32(len(y))
            w.sync_params()
            syncs += 1
            if syncs % 50 == 0:
                print("SYNCS %d" % syncs, flush=True)
            time.sleep(0.01)
        sys.stdout.write("DIST %.6f node %s\n" % (float(np.linalg.norm(weights - true_w)), node))
        sys.stdout.flush()
        if os.environ.get("ELASTIC_WORKER_EVALUATE"):
            w.final_evaluation(lambda: {"dist": float(np.linalg.norm(
                w.snapshot_centre()[0] - true_w))})


if __name__ == "__main__":
    main()
