"""Sync throughput against numpy's copy, the numpy path and the naive formula; syncs/s with
concurrent workers."""

import os

import numpy as np

from platoon import EASGD
from platoon._centre.shmem import SharedCentre
from platoon._worker.exchange import Exchange
from platoon.protocol import layout_of
from platoon.rules import kernels
from platoon.rules.downpour import SGD, Downpour

from ._util import Children, best_time, interleaved

ALPHA = 0.5


def _values(n, seed, dtype=np.float32):
    # In [1, 2): EASGD's differences stay normal floats however often it runs (no denormals).
    return np.random.default_rng(seed).random(n, dtype=dtype) + 1


def naive_easgd(x, c, alpha=ALPHA):
    d = alpha * (x - c)
    x -= d
    c += d


def compute_loop(seconds):
    """A function that computes (small float32 matrix products, not touching the parameters)
    for about `seconds`: the work a worker overlaps with its sync."""
    a = _values(64 * 64, 7).reshape(64, 64)
    out = np.empty_like(a)

    def step():
        np.dot(a, a, out=out)

    one = best_time(step, 5, 20)
    count = max(1, round(seconds / one))

    def loop():
        for _ in range(count):
            np.dot(a, a, out=out)
    return loop


def sync_throughput(n, rounds, dtype="float32", overlap=False):
    """GB/s of platoon's EASGD sync of n elements of `dtype` (counted as 4x the parameter
    bytes: x and c read and written once) against a numpy copy of x (counted as 2x: read
    and written), alternated in one run, best of `rounds`. Also the same sync by the numpy
    path (no compiled kernels), start_sync+wait without a snapshot (`async_live_gbs`) and
    with one (`async_gbs`), and (up to 10M) the naive formula. With `overlap`, also a
    compute loop about as long as the sync alone, and start_sync, that loop, wait, without
    and with a snapshot: the fraction of the sync hidden is
    1 - (that - the loop) / the sync (`hidden_live`, `hidden`)."""
    dtype = np.dtype(dtype)
    x = _values(n, 1, dtype)
    centre = SharedCentre.create("bench%d%s" % (os.getpid(), os.urandom(4).hex()),
                                 layout_of([x]))
    try:
        c = centre.arrays[0]
        c[...] = _values(n, 2, dtype)
        y = np.empty_like(x)
        rule = EASGD(ALPHA)
        rule.setup([x])
        ex = Exchange(rule, [x], centre, timeout_s=60)

        def start_wait():
            ex.start().wait()

        def start_wait_live():
            ex.start(snapshot=False).wait()

        def numpy_path():
            with kernels.numpy_only():
                ex.sync()

        fns = [lambda: np.copyto(y, x), ex.sync, start_wait_live, start_wait, numpy_path]
        number = max(1, 4_000_000 // n)
        if overlap:
            compute = compute_loop(best_time(ex.sync, 3, number))

            def overlapped():
                handle = ex.start()
                compute()
                handle.wait()

            def overlapped_live():
                handle = ex.start(snapshot=False)
                compute()
                handle.wait()
            fns += [compute, overlapped_live, overlapped]
        xn = cn = None
        if n <= 10_000_000:  # its temporaries would need 4 more arrays at 100M
            xn, cn = x.copy(), c.copy()
            fns.append(lambda: naive_easgd(xn, cn))
        times = interleaved(fns, rounds, number)
        t_copy, t_sync, t_live, t_async, t_numpy = times[:5]
        t_naive = times[-1] if xn is not None else None
        nbytes = x.nbytes
        extra = {}
        if overlap:
            t_compute, t_overlapped_live, t_overlapped = times[5:8]
            extra = {"compute_ms": t_compute * 1e3, "overlapped_ms": t_overlapped * 1e3,
                     "hidden": 1 - (t_overlapped - t_compute) / t_sync,
                     "overlapped_live_ms": t_overlapped_live * 1e3,
                     "hidden_live": 1 - (t_overlapped_live - t_compute) / t_sync}
        return {**extra, "n": n, "dtype": dtype.name, "stripes": len(centre.stripes),
                "compiled": kernels.available(),
                "copy_gbs": 2 * nbytes / t_copy / 1e9,
                "sync_gbs": 4 * nbytes / t_sync / 1e9, "async_gbs": 4 * nbytes / t_async / 1e9,
                "async_live_gbs": 4 * nbytes / t_live / 1e9,
                "numpy_path_gbs": 4 * nbytes / t_numpy / 1e9,
                "naive_gbs": 4 * nbytes / t_naive / 1e9 if t_naive else None,
                "sync_ms": t_sync * 1e3,
                "mean_hold_ms": ex.stats.lock_hold_s / max(ex.stats.syncs, 1) * 1e3,
                "max_stripe_hold_ms": ex.stats.max_hold_s * 1e3}
    finally:
        centre.close()
        centre.unlink()


MLP_SHAPES = [(64, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,)]  # digits MLP


def downpour_lock_hold(rounds=5, syncs=20):
    """Mean lock hold per sync (ms) of Downpour(SGD(0.2, momentum 0.9, Nesterov)) and
    EASGD(0.5) on the digits MLP 64-1024-1024-10 (1.1M float32), one worker, best of
    `rounds` interleaved rounds of `syncs` syncs. The worker steps between syncs."""
    params = [_values(int(np.prod(s)), i).reshape(s) for i, s in enumerate(MLP_SHAPES)]
    steps = [(_values(p.size, 50 + i).reshape(p.shape) - 1.5) * 1e-3
             for i, p in enumerate(params)]
    rules = {"easgd": EASGD(ALPHA), "downpour": Downpour(SGD(0.2, 0.9, nesterov=True))}
    runs, centres = {}, []
    try:
        for name, rule in rules.items():
            local = [p.copy() for p in params]
            centre = SharedCentre.create("bench%d%s" % (os.getpid(), os.urandom(4).hex()),
                                         layout_of(local))
            centres.append(centre)
            for c, p in zip(centre.arrays, local):
                c[...] = p
            rule.check(local)
            if name == "downpour":  # stands in for the shared state Worker.attach would map
                rule.state = [np.zeros_like(p) for p in local]
            rule.setup(local)
            runs[name] = (Exchange(rule, local, centre, timeout_s=60), local)
        best = {name: float("inf") for name in rules}
        for _r in range(rounds):
            for name, (ex, local) in runs.items():
                ex.stats.__init__()
                for k in range(syncs):
                    for p, d in zip(local, steps):
                        if k % 2:
                            p -= d
                        else:
                            p += d
                    ex.sync()
                best[name] = min(best[name], ex.stats.mean_hold_s)
        ex = runs["downpour"][0]
        return {"n": sum(p.size for p in params), "stripes": len(ex.centre.stripes),
                "downpour_striped": bool(ex._striped),
                "downpour_hold_ms": best["downpour"] * 1e3,
                "easgd_hold_ms": best["easgd"] * 1e3}
    finally:
        for centre in centres:
            centre.close()
            centre.unlink()


def concurrent_syncs(n, workers, duration_s, kind="stripes"):
    """Aggregate syncs/s of `workers` processes syncing one centre of n float32 for duration_s.

    kind: "stripes" (platoon), "one_lock" (one lock around the whole sync, as
    before stripes), or "copy" (each process copies 2 arrays of n float32 instead
    of syncing: the machine's ceiling for memory-bound work in parallel).
    """
    layout = layout_of([np.zeros(n, np.float32)])
    centre = SharedCentre.create("bench%d%s" % (os.getpid(), os.urandom(4).hex()), layout)
    try:
        centre.arrays[0][...] = _values(n, 3)
        with Children() as children:
            procs = [children.start("syncer", centre.name, n, k, duration_s, kind)
                     for k in range(workers)]
            for p in procs:
                p.line("READY")
            for p in procs:
                p.send("go")
            results = [[float(v) for v in p.line("RESULT", timeout=duration_s + 60)]
                       for p in procs]
            for p in procs:
                p.wait(30)
    finally:
        centre.close()
        centre.unlink()
    syncs = sum(r[0] for r in results)
    return {"workers": workers, "kind": kind,
            "syncs_per_s": sum(r[0] / r[1] for r in results),
            "mean_hold_ms": sum(r[2] for r in results) / syncs * 1e3,
            "mean_wait_ms": sum(r[3] for r in results) / syncs * 1e3}


def syncer(segment, n, worker_id, duration_s, kind):
    """Child: sync as often as possible for duration_s after 'go' on stdin."""
    import sys
    import time
    n, worker_id, duration_s = int(n), int(worker_id), float(duration_s)
    x = _values(n, 10 + worker_id)
    centre = SharedCentre.attach(segment, layout_of([x]))
    rule = EASGD(ALPHA)
    if kind == "one_lock":
        rule.elementwise = False  # one lock around the whole centre, as before stripes
    ex = Exchange(rule, [x], centre, worker_id=worker_id, timeout_s=60)
    ex.sync()
    if kind == "copy":  # as much memory traffic as a sync: read 2 arrays, write 2
        y, z, c2 = np.empty_like(x), np.empty_like(x), x + 1

        def step():
            np.copyto(y, x)
            np.copyto(z, c2)
        ex.sync = step
    ex.stats.__init__()
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    count = 0
    while time.perf_counter() - start < duration_s:
        ex.sync()
        count += 1
    elapsed = time.perf_counter() - start
    print("RESULT %d %.6f %.6f %.6f" % (count, elapsed, ex.stats.lock_hold_s,
                                        ex.stats.lock_wait_s), flush=True)
    centre.close()
