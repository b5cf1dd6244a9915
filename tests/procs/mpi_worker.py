"""A worker of a multi-node test job (started by python -m platoon.mpi under mpiexec).

usage: mpi_worker.py SCENARIO
  collectives: all_reduce every op and dtype, checks exact results, barrier; prints OK
  shard: prints SHARD and its part of range(20) from platoon.shard(20, w, epoch=1)
  final: each node's centre starts apart, node 1 trains 0.5 s longer, then every worker calls
       final_evaluation (the centre's first value); the one that evaluates prints EVALUATED
  tie: starts its node's centre at +1 (node 0) or -1 (node 1), then all_reduces the centre
       until the node centres agree; prints TIED and the rounds it took
  forever: prints READY, then all_reduces until killed
  fail: worker 1 of node 1 exits with code 3 after a barrier; the others all_reduce forever
  mismatch: node 0 calls barrier while node 1 calls all_reduce; prints the error
  hang: prints READY; node 1's workers then stop (sleep 60 s) instead of the next all_reduce
  localfail: node 0's workers call all_reduce with different ops (its round fails there),
       node 1's agree; then everyone all_reduces ones: prints ROUND1 and ROUND2 results
  uneven: node 0's workers sync 20 times and leave; node 1's go on moving their parameters and
       syncing for 1.5 s more, so centre tie rounds run while only node 1 trains; prints LEFT
  lagging: linear regression toward known true weights, every worker starting from the same
       far point; node 0's workers converge and leave (after an all_reduce that node 1's workers
       wait in); node 1 lags: its workers idle for LAG seconds (argv[2], default 1.0) while tie
       rounds run, then converge too; each prints DIST (its distance to the true weights)
  stop: every worker syncs until it sees the stop signal, which global worker 0 requests after
       5 syncs; prints STOPPED <reason>
  chatty: prints CHATTY_LINES (argv[2], default 200) lines CHATTY node N worker K line I xxx...
       as fast as it can with print() (which writes the text and its newline apart)
"""

import os
import sys
import time

import numpy as np

import platoon
from platoon import EASGD, RemoteError, Worker, protocol

CASES = [(op, dt) for dt in ["float32", "float64", "int32", "int64", "uint8", "complex128"]
         for op in ["sum", "mean", "max", "min"]
         if not (op == "mean" and dt[0] in "iu") and not (op in ("max", "min") and dt[0] == "c")]


LINEAR_FEATURES = 20
# A pause after each sync in the loops that last a while (final, uneven, stop): what they
# check is the tie rounds and the stop signal between the nodes, not how fast four workers
# and two controllers can sync on two cores (spun, they took most of a core each)
PACE_S = 0.002


def contribution(k, dtype, shape=(5, 7)):
    base = np.arange(int(np.prod(shape))).reshape(shape) % 11 - 5
    values = base * (k + 1) + k  # small integers: exact in every dtype
    if np.dtype(dtype).kind == "c":
        return (values + 1j * (values - k)).astype(dtype)
    if np.dtype(dtype).kind == "u":
        return np.abs(values).astype(dtype)
    return values.astype(dtype)


def expected(op, dt, n):
    parts = [contribution(k, dt) for k in range(n)]
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return {"sum": total, "mean": total / np.array(n, dt), "max": np.maximum.reduce(parts),
            "min": np.minimum.reduce(parts)}[op].astype(dt)


def say(text):
    """One write per line: the workers of a node share one pipe, and print() writes in parts."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main():
    scenario = sys.argv[1]
    with Worker(timeout_s=30) as w:
        tag = "node %d worker %d (global %d of %d, pid %d)" % (
            w.node_rank, w.local_rank, w.global_rank, w.global_size, os.getpid())
        if scenario == "collectives":
            assert w.global_size == w.num_nodes * w.local_size, tag
            ranks = np.array([w.global_rank], np.int64)
            w.all_reduce(ranks, "sum")
            assert ranks[0] == sum(range(w.global_size)), (tag, ranks)
            for op, dt in CASES:
                got = w.all_reduce(contribution(w.global_rank, dt), op)
                want = expected(op, dt, w.global_size)
                assert got.dtype == want.dtype and np.array_equal(got, want), (tag, op, dt)
            w.barrier()
            say("OK " + tag)
        elif scenario == "shard":
            # The documented line: this worker's part of the job's data, on any node.
            say("SHARD %s %s" % (" ".join(map(str, platoon.shard(20, w, epoch=1))), tag))
        elif scenario == "final":
            # Node 0's centre starts at +1, node 1's at -1; node 1's workers sync for 0.5 s
            # longer; then every worker asks for the job's one final evaluation.
            params = [np.full(8, 1.0 if w.node_rank == 0 else -1.0)]
            w.init_shared_params(params, EASGD(0.5))
            until = time.monotonic() + (0.5 if w.node_rank == 1 else 0.0)
            while w.syncs < 10 or time.monotonic() < until:
                params[0] += 0.001
                w.sync_params()
                time.sleep(PACE_S)
            result = w.final_evaluation(lambda: {"centre": float(w.snapshot_centre()[0][0])})
            if result is not None:
                say("EVALUATED %r %s" % (result["centre"], tag))
        elif scenario == "tie":
            # Node 0's centre starts at +1, node 1's at -1; ties begin once both exist.
            params = [np.full(1000, 1.0 if w.node_rank == 0 else -1.0)]
            w.init_shared_params(params, EASGD(0.5))
            for i in range(2000):
                if len(sys.argv) > 2 and sys.argv[2] == "report":  # drives --tie-every-syncs
                    w.send_req(protocol.REPORT, {"minibatches": 0, "syncs": i + 1,
                                                 "metrics": {}})
                mine = np.array(w.shared_params[0][:1])
                spread = w.all_reduce(mine.copy(), "max") - w.all_reduce(mine, "min")
                if spread[0] < 1e-6:
                    break
            centre = float(w.shared_params[0][0])
            say("TIED %d spread %.3g centre %.9f %s" % (i, spread[0], centre, tag))
        elif scenario in ("forever", "fail"):
            buf = np.ones(1000)
            w.all_reduce(buf)
            say("READY " + tag)
            w.barrier()
            if scenario == "fail" and w.node_rank == 1 and w.local_rank == 1:
                sys.exit(3)
            while True:
                w.all_reduce(buf, "max")
        elif scenario == "mismatch":
            try:
                w.barrier() if w.node_rank == 0 else w.all_reduce(np.ones(3))
            except RemoteError as exc:
                say("MISMATCH " + str(exc).splitlines()[0])
        elif scenario == "hang":
            w.all_reduce(np.ones(3))
            say("READY " + tag)
            if w.node_rank == 1:
                time.sleep(60)  # a node that hangs, alive: node 0 must give up on it
            w.all_reduce(np.ones(3))
        elif scenario == "localfail":
            op = ("max" if w.local_rank == 0 else "sum") if w.node_rank == 0 else "sum"
            try:
                w.all_reduce(np.ones(3), op)
                say("ROUND1 ok " + tag)
            except RemoteError:
                say("ROUND1 error " + tag)
            say("ROUND2 %g %s" % (w.all_reduce(np.ones(3))[0], tag))
        elif scenario == "uneven":
            rng = np.random.default_rng(w.global_rank)
            params = [rng.normal(size=100).astype(np.float32), rng.normal(size=(3, 4))]
            w.init_shared_params(params, EASGD(0.5))
            until = time.monotonic() + 1.5
            while w.syncs < 20 or (w.node_rank == 1 and time.monotonic() < until):
                for p in params:
                    p += rng.normal(scale=0.1, size=p.shape).astype(p.dtype)
                w.sync_params()
                time.sleep(PACE_S)
            say("LEFT after %d syncs %s" % (w.syncs, tag))
        elif scenario == "lagging":
            true_w = np.arange(LINEAR_FEATURES) / LINEAR_FEATURES
            weights = np.random.default_rng(0).normal(size=LINEAR_FEATURES)  # same everywhere
            w.init_shared_params([weights], EASGD(0.5))
            data = np.random.default_rng(100 + w.global_rank)
            if w.node_rank == 1:
                w.all_reduce(np.ones(1))  # node 0's workers are done training
                time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)  # a slow node
            for _ in range(30):
                for _ in range(5):
                    x = data.normal(size=(32, LINEAR_FEATURES))
                    y = x @ true_w + 0.01 * data.normal(size=32)
                    weights -= 0.3 * x.T @ (x @ weights - y) / len(y)
                w.sync_params()
            if w.node_rank == 0:
                w.all_reduce(np.ones(1))
            say("DIST %.6f %s" % (float(np.linalg.norm(weights - true_w)), tag))
        elif scenario == "stop":
            params = [np.zeros(100)]
            w.init_shared_params(params, EASGD(0.5))
            while not w.stop_requested:
                params[0] += 1.0
                w.sync_params()
                if w.global_rank == 0 and w.syncs == 5:
                    w.request_stop("target reached")
                time.sleep(PACE_S)
            say("STOPPED %s %s" % (w.stop_reason, tag))
        elif scenario == "chatty":
            for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 200):
                print("CHATTY node %d worker %d line %d %s" % (w.node_rank, w.local_rank, i,
                                                               "x" * 200))
        else:
            raise SystemExit("unknown scenario %r" % scenario)


if __name__ == "__main__":
    main()
