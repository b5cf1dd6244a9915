"""A worker of the all_reduce meeting tests (tests/collectives/test_all_reduce_meeting.py).

usage: allreduce_worker.py PORT MODE
  rounds:  ROUNDS rounds of every case in CASES with the contributions of `contribution`,
           worker 1 late now and then (by less than the compiled meeting's busy poll, or by
           more than its whole poll); prints "PATH compiled|python" (how this worker met the
           others) and "DIGEST <sha256 of every result, in order>"
  forever: one round, prints READY, then all_reduces (no timeout) until one fails; prints
           "RAISED <type>: <message>"
  late:    worker 1 starts its one round 1 s late; worker 0 prints "WAITED <wall s> <cpu s>"
           (the time its round took, and the CPU time it used meanwhile)
"""

import hashlib
import sys
import threading
import time

import numpy as np

from platoon import Worker

ROUNDS = 120
# (op, dtype, shape): the compiled float sum and mean (blocks of 2048 elements, a remainder,
# a single element, a non-contiguous input), and ops and dtypes that numpy reduces.
CASES = [("sum", "float32", (1000,)), ("mean", "float64", (5000,)), ("sum", "float32", (1,)),
         ("sum", "float64", (3, 7)), ("max", "int32", (100,)), ("mean", "float32", (4097,))]


def contribution(worker_id, rnd, case):
    """Worker `worker_id`'s array in round `rnd` of `case`: random floats, so that the order
    of the additions shows in the bits."""
    op, dtype, shape = CASES[case]
    rng = np.random.default_rng([worker_id, rnd, case])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def main():
    port, mode = int(sys.argv[1]), sys.argv[2]
    with Worker(port, timeout_s=30) as w:
        me = w.worker_id
        if mode == "rounds":
            digest = hashlib.sha256()
            rng = np.random.default_rng(100 + me)
            for rnd in range(ROUNDS):
                for case, (op, _, _) in enumerate(CASES):
                    if me == 1 and rng.random() < 0.1:  # a late worker: both waiting paths
                        threading.Event().wait(rng.choice([20e-6, 5e-3]))
                    a = contribution(me, rnd, case)
                    if case == 3:  # non-contiguous input, into a separate out
                        out = np.empty(a.shape, a.dtype)
                        wide = np.zeros((a.shape[0], 2 * a.shape[1]), a.dtype)
                        wide[:, ::2] = a
                        w.all_reduce(wide[:, ::2], op, out=out)
                    else:
                        out = w.all_reduce(a, op)
                    digest.update(out.tobytes())
            compiled = all(buf.meeting is not None for buf in w._coll.reductions.values())
            print("PATH %s" % ("compiled" if compiled else "python"), flush=True)
            print("DIGEST %s" % digest.hexdigest(), flush=True)
        elif mode == "forever":
            a = np.ones(1000, np.float32)
            w.all_reduce(a)
            print("READY %d" % me, flush=True)
            try:
                while True:
                    w.all_reduce(a, timeout_s=None)
            except Exception as exc:
                print("RAISED %s: %s" % (type(exc).__name__, exc), flush=True)
                raise
        elif mode == "late":
            a = np.ones(1000, np.float32)
            w.all_reduce(a)  # both are up
            if me == 1:
                threading.Event().wait(1.0)  # the late peer (not a synchronisation)
            wall, cpu = time.monotonic(), time.process_time()
            w.all_reduce(a)
            if me == 0:
                print("WAITED %.4f %.4f" % (time.monotonic() - wall, time.process_time() - cpu),
                      flush=True)


if __name__ == "__main__":
    main()
