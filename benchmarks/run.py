"""Run the benchmark suite and print one table; also write it as JSON and Markdown.

usage: python -m benchmarks [--quick] [--out DIR] [--only NAME,...]
  NAME: sync, contention, control, minibatch, idle, stop, scaling, accuracy
"""

import argparse
import json
import os
import platform
import tempfile
import time

from ._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy loads BLAS
    os.environ.setdefault(_name, _value)

from . import bench_stop, bench_sync, bench_training, bench_transport, mlp  # noqa: E402

NAMES = ("sync", "contention", "control", "minibatch", "idle", "stop", "scaling", "accuracy")


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(names, quick, log):
    results = {}
    if "sync" in names:
        sizes = [1_000_000, 10_000_000] + ([] if quick else [100_000_000])
        for dtype in ("float32", "float64"):
            for n in sizes:
                log("sync throughput, %d %s" % (n, dtype))
                results["sync_%s_%d" % (dtype, n)] = bench_sync.sync_throughput(
                    n, rounds=5 if n > 10**7 else 8 if n > 10**6 else 20, dtype=dtype)
        log("lock hold per sync, Downpour(SGD nesterov) vs EASGD, digits MLP")
        results["downpour_hold"] = bench_sync.downpour_lock_hold(rounds=3 if quick else 5)
    if "contention" in names:
        n, duration, rounds = 10_000_000, (1.0 if quick else 1.5), (1 if quick else 3)
        configs = (("one", 1, "stripes"), ("two", 2, "stripes"), ("two_one_lock", 2, "one_lock"),
                   ("copy_one", 1, "copy"), ("copy_two", 2, "copy"))
        for r in range(rounds):  # alternated, best of each: load from elsewhere hits all alike
            for label, workers, kind in configs:
                log("concurrent syncs: %s (round %d)" % (label, r + 1))
                got = bench_sync.concurrent_syncs(n, workers, duration, kind)
                key = "contention_" + label
                if key not in results or got["syncs_per_s"] > results[key]["syncs_per_s"]:
                    results[key] = got
    if "control" in names:
        for transport in ("tcp", "ipc"):
            log("control round trip, %s" % transport)
            results["control_" + transport] = bench_transport.control_round_trip(
                transport, count=500, rounds=4 if quick else 16)
    if "minibatch" in names:
        for transport, shape, count in (("tcp", (256, 1024), 150), ("ipc", (256, 1024), 150),
                                        ("tcp", (64, 64), 1000), ("ipc", (64, 64), 1000)):
            log("minibatches, %s, %s" % (transport, shape))
            key = "minibatch_%s_%dx%d" % (transport, shape[0], shape[1])
            results[key] = bench_transport.minibatch_throughput(
                transport, shape, count // (2 if quick else 1), rounds=2 if quick else 10)
    if "idle" in names:
        log("idle controller")
        results["idle"] = bench_transport.idle_controller_cpu(1.0 if quick else 3.0)
    if "stop" in names:
        log("stop signal check vs a control round trip and a sync")
        results["stop"] = bench_stop.stop_check(rounds=3 if quick else 8)
    if "scaling" in names or "accuracy" in names:
        data = os.path.join(tempfile.mkdtemp(prefix="platoon-bench-"), "digits.npz")
        try:
            mlp.load_digits_split(data)
            if "scaling" in names:
                steps, rounds = (100, 1) if quick else (400, 3)
                log("scaling, %d minibatches, best of %d" % (steps, rounds))
                best = None
                for _ in range(rounds):
                    rows = bench_training.scaling(data, steps)
                    if best is None:
                        best = rows
                    else:  # best wall time and best CPU time of each column, separately
                        for name, row in rows.items():
                            for key in ("seconds", "cpu_seconds"):
                                best[name][key] = min(best[name][key], row[key])
                base = best["normal"]["seconds"]
                for row in best.values():
                    row["speedup"] = base / row["seconds"]
                results["scaling"] = {"minibatches": steps, "sync_every":
                                      bench_training.SYNC_EVERY, "rows": best}
            if "accuracy" in names:
                seeds = [0] if quick else [0, 1, 2, 3, 4]
                log("time to accuracy, %d seeds" % len(seeds))
                results["accuracy"] = bench_training.time_to_accuracy(
                    data, bench_training.TARGET_ACCURACY, seeds, 3000)
        finally:
            try:
                os.unlink(data)
            except FileNotFoundError:
                pass
            os.rmdir(os.path.dirname(data))
    return results


def _row(rows, what, value, baseline, ratio, target, ok):
    rows.append((what, value, baseline, "%.2fx" % ratio if ratio is not None else "",
                 target, "" if ok is None else ("yes" if ok else "**no**")))


def table(results):
    """Markdown table rows: what | measured | baseline | ratio | target | met."""
    rows = []
    for key in sorted((k for k in results if k.startswith("sync_")),
                      key=lambda k: (results[k].get("dtype", "float32"), results[k]["n"])):
        r = results[key]
        what = "sync %dM %s" % (r["n"] // 1_000_000, r.get("dtype", "float32"))
        ratio = r["sync_gbs"] / r["copy_gbs"]
        _row(rows, "%s (%d stripes) vs numpy copy of the same bytes" % (what, r["stripes"]),
             "%.1f GB/s" % r["sync_gbs"], "%.1f GB/s" % r["copy_gbs"], ratio, "≥ 1.0x",
             ratio >= 1.0)
        if "numpy_path_gbs" in r:
            _row(rows, "%s vs the numpy path (no compiled kernels)" % what,
                 "%.1f GB/s" % r["sync_gbs"], "%.1f GB/s" % r["numpy_path_gbs"],
                 r["sync_gbs"] / r["numpy_path_gbs"], "", None)
        _row(rows, "start_sync+wait %s vs sync (no overlap used)" % what[5:],
             "%.1f GB/s" % r["async_gbs"], "%.1f GB/s" % r["sync_gbs"],
             r["async_gbs"] / r["sync_gbs"], "", None)
    if "downpour_hold" in results:
        r = results["downpour_hold"]
        _row(rows, "lock hold per sync, Downpour(SGD 0.2, Nesterov 0.9) vs EASGD, %.1fM float32"
             % (r["n"] / 1e6), "%.2f ms" % r["downpour_hold_ms"], "%.2f ms" % r["easgd_hold_ms"],
             r["downpour_hold_ms"] / r["easgd_hold_ms"], "", None)
    if "contention_one" in results:
        one, two = results["contention_one"], results["contention_two"]
        single = results["contention_two_one_lock"]
        ratio = two["syncs_per_s"] / one["syncs_per_s"]
        _row(rows, "syncs/s, 2 workers vs 1 (10M, stripes)", "%.1f/s" % two["syncs_per_s"],
             "%.1f/s" % one["syncs_per_s"], ratio, "≥ 1.6x", ratio >= 1.6)
        _row(rows, "syncs/s, 2 workers vs 1 (10M, one lock)", "%.1f/s" % single["syncs_per_s"],
             "%.1f/s" % one["syncs_per_s"], single["syncs_per_s"] / one["syncs_per_s"], "",
             None)
        copy1, copy2 = results["contention_copy_one"], results["contention_copy_two"]
        _row(rows, "same traffic as copies, 2 processes vs 1 (the machine's ceiling)",
             "%.1f/s" % copy2["syncs_per_s"], "%.1f/s" % copy1["syncs_per_s"],
             copy2["syncs_per_s"] / copy1["syncs_per_s"], "", None)
        _row(rows, "lock held (waited for) per sync: 2 workers vs 1",
             "%.2f (%.2f) ms" % (two["mean_hold_ms"], two["mean_wait_ms"]),
             "%.2f (%.2f) ms" % (one["mean_hold_ms"], one["mean_wait_ms"]), None, "", None)
    for transport in ("tcp", "ipc"):
        r = results.get("control_" + transport)
        if r:
            ratio = r["platoon_us"] / r["raw_us"]
            _row(rows, "control round trip, %s, vs raw pyzmq REQ/REP" % transport,
                 "%.0f µs" % r["platoon_us"], "%.0f µs" % r["raw_us"], ratio, "≤ 1.1x",
                 ratio <= 1.1)
    for key in sorted(k for k in results if k.startswith("minibatch_")):
        r = results[key]
        ratio = r["platoon_mbs"] / r["raw_mbs"]
        _row(rows, "minibatches, %s, %d KiB each, vs raw PUSH/PULL" % (
            r["transport"], r["batch_bytes"] // 1024), "%.0f MB/s" % r["platoon_mbs"],
            "%.0f MB/s" % r["raw_mbs"], ratio, "≥ 0.9x", ratio >= 0.9)
    if "idle" in results:
        cpu = results["idle"]["cpu_percent"]
        _row(rows, "idle controller CPU", "%.2f %%" % cpu, "", None, "< 1 %", cpu < 1.0)
    if "stop" in results:
        r = results["stop"]
        _row(rows, "stop_requested check vs a control round trip (asking the controller)",
             "%.2f µs (%.4fx)" % (r["check_us"], r["check_us"] / r["round_trip_us"]),
             "%.0f µs" % r["round_trip_us"], None, "≤ 0.01x",
             r["check_us"] <= 0.01 * r["round_trip_us"])
        _row(rows, "stop_requested check vs sync_params, %dK float32" % (r["params"] // 1000),
             "%.2f µs (%.4fx)" % (r["check_us"], r["check_us"] / r["sync_us"]),
             "%.0f µs" % r["sync_us"], None, "", None)
    if "scaling" in results:
        s = results["scaling"]["rows"]
        for name, target in (("1 worker", 0.98), ("2 workers", 1.9)):
            _row(rows, "scaling: %s vs Normal, wall time" % name, "%.2f s" % s[name]["seconds"],
                 "%.2f s" % s["normal"]["seconds"], s[name]["speedup"], "≥ %.2fx" % target,
                 s[name]["speedup"] >= target)
            _row(rows, "scaling: %s vs Normal, CPU time of the slowest process" % name,
                 "%.2f s" % s[name]["cpu_seconds"], "%.2f s" % s["normal"]["cpu_seconds"],
                 s["normal"]["cpu_seconds"] / s[name]["cpu_seconds"], "", None)
        ceiling = s["2 independent processes"]
        _row(rows, "scaling: 2 independent processes (no platoon) vs Normal: the machine's "
             "ceiling", "%.2f s" % ceiling["seconds"], "%.2f s" % s["normal"]["seconds"],
             ceiling["speedup"], "", None)
        _row(rows, "scaling: 2 workers vs that ceiling", "%.2f s" % s["2 workers"]["seconds"],
             "%.2f s" % ceiling["seconds"], ceiling["seconds"] / s["2 workers"]["seconds"],
             "", None)
    if "accuracy" in results:
        a = results["accuracy"]
        _row(rows, "time to %.0f%% test accuracy: 2-worker EASGD vs SGD" % (100 * a["target"]),
             "%.2f s" % a["easgd_2"]["seconds"], "%.2f s" % a["sgd"]["seconds"],
             a["speedup"], "", None)
    return rows


def markdown(results, meta):
    lines = ["| benchmark | platoon | baseline | ratio | target | met |",
             "|---|---|---|---|---|---|"]
    lines += ["| %s |" % " | ".join(row) for row in table(results)]
    if "scaling" in results:
        s = results["scaling"]
        rows = s["rows"]
        columns = ("normal", "1 worker", "2 workers", "2 independent processes")
        lines += ["", "Scaling, digits MLP %s, %d minibatches of %d in all, sync every %d:" % (
            "-".join(map(str, bench_training.SIZES)), s["minibatches"], bench_training.BATCH,
            s["sync_every"]), "",
            "| | Normal | 1 worker | 2 workers | 2 independent processes |",
            "|---|---|---|---|---|",
            "| wall time | %s |" % " | ".join("%.2f s" % rows[k]["seconds"] for k in columns),
            "| speedup | %s |" % " | ".join("%.2fx" % rows[k]["speedup"] for k in columns),
            "| CPU time of the slowest process | %s |" % " | ".join(
                "%.2f s" % rows[k]["cpu_seconds"] for k in columns)]
    lines += ["", "Machine: %s, %d cores; load average %.2f at start, %.2f at end; "
              "suite ran in %.0f s." % (meta["cpu"], meta["cores"], meta["load_start"],
                                        meta["load_end"], meta["seconds"])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller, shorter runs (smoke test)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"),
                        help="directory for latest.json and latest.md")
    parser.add_argument("--only", default=",".join(NAMES), help="comma-separated subset")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(NAMES)
    if unknown:
        parser.error("unknown benchmark(s) %s; choose from %s" % (", ".join(sorted(unknown)),
                                                                   ", ".join(NAMES)))
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    results = measure(names, args.quick, lambda text: print("..", text, flush=True))
    meta = {"cpu": _cpu_model(), "cores": os.cpu_count(), "load_start": load_start,
            "load_end": os.getloadavg()[0], "seconds": time.monotonic() - started,
            "quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = markdown(results, meta)
    print()
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(text)
