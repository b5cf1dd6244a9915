"""Syncing CUDA float32 parameters: the staging path and the registered centre against the
pinned-copy limit, and what start_sync hides behind GPU compute.

usage: python -m benchmarks.bench_gpu_sync [--sizes 1e7,1e8,1e9] [--reps 5]

Per size, medians of --reps after one warm-up (the GPU synchronised around each call):
- limit: pinned copy_ device->host, host->device, and both at once on two streams;
- staging (PLATOON_REGISTERED_CENTRE=0): pull (D2H into pinned staging), the host update
  (on 1 thread and on the default threads), push (H2D), the whole sync_params;
- registered (PLATOON_REGISTERED_CENTRE=require): the library's registered centre, whose
  sync_params copies each stripe of the centre's registered shared memory in on a copy
  stream, updates it on the GPU, copies it back and releases its lock once the copy back
  has landed; skipped, saying why, where CUDA refuses the registration;
- start_sync: the share of a sync hidden behind a loop of matrix products as long as it,
  on the path the worker takes by default (registered where CUDA allows).
Ratios are to the limit (D2H + H2D: a sync must move the parameters both ways).
Exits 0 saying so where there is no CUDA GPU.
"""

import argparse
import os
import statistics
import sys
import threading
import time

ALPHA = 0.5


def timed(torch, fn, reps):
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def limit(torch, n, reps):
    dev, dev2 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    host, host2 = torch.empty(n, pin_memory=True), torch.empty(n, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        with torch.cuda.stream(s1):
            host.copy_(dev, non_blocking=True)
        with torch.cuda.stream(s2):
            dev2.copy_(host2, non_blocking=True)
        s1.synchronize()
        s2.synchronize()

    return {"d2h": timed(torch, lambda: host.copy_(dev), reps),
            "h2d": timed(torch, lambda: dev.copy_(host), reps),
            "both": timed(torch, both, reps)}


class OneWorkerJob:
    """A controller serving in a thread and one worker syncing `x` by EASGD; `registered`:
    PLATOON_REGISTERED_CENTRE for the worker ("0": staging, "require": registered, None: the
    default)."""

    def __init__(self, x, threads=None, registered=None):
        self.x, self.threads, self.registered = x, threads, registered

    def __enter__(self):
        from platoon import EASGD, Controller, Worker
        settings = {"PLATOON_SYNC_THREADS": self.threads,
                    "PLATOON_REGISTERED_CENTRE": self.registered}
        saved = {name: os.environ.get(name) for name in settings}
        for name, value in settings.items():
            if value is not None:
                os.environ[name] = str(value)
        self.ctl = Controller(control_port=0, num_workers=1)
        self.serving = threading.Thread(target=self.ctl.serve, kwargs={"timeout_s": 3600},
                                        daemon=True)
        self.serving.start()
        self.worker = Worker(self.ctl.control_port, timeout_s=300)
        try:
            self.worker.init_shared_params([self.x], EASGD(ALPHA))
        except BaseException:
            self.__exit__()
            raise
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return self.worker

    def __exit__(self, *exc):
        self.worker.close()
        self.serving.join(120)
        self.ctl.close()


def staging(torch, n, reps):
    x = torch.randn(n, device="cuda")
    out = {}
    with OneWorkerJob(x, threads=1, registered="0") as w:
        adapter, exchange = w._adapter, w._exchange  # noqa: SLF001 (a benchmark's breakdown)
        out["pull"] = timed(torch, adapter.pull, reps)
        out["host_1"] = timed(torch, exchange.sync, reps)
        out["push"] = timed(torch, adapter.push, reps)
        out["sync_1"] = timed(torch, w.sync_params, reps)
    with OneWorkerJob(x, registered="0") as w:
        out["host_n"] = timed(torch, w._exchange.sync, reps)  # noqa: SLF001
        out["threads"] = w._exchange._pool.threads  # noqa: SLF001
        out["sync_n"] = timed(torch, w.sync_params, reps)
    return out


def registered(torch, n, reps):
    """The registered centre's sync_params time, or (None, why CUDA refused it)."""
    from platoon.adapters.cuda_register import RegistrationRefused
    x = torch.randn(n, device="cuda")
    try:
        job = OneWorkerJob(x, registered="require")
        w = job.__enter__()
    except RegistrationRefused as exc:
        return None, str(exc)
    try:
        return timed(torch, w.sync_params, reps), None
    finally:
        job.__exit__()


def hidden(torch, n, reps):
    """Share of a sync hidden by start_sync (default and snapshot=True) behind GPU compute."""
    x = torch.randn(n, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    with OneWorkerJob(x) as w:
        sync = timed(torch, w.sync_params, reps)
        loops = max(1, int(sync / timed(torch, lambda: a @ a, reps)))

        def compute():
            for _ in range(loops):
                a @ a

        t_compute = timed(torch, compute, reps)
        out = {"sync": sync, "compute": t_compute}
        for name, kwargs in (("default", {}), ("snapshot", {"snapshot": True})):
            def overlapped(kwargs=kwargs):
                handle = w.start_sync(**kwargs)
                compute()
                handle.wait()
            out[name] = 1 - (timed(torch, overlapped, reps) - t_compute) / sync
        return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e7,1e8,1e9")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_gpu_sync: PyTorch is not installed: nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("bench_gpu_sync: no CUDA GPU visible: nothing to measure")
        return 0
    print("%s, torch %s (CUDA %s)" % (torch.cuda.get_device_name(0), torch.__version__,
                                      torch.version.cuda))
    print("| float32 | limit D2H / H2D / both | staging pull / host 1 thread / host N threads / "
          "push | sync_params 1 thread (vs limit) | sync_params N threads (vs limit) | "
          "registered (vs limit) | hidden: default / snapshot=True |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(float(s)) for s in args.sizes.split(",")):
        lim, stg = limit(torch, n, args.reps), staging(torch, n, args.reps)
        reg, why = registered(torch, n, args.reps)
        hid = hidden(torch, n, args.reps)
        pinned = lim["d2h"] + lim["h2d"]
        ms = 1e3
        print("| %.0e | %.1f / %.1f / %.1f ms | %.1f / %.1f / %.1f (%d threads) / %.1f ms | "
              "%.1f ms (%.2fx) | %.1f ms (%.2fx) | %s | %.0f %% / %.0f %% |" % (
                  n, ms * lim["d2h"], ms * lim["h2d"], ms * lim["both"], ms * stg["pull"],
                  ms * stg["host_1"], ms * stg["host_n"], stg["threads"], ms * stg["push"],
                  ms * stg["sync_1"], stg["sync_1"] / pinned, ms * stg["sync_n"],
                  stg["sync_n"] / pinned,
                  "%.1f ms (%.2fx)" % (ms * reg, reg / pinned) if reg else "skipped: %s" % why,
                  100 * hid["default"], 100 * hid["snapshot"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
