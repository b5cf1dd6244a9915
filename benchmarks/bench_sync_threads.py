"""The host update on several cores, and what a default start_sync() costs the caller.

usage: python -m benchmarks.bench_sync_threads [--sizes 1e7,1e8] [--rounds 5]

Per size (float32), alternated in one run, best of --rounds:
- the limit: numpy copy of x (GB/s counted as 2x the bytes: read and written), and the
  same copy split over the threads (what memory gives several cores);
- EASGD sync_params's host update (counted as 4x: x and c read and written) on 1 thread and on
  every core this process may use (PLATOON_SYNC_THREADS), each as a ratio to the copy;
- start_sync()+wait() with nothing to overlap: the default (measured path) and snapshot=True,
  each as a ratio of sync_params' time (the default must stay near 1.0x).
Run it on a quiet machine: other work on the cores makes every figure meaningless.
"""

import argparse
import os
import threading
import time

import numpy as np

from platoon import EASGD
from platoon._centre.shmem import SharedCentre
from platoon._worker.exchange import Exchange, default_sync_threads
from platoon.protocol import layout_of

from ._util import interleaved

ALPHA = 0.5


def exchange_with_threads(threads, x, centre):
    """An EASGD Exchange of `x` whose syncs use `threads` threads."""
    before = os.environ.get("PLATOON_SYNC_THREADS")
    os.environ["PLATOON_SYNC_THREADS"] = str(threads)
    try:
        return Exchange(EASGD(ALPHA), [x], centre, timeout_s=60)
    finally:
        if before is None:
            del os.environ["PLATOON_SYNC_THREADS"]
        else:
            os.environ["PLATOON_SYNC_THREADS"] = before


def split_copy(dst, src, threads):
    """np.copyto over `threads` threads, one slice each (numpy releases the GIL)."""
    bounds = np.linspace(0, src.size, threads + 1).astype(int)
    parts = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b]))
             for a, b in zip(bounds[:-1], bounds[1:])]
    for t in parts:
        t.start()
    for t in parts:
        t.join()


def measure(n, rounds, threads):
    x = np.random.default_rng(1).random(n, dtype=np.float32) + 1
    centre = SharedCentre.create("benchthr%d%s" % (os.getpid(), os.urandom(4).hex()),
                                 layout_of([x]))
    try:
        centre.arrays[0][...] = np.random.default_rng(2).random(n, dtype=np.float32) + 1
        y = np.empty_like(x)
        one, many = exchange_with_threads(1, x, centre), exchange_with_threads(threads, x, centre)

        def default_start_wait():  # Worker.start_sync() on numpy arrays (no device copies)
            choice, began = many.overlap, time.perf_counter()
            if choice.choose() == choice.AT_ONCE:
                many.sync()
                choice.record(choice.AT_ONCE, time.perf_counter() - began)
            else:
                many.start(choice=choice, began=began).wait()

        fns = [lambda: np.copyto(y, x), lambda: split_copy(y, x, threads), one.sync, many.sync,
               default_start_wait, lambda: many.start().wait()]
        number = max(1, 40_000_000 // n)
        t_copy, t_split, t_one, t_many, t_default, t_snapshot = interleaved(fns, rounds, number)
        one.close(5.0)
        many.close(5.0)
        gb = x.nbytes / 1e9
        return {"n": n, "stripes": len(centre.stripes), "threads": threads,
                "copy_gbs": 2 * gb / t_copy, "split_copy_gbs": 2 * gb / t_split,
                "sync_1_gbs": 4 * gb / t_one, "sync_n_gbs": 4 * gb / t_many,
                "default_vs_sync": t_default / t_many, "snapshot_vs_sync": t_snapshot / t_many}
    finally:
        centre.close()
        centre.unlink()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e7,1e8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of the several-core sync (default: every core allowed)")
    args = parser.parse_args(argv)
    threads = args.threads or default_sync_threads()
    print("| float32 | stripes | numpy copy | copy on %d threads | sync, 1 thread (vs copy) | "
          "sync, %d threads (vs copy; vs 1 thread) | default start_sync+wait vs sync | "
          "start_sync(snapshot=True)+wait vs sync |" % (threads, threads))
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(float(s)) for s in args.sizes.split(",")):
        r = measure(n, args.rounds, threads)
        print("| %.0e | %d | %.1f GB/s | %.1f GB/s | %.1f GB/s (%.2fx) | %.1f GB/s (%.2fx; %.2fx) "
              "| %.2fx | %.2fx |" % (
                  n, r["stripes"], r["copy_gbs"], r["split_copy_gbs"], r["sync_1_gbs"],
                  r["sync_1_gbs"] / r["copy_gbs"], r["sync_n_gbs"], r["sync_n_gbs"] / r["copy_gbs"],
                  r["sync_n_gbs"] / r["sync_1_gbs"], r["default_vs_sync"], r["snapshot_vs_sync"]),
              flush=True)


if __name__ == "__main__":
    main()
