"""Control round trips and minibatch throughput against raw pyzmq; the idle controller's CPU."""

import json
import os
import time

import numpy as np
import zmq

from platoon import Worker

from ._util import Children

REQUEST = {"worker_id": 0, "req": "ping", "req_info": None, "seq": 1}
REPLY = {"seq": 1, "ok": True, "result": None}


def control_round_trip(transport, count=500, rounds=12, chunk=50):
    """Best µs per round trip: Worker.send_req to a Controller vs a raw pyzmq REQ/REP of the
    same JSON messages (each side encoding and decoding them with the json module).

    Each round alternates the two every `chunk` round trips (a few ms), so load from
    elsewhere hits both alike; a round's figure is its total time over `count`.
    """
    with Children() as children:
        raw = children.start("raw_rep", transport)
        ctl = children.start("ping_controller", transport)
        raw_addr, ctl_addr = raw.line("ADDR")[0], ctl.line("ADDR")[0]
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.REQ)
            sock.linger = 0
            sock.connect(raw_addr)

            def raw_round_trips(n):
                for _ in range(n):
                    sock.send(json.dumps(REQUEST).encode())
                    json.loads(sock.recv())

            with Worker(ctl_addr, timeout_s=30) as w:
                def platoon_round_trips(n):
                    for _ in range(n):
                        w.send_req("ping")

                best_raw = best_ours = float("inf")
                for _ in range(rounds):
                    spent_raw = spent_ours = 0.0
                    for done in range(0, count, chunk):
                        n = min(chunk, count - done)
                        start = time.perf_counter()
                        raw_round_trips(n)
                        middle = time.perf_counter()
                        platoon_round_trips(n)
                        spent_raw += middle - start
                        spent_ours += time.perf_counter() - middle
                    best_raw = min(best_raw, spent_raw / count)
                    best_ours = min(best_ours, spent_ours / count)
            sock.close(0)
        finally:
            ctx.destroy(0)
        ctl.wait(30)
    return {"transport": transport, "raw_us": best_raw * 1e6, "platoon_us": best_ours * 1e6}


def minibatch_throughput(transport, shape, count, rounds=3, prefetch=None):
    """Best MB/s receiving `count` minibatches [float32 shape, int64 labels]: raw vs platoon.

    Raw (the baseline): pyzmq PUSH/PULL of a JSON header frame and one frame per
    array, sent with send_multipart(copy=False), received with
    recv_multipart(copy=False) and not decoded. Platoon: Controller.send_mb(copy=False)
    to Worker.recv_mb, which asks for minibatches and returns the arrays (read-only
    views), with the window a user gets by default (16 MiB, at most 256 minibatches;
    the controller's default hwm), or with `prefetch` ahead (the controller's hwm
    raised to match). Also, for reference, raw PUSH/PULL of the same bytes prepared
    once as one frame ("raw_one_frame_mbs"): what packing a small minibatch can gain
    at most. All senders stay up; the rounds alternate the three.
    """
    nbytes = int(np.prod(shape)) * 4 + shape[0] * 8
    modes = ("raw", "platoon", "raw_one_frame")
    best = dict.fromkeys(modes, 0.0)
    with Children() as children:
        senders = {
            "raw": children.start("mb_sender", "raw", transport, shape[0], shape[1], count),
            "platoon": children.start("mb_sender", "platoon", transport, shape[0], shape[1],
                                      count, "default" if prefetch is None else prefetch + 1),
            "raw_one_frame": children.start("mb_sender", "raw_one_frame", transport, shape[0],
                                            shape[1], count)}
        raw_addr = senders["raw"].line("ADDR")[0]
        one_addr = senders["raw_one_frame"].line("ADDR")[0]
        ctl_addr, data_addr = senders["platoon"].line("ADDR")
        ctx = zmq.Context()
        try:
            pulls = []
            for address in (raw_addr, one_addr):
                pull = ctx.socket(zmq.PULL)
                pull.linger = 0
                pull.connect(address)
                pulls.append(pull)
            with Worker(ctl_addr, timeout_s=60) as w:
                if prefetch is None:
                    w.init_mb_sock(data_addr)  # the defaults
                else:
                    w.init_mb_sock(data_addr, prefetch=prefetch, window_bytes=None)
                receive = {"raw": lambda: pulls[0].recv_multipart(copy=False),
                           "platoon": w.recv_mb,
                           "raw_one_frame": lambda: pulls[1].recv(copy=False)}
                for _ in range(rounds):
                    for mode in modes:
                        senders[mode].send("go")
                        recv = receive[mode]
                        recv()
                        start = time.perf_counter()
                        for _ in range(count - 1):
                            recv()
                        elapsed = time.perf_counter() - start
                        best[mode] = max(best[mode], (count - 1) * nbytes / elapsed / 1e6)
            for pull in pulls:
                pull.close(0)
        finally:
            ctx.destroy(0)
        for sender in senders.values():
            sender.wait(30)
    return {"transport": transport, "batch_bytes": nbytes, "raw_mbs": best["raw"],
            "platoon_mbs": best["platoon"], "raw_one_frame_mbs": best["raw_one_frame"],
            "prefetch": prefetch}


def _cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_controller_cpu(duration_s=2.0):
    """Percent of one core used by a serving controller with one registered, idle worker."""
    with Children() as children:
        ctl = children.start("ping_controller", "tcp")
        with Worker(ctl.line("ADDR")[0], timeout_s=30):
            time.sleep(0.2)  # let start-up work finish before measuring
            before, start = _cpu_seconds(ctl.popen.pid), time.monotonic()
            time.sleep(duration_s)  # measuring idleness: nothing to wait for
            used = _cpu_seconds(ctl.popen.pid) - before
            elapsed = time.monotonic() - start
        ctl.wait(30)
    return {"cpu_percent": 100.0 * used / elapsed, "seconds": elapsed}


# -- children --

def raw_rep(transport):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.linger = 0
    address = _bind(sock, transport)
    print("ADDR %s" % address, flush=True)
    try:
        while True:
            json.loads(sock.recv())
            sock.send(json.dumps(REPLY).encode())
    finally:
        sock.close(0)
        ctx.term()


def _bind(sock, transport):
    if transport == "tcp":
        return "tcp://127.0.0.1:%d" % sock.bind_to_random_port("tcp://127.0.0.1")
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="platoon-bench-"), "sock")
    sock.bind("ipc://" + path)
    import atexit
    import shutil
    atexit.register(shutil.rmtree, os.path.dirname(path), True)
    return "ipc://" + path


def ping_controller(transport):
    from platoon import Controller

    class Ping(Controller):
        def handle_control(self, req, worker_id, req_info):
            return req_info

    with Ping(control_port=0, num_workers=1, transport=transport) as ctl:
        print("ADDR %s" % ctl.control_address, flush=True)
        ctl.serve()


def mb_sender(mode, transport, rows, cols, count, hwm="default", copy="nocopy"):
    """Child: send `count` minibatches for each 'go' line on stdin, until stdin closes
    (platoon: from a controller whose data socket has that `hwm`, or the default one, with
    send_mb(copy=False), or its default copy=True when `copy` is "copy"; "raw_default":
    send_multipart with pyzmq's default copy=True)."""
    import sys
    rows, cols, count = int(rows), int(cols), int(count)
    batch = [np.ones((rows, cols), np.float32), np.arange(rows, dtype=np.int64)]
    if mode in ("raw", "raw_one_frame", "raw_default"):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.linger = 0
        print("ADDR %s" % _bind(sock, transport), flush=True)
        header = json.dumps([{"dtype": a.dtype.str, "shape": list(a.shape), "order": "C"}
                             for a in batch]).encode()
        frames = [header] + batch
        if mode == "raw_one_frame":
            frames = [b"".join(frames)]
        zero_copy = mode != "raw_default"
        while sys.stdin.readline():
            for _ in range(count):
                sock.send_multipart(frames, copy=not zero_copy)
        sock.close(0)
        ctx.term()
        return
    import threading

    from platoon import Controller
    with Controller(control_port=0, num_workers=1, transport=transport) as ctl:
        if hwm == "default":
            ctl.init_data(0)
        else:
            ctl.init_data(0, hwm=int(hwm))
        print("ADDR %s %s" % (ctl.control_address, ctl.data_address), flush=True)

        def send():
            while sys.stdin.readline():
                for _ in range(count):
                    ctl.send_mb(batch, copy=copy == "copy", timeout_s=60)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        ctl.serve(timeout_s=300)
