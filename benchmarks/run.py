"""Run the benchmark suite and print one table; a full run also writes the record.

usage: python -m benchmarks [--quick] [--only NAME,...] [--out DIR]
       python -m benchmarks --render FILE       (print the Markdown of a record)
       python -m benchmarks --write-docs [FILE] (latest.md and docs/performance.md from it)
  NAME: sync, contention, control, minibatch, busy, idle, stop, startup, allreduce, scaling,
        accuracy

A full run (no --quick, no --only) writes benchmarks/results/latest.json, renders
it into latest.md and into the marked block of docs/performance.md. Quick and
partial runs only print, unless --out DIR is given.
"""

import argparse
import os
import tempfile
import time

from ._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy loads BLAS
    os.environ.setdefault(_name, _value)

from . import (  # noqa: E402
    bench_allreduce,
    bench_busy,
    bench_startup,
    bench_stop,
    bench_sync,
    bench_training,
    bench_transport,
    mlp,
    record,  # noqa: E402
)

NAMES = ("sync", "contention", "control", "minibatch", "busy", "idle", "stop", "startup",
         "allreduce", "scaling", "accuracy")


def measure(names, quick, log):
    results = {}
    if "sync" in names:
        sizes = [1_000_000, 10_000_000] + ([] if quick else [100_000_000])
        for dtype in ("float32", "float64"):
            for n in sizes:
                log("sync throughput, %d %s" % (n, dtype))
                results["sync_%s_%d" % (dtype, n)] = bench_sync.sync_throughput(
                    n, rounds=5 if n > 10**7 else 8 if n > 10**6 else 20, dtype=dtype,
                    overlap=dtype == "float32")
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
        # About 0.1 s of traffic a round (a 20 ms round swung 0.5x-1.9x at load 4).
        for transport, shape, count in (("tcp", (256, 1024), 600), ("ipc", (256, 1024), 600),
                                        ("tcp", (64, 64), 5000), ("ipc", (64, 64), 5000)):
            log("minibatches, %s, %s" % (transport, shape))
            key = "minibatch_%s_%dx%d" % (transport, shape[0], shape[1])
            results[key] = bench_transport.minibatch_throughput(
                transport, shape, count // (2 if quick else 1), rounds=2 if quick else 20)
    if "busy" in names:
        results["busy"] = bench_busy.suite(quick, log)
    if "idle" in names:
        log("idle controller")
        results["idle"] = bench_transport.idle_controller_cpu(1.0 if quick else 3.0)
    if "stop" in names:
        log("stop signal check vs a control round trip and a sync")
        results["stop"] = bench_stop.stop_check(rounds=3 if quick else 8)
    if "startup" in names:
        rounds, large = (3, bench_startup.LARGE // 10) if quick else (7, bench_startup.LARGE)
        log("worker start-up, %d fresh-process rounds alternating" % rounds)
        results["startup"] = bench_startup.startup(rounds, large)
    if "allreduce" in names:
        log("all_reduce, 2 workers, vs mpi4py Allreduce and a numpy sum")
        results["allreduce"] = bench_allreduce.suite(rounds=2 if quick else 3,
                                                     iters=20 if quick else 50)
    if "scaling" in names or "accuracy" in names:
        data = os.path.join(tempfile.mkdtemp(prefix="platoon-bench-"), "digits.npz")
        try:
            mlp.load_digits_split(data)
            if "scaling" in names:
                steps, rounds = (200, 2) if quick else (400, 5)
                log("scaling, %d minibatches, %d rounds alternating the columns"
                    % (steps, rounds))
                got = bench_training.scaling(data, steps, rounds)
                results["scaling"] = {"minibatches": steps, "sync_every":
                                      bench_training.SYNC_EVERY, "rounds": rounds,
                                      "rows": got["rows"], "runs": got["runs"]}
            if "accuracy" in names:
                seeds = [0, 1] if quick else [0, 1, 2, 3, 4]
                log("time to accuracy, %d seeds, SGD and EASGD alternating" % len(seeds))
                results["accuracy"] = bench_training.time_to_accuracy(
                    data, bench_training.TARGET_ACCURACY, seeds, 3000)
        finally:
            try:
                os.unlink(data)
            except FileNotFoundError:
                pass
            os.rmdir(os.path.dirname(data))
    return results


def _duration(seconds):
    if seconds < 1e-5:
        return "%.2f µs" % (seconds * 1e6)
    return "%.0f µs" % (seconds * 1e6) if seconds < 1e-3 else "%.2f ms" % (seconds * 1e3)


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
        live = "async_live_gbs" in r  # records before start_sync(snapshot=False) lack it
        if live:
            ratio = r["async_live_gbs"] / r["sync_gbs"]
            _row(rows, "start_sync(snapshot=False)+wait %s vs sync (no overlap used)"
                 % what[5:], "%.1f GB/s" % r["async_live_gbs"], "%.1f GB/s" % r["sync_gbs"],
                 ratio, "≥ 0.9x", ratio >= 0.9)
            if "hidden_live" in r:
                _row(rows, "start_sync(snapshot=False), compute %.2f ms, wait (%s): share of "
                     "the sync hidden" % (r["compute_ms"], what[5:]), "%.0f %% (%.2f ms in all)"
                     % (100 * r["hidden_live"], r["overlapped_live_ms"]),
                     "sync %.2f ms" % r["sync_ms"], None, "≥ 70 %", r["hidden_live"] >= 0.7)
        ratio = r["async_gbs"] / r["sync_gbs"]
        _row(rows, "start_sync%s+wait %s vs sync (no overlap used)"
             % (" (snapshot)" if live else "", what[5:]),
             "%.1f GB/s" % r["async_gbs"], "%.1f GB/s" % r["sync_gbs"], ratio,
             "" if live else "≥ 0.9x", None if live else ratio >= 0.9)
        if "hidden" in r:
            _row(rows, "start_sync%s, compute %.2f ms, wait (%s): share of the sync hidden"
                 % (" (snapshot)" if live else "", r["compute_ms"], what[5:]),
                 "%.0f %% (%.2f ms in all)" % (100 * r["hidden"], r["overlapped_ms"]),
                 "sync %.2f ms" % r["sync_ms"], None, "" if live else "≥ 70 %",
                 None if live else r["hidden"] >= 0.7)
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
        # Records before the window was counted in bytes used a tuned prefetch (in the json).
        window = ", default window" if r.get("prefetch", 0) is None else ""
        _row(rows, "minibatches, %s, %d KiB each%s, vs raw PUSH/PULL" % (
            r["transport"], r["batch_bytes"] // 1024, window), "%.0f MB/s" % r["platoon_mbs"],
            "%.0f MB/s" % r["raw_mbs"], ratio, "≥ 0.9x", ratio >= 0.9)
    if "busy" in results:
        for what, value, baseline, ratio, target in bench_busy.rows(results["busy"]):
            _row(rows, what, value, baseline, ratio, "≥ %.1fx" % target, ratio >= target)
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
    if "startup" in results:
        for what, value, baseline, ratio in bench_startup.rows(results["startup"]):
            target = bench_startup.TARGETS.get(what)
            _row(rows, what, value, baseline, ratio, "≤ %.2gx" % target if target else "",
                 ratio <= target if target else None)
    for label, r in results.get("allreduce", {}).items():
        what = "all_reduce %s float32 (sum), 2 workers on one node" % label
        if r["mpi4py_s"] is not None:
            ratio = r["mpi4py_s"] / r["platoon_s"]
            _row(rows, "%s vs mpi4py Allreduce, 2 ranks" % what, _duration(r["platoon_s"]),
                 _duration(r["mpi4py_s"]), ratio, "≥ 0.8x", ratio >= 0.8)
        _row(rows, "%s vs a numpy sum of the 2 arrays (the memory limit)" % what,
             _duration(r["platoon_s"]), _duration(r["numpy_sum_s"]),
             r["numpy_sum_s"] / r["platoon_s"], "", None)
    if "scaling" in results:
        s = results["scaling"]["rows"]
        for name, target in (("1 worker", 0.98), ("2 workers", None)):
            _row(rows, "scaling: %s vs Normal, wall time" % name, "%.2f s" % s[name]["seconds"],
                 "%.2f s" % s["normal"]["seconds"], s[name]["speedup"],
                 "≥ %.2fx" % target if target else "",
                 s[name]["speedup"] >= target if target else None)
            _row(rows, "scaling: %s vs Normal, CPU time of the slowest process" % name,
                 "%.2f s" % s[name]["cpu_seconds"], "%.2f s" % s["normal"]["cpu_seconds"],
                 s["normal"]["cpu_seconds"] / s[name]["cpu_seconds"], "", None)
        ceiling = s["2 independent processes"]
        _row(rows, "scaling: 2 independent processes (no platoon) vs Normal: the machine's "
             "ceiling", "%.2f s" % ceiling["seconds"], "%.2f s" % s["normal"]["seconds"],
             ceiling["speedup"], "", None)
        ratio = ceiling["seconds"] / s["2 workers"]["seconds"]
        _row(rows, "scaling: 2 workers vs that ceiling", "%.2f s" % s["2 workers"]["seconds"],
             "%.2f s" % ceiling["seconds"], ratio, "≥ 0.95x", ratio >= 0.95)
    if "accuracy" in results:
        a = results["accuracy"]
        _row(rows, "time to %.0f%% test accuracy: 2-worker EASGD vs SGD, median of %d seeds"
             % (100 * a["target"], len(a["sgd"]["runs"])),
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
        columns = [name for name, _, _ in bench_training.COLUMNS]
        lines += ["", "Scaling, digits MLP %s, %d minibatches of %d in all, sync every %d; "
                  "the columns alternated for %d rounds, each column's best round:" % (
                      "-".join(map(str, bench_training.SIZES)), s["minibatches"],
                      bench_training.BATCH, s["sync_every"], s["rounds"]), "",
                  "| | Normal | 1 worker | 2 workers | 2 independent processes |",
                  "|---|---|---|---|---|"]

        def line(label, fmt, key, scale=1.0):
            return "| %s | %s |" % (label, " | ".join(fmt % (rows[k][key] * scale)
                                                      for k in columns))
        lines += [line("wall time", "%.2f s", "seconds"),
                  line("speedup", "%.2fx", "speedup"),
                  line("CPU time of the slowest process", "%.2f s", "cpu_seconds"),
                  line("its time in sync_params", "%.0f ms", "sync_seconds", 1e3),
                  line("its time in control requests", "%.0f ms", "request_seconds", 1e3),
                  line("its time waiting for locks", "%.0f ms", "lock_wait_seconds", 1e3),
                  "| wall time less those | %s |" % " | ".join(
                      "%.2f s" % (rows[k]["seconds"] - rows[k]["sync_seconds"]
                                  - rows[k]["request_seconds"] - rows[k]["lock_wait_seconds"])
                      for k in columns),
                  line("first to last end", "%.0f ms", "end_spread_seconds", 1e3),
                  "| wall time of every round | %s |" % " | ".join(
                      ", ".join("%.2f" % t for t in s["runs"][k]) for k in columns)]
    command = "python -m benchmarks" + (" --quick" if meta.get("quick") else "")
    if set(meta.get("benchmarks", NAMES)) != set(NAMES):
        command += " --only " + ",".join(meta["benchmarks"])
    lines += ["", "`%s` at commit %s, %s; %s, %d cores; load average %.2f "
              "at start, %.2f at end; the run took %.0f s%s." % (
                  command, meta.get("commit", "unknown"),
                  meta.get("date", "unknown date"), meta["cpu"], meta["cores"],
                  meta["load_start"], meta["load_end"], meta["seconds"], " (%s)" % ", ".join(
                      "%s %.0f s" % item for item in meta["section_seconds"].items())
                  if meta.get("section_seconds") else "")]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller, shorter runs (smoke test)")
    parser.add_argument("--only", default=",".join(NAMES), metavar="NAMES",
                        help="comma-separated subset of " + ",".join(NAMES))
    parser.add_argument("--out", metavar="DIR", help="write latest.json and latest.md into DIR "
                        "(without it, only a full run writes them: the record in "
                        "benchmarks/results, rendered into docs/performance.md too)")
    parser.add_argument("--render", metavar="FILE", help="print the Markdown of a record")
    parser.add_argument("--write-docs", metavar="FILE", nargs="?", const=record.LATEST_JSON,
                        help="render a record (default benchmarks/results/latest.json) into "
                        "latest.md and docs/performance.md")
    args = parser.parse_args(argv)
    if args.render:
        print(markdown(*record.load(args.render)), end="")
        return
    if args.write_docs:
        text = markdown(*record.load(args.write_docs))
        record.write_markdown(text)
        record.write_docs(text)
        print(text, end="")
        return
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(NAMES)
    if unknown:
        parser.error("unknown benchmark(s) %s; choose from %s" % (", ".join(sorted(unknown)),
                                                                   ", ".join(NAMES)))
    full = not args.quick and set(names) == set(NAMES)
    meta = record.start_meta(names, args.quick)
    results, meta["section_seconds"] = {}, {}
    for name in names:  # one at a time, to record how long each takes
        started = time.monotonic()
        results.update(measure([name], args.quick, record.log))
        meta["section_seconds"][name] = time.monotonic() - started
    meta = record.finish_meta(meta)
    text = markdown(results, meta)
    print()
    print(text, end="")
    if args.out:
        record.save(os.path.join(args.out, "latest.json"), results, meta)
        record.write_markdown(text, os.path.join(args.out, "latest.md"))
    elif full:
        record.save(record.LATEST_JSON, results, meta)
        record.write_markdown(text)
        record.write_docs(text)
        print("\nwrote %s, %s and the table in %s" % tuple(
            os.path.relpath(p) for p in (record.LATEST_JSON, record.LATEST_MD, record.DOCS)))
