"""The minibatch channel with real worker processes: only workers that ask get minibatches,
rogue peers get none, and a dead worker's minibatches are re-sent."""

import numpy as np
import zmq

from platoon.protocol import encode_mb_request, mb_refusal
from test_faults import Tolerant


def got(proc):
    return [int(line.split()[1]) for line in proc.lines if line and line.startswith("GOT ")]


def worker_id(proc):
    return int(proc.wait_for_line("ID ").split()[1])


def test_minibatches_go_only_to_the_worker_that_asks(serve, procs):
    ctl = Tolerant(control_port=0, data_port=0, num_workers=2)
    serving = serve(ctl, timeout=60)
    idle = procs("mb_worker.py", ctl.control_port, ctl.data_port, "idle")
    idle_id = worker_id(idle)
    taker = procs("mb_worker.py", ctl.control_port, ctl.data_port, "take", 20)
    taker_id = worker_id(taker)
    takers = [ctl.send_mb([np.array([i])], timeout_s=10) for i in range(20)]
    assert takers == [taker_id] * 20 and idle_id != taker_id
    assert taker.wait(30) == 0, taker.output
    assert idle.wait(30) == 0, idle.output
    assert got(taker) == list(range(20))  # every one, in order, none lost
    serving.join()
    assert ctl.deaths == []


def test_rogue_peers_on_the_data_port_get_no_minibatch(serve, procs):
    ctl = Tolerant(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl, timeout=60)
    ctx = zmq.Context()
    try:
        address = "tcp://127.0.0.1:%d" % ctl.data_port
        pull = ctx.socket(zmq.PULL)
        dealer = ctx.socket(zmq.DEALER)
        for sock in (pull, dealer):
            sock.linger = 0
            sock.connect(address)
        taker = procs("mb_worker.py", ctl.control_port, ctl.data_port, "take", 20)
        real_id = worker_id(taker)
        # Asking as the real worker without its token, and with garbage.
        dealer.send(encode_mb_request(real_id, "0" * 32, 0, 100))
        dealer.send(b"junk")
        dealer.send_multipart([b"two", b"frames"])
        takers = [ctl.send_mb([np.array([i])], timeout_s=10) for i in range(20)]
        assert takers == [real_id] * 20
        assert taker.wait(30) == 0, taker.output
        assert got(taker) == list(range(20))
        serving.join()  # the job completes
        answers = []
        while dealer.poll(200):  # the refusals are there by now (sent before the job ended)
            answers.append(dealer.recv_multipart())
        assert len(answers) == 3
        for frames in answers:
            assert "refused" in mb_refusal(frames) or "minibatch request" in mb_refusal(frames)
        assert not pull.poll(200)
    finally:
        ctx.destroy(linger=0)


def test_a_killed_workers_minibatches_are_re_sent_to_a_survivor(serve, procs):
    ctl = Tolerant(control_port=0, data_port=0, num_workers=2, liveness_interval_s=0.2)
    serving = serve(ctl, timeout=60)
    victim = procs("mb_worker.py", ctl.control_port, ctl.data_port, "hold")
    victim_id = worker_id(victim)
    count = 20
    assert ctl.send_mb([np.array([0])], timeout_s=10) == victim_id
    # The victim asked for one more ahead (prefetch): it holds that one too.
    assert ctl.send_mb([np.array([1])], timeout_s=10) == victim_id
    assert victim.wait_for_line("HOLDING") == "HOLDING 0"
    victim.kill()
    survivor = procs("mb_worker.py", ctl.control_port, ctl.data_port, "take", count)
    survivor_id = worker_id(survivor)
    takers = [ctl.send_mb([np.array([i])], timeout_s=10) for i in range(2, count)]
    assert takers == [survivor_id] * (count - 2)
    ctl.flush_mb(timeout_s=20)  # re-sends 0 and 1, and waits until they are acknowledged
    assert survivor.wait(30) == 0, survivor.output
    assert sorted(set(got(survivor))) == list(range(count))
    assert ctl.resent_minibatches == 2
    serving.join()
    assert [death[0] for death in ctl.deaths] == [victim_id]
