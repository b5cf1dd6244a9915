"""Platoon against raw ZeroMQ and against its own blocking sync, idle and beside a busy
neighbour: medians of interleaved rounds, on the default path a user gets.

Rows (issue 46): 16 KiB and 1 MiB minibatches over tcp, `Controller.send_mb` with its
defaults (copy=True) to `Worker.recv_mb` with the default window, against raw pyzmq
PUSH/PULL with the same guarantees (`send_multipart` with pyzmq's default copy, so the
sender may reuse its arrays at once, as `send_mb`'s copy lets it; `recv_multipart(copy=False)`,
views as `recv_mb` gives); and `start_sync()` + `wait()` with nothing to overlap against
`sync_params()`. The busy neighbour is one process spinning in a loop, pinned to the cores
this process may run on; it is paused (SIGSTOP) for the idle rounds, so idle and busy
rounds alternate too. Each round times every mode once, in an order that alternates, and
gives one ratio; a row reports the median ratio of its rounds: load from elsewhere hits
both sides of a ratio alike, and the median drops the rounds it hit hardest. Beside the
ratios, the minibatch rows record counts that load barely moves: the CPU each side spent
per minibatch (all its threads, from /proc/PID/task/*/schedstat), medians of the rounds.
"""

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import zmq

from platoon import EASGD, Worker

from ._util import Children

SHAPES = {"16 KiB": (64, 64), "1 MiB": (256, 1024)}  # float32 rows x cols, int64 labels


@contextlib.contextmanager
def neighbour():
    """A spinning process pinned to this process's cores, paused; yields `busy(on)`."""
    cores = sorted(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        os.sched_setaffinity(spin.pid, cores)
        os.kill(spin.pid, signal.SIGSTOP)

        def busy(on):
            os.kill(spin.pid, signal.SIGCONT if on else signal.SIGSTOP)
            if on:
                time.sleep(0.02)  # let it take its share before the round starts
        yield busy
    finally:
        spin.kill()  # SIGKILL ends a stopped process too
        spin.wait(10)


def cpu_ns(pid):
    """CPU nanoseconds process `pid` has run, all its threads together (those that ended
    are not counted: the benchmark's threads live through its rounds)."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total


def _median(values):
    return statistics.median(values) if values else None


def _interleaved(rounds, busy, modes, measure):
    """`rounds` rounds, each measuring idle then beside the busy neighbour (`busy(on)`), the
    two `modes` in one order in even rounds and the other in odd ones; `measure(mode)` returns
    its seconds. Yields (condition, {mode: seconds}) for each condition of each round."""
    for r in range(rounds):
        for condition in ("idle", "busy"):
            busy(condition == "busy")
            seconds = {mode: measure(mode) for mode in (modes if r % 2 == 0 else modes[::-1])}
            busy(False)
            yield condition, seconds


def minibatches(shape, count, rounds, busy):
    """Rounds of `count` minibatches [float32 `shape`, int64 labels] over tcp, raw then
    platoon or the reverse, idle and busy (`busy(on)`, from `neighbour`) in turn.
    Returns {"idle": {...}, "busy": {...}}: the median ratio platoon/raw of throughput,
    each side's median MB/s, the rounds' ratios, and "cpu_us": the median CPU microseconds
    per minibatch of the sender and of the receiver, raw and platoon."""
    nbytes = shape[0] * shape[1] * 4 + shape[0] * 8
    got = {c: {"ratios": [], "raw": [], "platoon": [],
               "cpu_us": {(mode, side): [] for mode in ("raw", "platoon")
                          for side in ("sender", "receiver")}} for c in ("idle", "busy")}
    spent = {}  # mode -> (sender, receiver) CPU us per minibatch in the last measure
    with Children() as children:
        senders = {"raw": children.start("mb_sender", "raw_default", "tcp", shape[0], shape[1],
                                         count),
                   "platoon": children.start("mb_sender", "platoon", "tcp", shape[0], shape[1],
                                             count, "default", "copy")}
        raw_addr = senders["raw"].line("ADDR")[0]
        ctl_addr, data_addr = senders["platoon"].line("ADDR")
        ctx = zmq.Context()
        try:
            pull = ctx.socket(zmq.PULL)
            pull.linger = 0
            pull.connect(raw_addr)
            with Worker(ctl_addr, timeout_s=60) as w:
                w.init_mb_sock(data_addr)  # the defaults
                receive = {"raw": lambda: pull.recv_multipart(copy=False), "platoon": w.recv_mb}

                def measure(mode):
                    recv = receive[mode]
                    pid = senders[mode].popen.pid
                    cpu = (cpu_ns(pid), cpu_ns(os.getpid()))
                    senders[mode].send("go")
                    recv()  # timed from the first arrival: not the go line's trip
                    start = time.perf_counter()
                    for _ in range(count - 1):
                        recv()
                    seconds = time.perf_counter() - start
                    # the sender is done: it sent them all (the last one is here)
                    spent[mode] = ((cpu_ns(pid) - cpu[0]) / count / 1e3,
                                   (cpu_ns(os.getpid()) - cpu[1]) / count / 1e3)
                    return seconds
                for condition, seconds in _interleaved(rounds, busy, ("raw", "platoon"),
                                                       measure):
                    entry = got[condition]
                    entry["ratios"].append(seconds["raw"] / seconds["platoon"])
                    for mode in seconds:
                        entry[mode].append((count - 1) * nbytes / seconds[mode] / 1e6)
                        entry["cpu_us"][mode, "sender"].append(spent[mode][0])
                        entry["cpu_us"][mode, "receiver"].append(spent[mode][1])
            pull.close(0)
        finally:
            ctx.destroy(0)
        for sender in senders.values():
            sender.wait(30)
    return {c: {"ratio": _median(e["ratios"]), "raw_mbs": _median(e["raw"]),
                "platoon_mbs": _median(e["platoon"]), "ratios": e["ratios"],
                "cpu_us": {mode: {side: _median(e["cpu_us"][mode, side])
                                  for side in ("sender", "receiver")}
                           for mode in ("raw", "platoon")}}
            for c, e in got.items()} | {"batch_bytes": nbytes, "count": count}


def start_sync_vs_sync(n, count, rounds, busy):
    """Rounds of `count` syncs of `n` float32 (EASGD) through the public API: `sync_params()`
    against `start_sync()` + `wait()` with nothing between, idle and busy in turn.
    Returns {"idle": {...}, "busy": {...}}: the median ratio (sync_params time over
    start_sync+wait time: above 1, start_sync+wait is faster) and each side's median ms."""
    got = {c: {"ratios": [], "sync": [], "start_wait": []} for c in ("idle", "busy")}
    with Children() as children:
        ctl = children.start("ping_controller", "tcp")
        with Worker(ctl.line("ADDR")[0], timeout_s=60) as w:
            x = np.random.default_rng(0).random(n, dtype=np.float32) + 1
            w.init_shared_params([x], EASGD(0.5))

            def start_wait():
                w.start_sync().wait()
            modes = {"sync": w.sync_params, "start_wait": start_wait}
            for fn in modes.values():  # warm: the default start_sync measures both ways first
                for _ in range(count):
                    fn()

            def measure(mode):
                fn = modes[mode]
                start = time.perf_counter()
                for _ in range(count):
                    fn()
                return time.perf_counter() - start
            for condition, seconds in _interleaved(rounds, busy, ("sync", "start_wait"),
                                                   measure):
                entry = got[condition]
                entry["ratios"].append(seconds["sync"] / seconds["start_wait"])
                for mode in seconds:
                    entry[mode].append(seconds[mode] / count * 1e3)
        ctl.wait(30)
    return {c: {"ratio": _median(e["ratios"]), "sync_ms": _median(e["sync"]),
                "start_wait_ms": _median(e["start_wait"]), "ratios": e["ratios"]}
            for c, e in got.items()} | {"n": n, "count": count}


def suite(quick=False, log=lambda text: None):
    """Every row: 16 KiB and 1 MiB minibatches, and start_sync+wait vs sync_params (1M
    float32), each idle and busy; medians of 3 rounds with `quick`, else 11."""
    rounds = 3 if quick else 11
    results = {}
    with neighbour() as busy:
        for label, count in (("16 KiB", 3000), ("1 MiB", 300)):
            log("minibatches %s over tcp, default path vs raw PUSH/PULL, idle and busy, %d "
                "rounds" % (label, rounds))
            results[label] = minibatches(SHAPES[label], count // (3 if quick else 1), rounds,
                                         busy)
        log("start_sync()+wait() vs sync_params(), 1M float32, idle and busy, %d rounds"
            % rounds)
        results["sync"] = start_sync_vs_sync(1_000_000, 10 if quick else 30, rounds, busy)
    results["rounds"] = rounds
    return results


def rows(results):
    """(what, platoon, baseline, ratio, target) for the record's table."""
    out = []
    for label in SHAPES:
        r = results.get(label)
        if r is None:
            continue
        for condition in ("idle", "busy"):
            e = r[condition]
            cpu = e.get("cpu_us")  # (records before it have none)
            counts = "" if cpu is None else (
                "; CPU us per minibatch, sender/receiver: platoon %.0f/%.0f, raw %.0f/%.0f"
                % (cpu["platoon"]["sender"], cpu["platoon"]["receiver"],
                   cpu["raw"]["sender"], cpu["raw"]["receiver"]))
            out.append(("minibatches, tcp, %s each, default path, vs raw PUSH/PULL, %s "
                        "(median of %d rounds%s)" % (label, "idle" if condition == "idle" else
                                                     "beside a busy neighbour",
                                                     len(e["ratios"]), counts),
                        "%.0f MB/s" % e["platoon_mbs"], "%.0f MB/s" % e["raw_mbs"], e["ratio"],
                        0.9))
    r = results.get("sync")
    if r is not None:
        for condition in ("idle", "busy"):
            e = r[condition]
            out.append(("start_sync()+wait() vs sync_params(), %dM float32, %s (median of %d "
                        "rounds)" % (r["n"] // 1_000_000, "idle" if condition == "idle" else
                                     "beside a busy neighbour", len(e["ratios"])),
                        "%.2f ms" % e["start_wait_ms"], "%.2f ms" % e["sync_ms"], e["ratio"],
                        0.9))
    return out
