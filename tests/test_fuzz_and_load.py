"""A live controller under malformed input and under load from many real worker processes."""

import json
import random
import threading

import numpy as np
import pytest
import zmq
from test_protocol import garbled_minibatch

from platoon import EASGD, Controller, ProtocolError, Worker
from platoon.protocol import encode_minibatch


class Counting(Controller):
    steps = 0

    def handle_control(self, req, worker_id, req_info):
        if req == "step":
            self.steps += 1
            return self.steps
        raise ValueError("unknown request %r" % (req,))


def malformed_frames(rng):
    """One malformed control message: a list of frames."""
    valid = json.dumps({"worker_id": 0, "req": "step", "req_info": {"n": 1}, "seq": 5}).encode()
    kind = rng.randrange(10)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 200))]
    if kind == 1:
        return [valid[:rng.randrange(len(valid))]]  # truncated JSON
    if kind == 2:
        return [b'{"req": "x", "pad": "' + b"a" * (1 << 20) + b'"}']  # over the size limit
    if kind == 3:
        value = rng.choice(["1", "null", "[]", '"s"', "{}", "true", "1e400"])
        field = rng.choice(["req", "worker_id", "seq"])
        return [('{"%s": %s, "req": "step"}' % (field, value)).encode()]
    if kind == 4:
        return [json.dumps({"req": "platoon-" + rng.choice(["x", "init-params", "register2",
                                                            "done ", "barrierx"])}).encode()]
    if kind == 5:
        return [rng.randbytes(8) for _ in range(rng.randrange(2, 6))]  # multipart garbage
    if kind == 6:
        return [json.dumps({"req": "step", "worker_id": rng.randrange(-5, 1000)}).encode()]
    if kind == 7:
        return [b"[" * rng.randrange(1000, 100000)]
    if kind == 8:
        return [b"\xef\xbb\xbf" + valid]  # a BOM in front
    return [b""]


@pytest.mark.slow
def test_fuzzing_the_control_socket_never_stops_real_workers(serve):
    ctl = Counting(control_port=0, num_workers=2)
    serving = serve(ctl, timeout=120)
    ctx = zmq.Context()
    results = {}
    fuzzing_over = threading.Event()

    def real_worker(name):
        with Worker(ctl.control_port, timeout_s=20) as w:
            params = [np.zeros(1000)]
            w.init_shared_params(params, EASGD(0.5))
            steps = 0
            while not fuzzing_over.is_set() or steps < 200:  # work all through the fuzzing
                params[0] += 1.0
                w.sync_params()
                steps = w.send_req("step")
            results[name] = True

    try:
        workers = [threading.Thread(target=real_worker, args=(n,)) for n in ("a", "b")]
        for t in workers:
            t.start()
        fuzzer = ctx.socket(zmq.DEALER)
        fuzzer.linger = 0
        fuzzer.rcvtimeo = 10000
        fuzzer.connect("tcp://127.0.0.1:%d" % ctl.control_port)
        rng = random.Random(1234)
        sent = 3000
        for _ in range(sent):
            fuzzer.send_multipart(malformed_frames(rng))
            reply = json.loads(fuzzer.recv())  # every malformed message gets an error reply
            assert reply["ok"] is False and reply["error"]["message"]
        fuzzing_over.set()
        for t in workers:
            t.join(60)
        assert results == {"a": True, "b": True}
        serving.join(30)
        assert ctl.steps >= 200
    finally:
        fuzzing_over.set()
        ctx.destroy(linger=0)


def test_malformed_minibatches_raise_and_good_ones_still_arrive(serve, raw_data_socket):
    push, port = raw_data_socket, raw_data_socket.port
    ctl = Counting(control_port=0)
    serving = serve(ctl)
    rng = random.Random(99)
    with Worker(ctl.control_port, data_port=port, timeout_s=10) as w:
        for _i in range(500):
            frames = garbled_minibatch(rng) or [b""]
            push.send(frames)
            try:
                arrays = w.recv_mb()  # only a ProtocolError may come out
            except ProtocolError:
                continue
            # Only a header and data that happen to agree may decode, and then exactly.
            specs = json.loads(frames[0])
            assert [a.shape for a in arrays] == [tuple(sp["shape"]) for sp in specs]
            assert not any(a.flags.writeable for a in arrays)
        ctl_arrays = [np.arange(6.0).reshape(2, 3)]
        push.send([bytes(f) for f in encode_minibatch(ctl_arrays)])
        np.testing.assert_array_equal(w.recv_mb()[0], ctl_arrays[0])
    serving.join()


@pytest.mark.slow
def test_soak_sixteen_workers(procs, tmp_path):
    workers, steps = 16, 150
    out = tmp_path / "soak.json"
    ctl = procs("soak_controller.py", workers, workers * steps, out)
    port = int(ctl.wait_for_line("PORT").split()[1])
    started = [procs("soak_worker.py", port, steps) for _ in range(workers)]
    for w in started:
        assert w.wait(120) == 0, w.output
    assert ctl.wait(60) == 0, ctl.output
    result = json.loads(out.read_text())
    assert result["steps"] == workers * steps  # every request got its reply
    # ASGD: each worker's change reaches the centre exactly once, whatever the interleaving.
    np.testing.assert_allclose(result["centre"], result["total_change"], rtol=1e-9, atol=1e-9)
    first, last = result["rss_kib"]
    print("soak: %d requests answered, controller RSS %d -> %d KiB" % (result["steps"], first,
                                                                       last))
    assert last - first < 4096, "controller memory grew by %d KiB under load" % (last - first)
