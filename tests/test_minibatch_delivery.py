"""The minibatch channel with real worker processes: only workers that ask get minibatches,
rogue peers get none (and cannot stall delivery), a dead worker's minibatches are re-sent,
a reset data connection loses none, and a forked feeder is told to use a thread."""

import math
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import zmq
from test_faults import Tolerant
from test_registration import TcpProxy

from platoon import Controller, MinibatchTimeout, Worker
from platoon.protocol import encode_mb_request, encode_minibatch, mb_refusal


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
        # The controller reads requests while it delivers or flushes, and this connection
        # may still be starting (under load, after the last delivery): flush until answered.
        answers, deadline = [], time.monotonic() + 20
        while not dealer.poll(50):
            assert time.monotonic() < deadline, "the rogue request got no answer within 20 s"
            ctl.flush_mb(timeout_s=1)
        answers.append(dealer.recv_multipart())
        takers = [ctl.send_mb([np.array([i])], timeout_s=10) for i in range(20)]
        assert takers == [real_id] * 20
        assert taker.wait(30) == 0, taker.output
        assert got(taker) == list(range(20))
        serving.join()  # the job completes
        while dealer.poll(200):  # any further answers are there by now
            answers.append(dealer.recv_multipart())
        assert len(answers) == 1  # one answer a connection; the rest is dropped unread
        assert "refused: no registered worker %d with that token" % real_id \
            in mb_refusal(answers[0])
        assert not pull.poll(200)
    finally:
        ctx.destroy(linger=0)


def batch(i):
    return [np.full(125, i, np.int64)]  # 1000 bytes; about 1.1 KB packed


def test_a_killed_workers_minibatches_are_re_sent_to_a_survivor(serve, procs):
    """What a worker can hold unacknowledged is bounded in bytes: the controller sends while
    it holds less than its window (here 4,000 bytes), so it holds at most the window plus
    one minibatch. Before: a count, 1 + prefetch minibatches whatever their size."""
    ctl = Tolerant(control_port=0, data_port=0, num_workers=2, liveness_interval_s=0.2)
    serving = serve(ctl, timeout=60)
    window = 4000
    victim = procs("mb_worker.py", ctl.control_port, ctl.data_port, "hold", window)
    victim_id = worker_id(victim)
    size = len(encode_minibatch(batch(0))[0])
    held = math.ceil(window / size)
    assert held == 4 and (held - 1) * size < window <= held * size < window + size
    count = 20
    assert [ctl.send_mb(batch(i), timeout_s=10) for i in range(held)] == [victim_id] * held
    with pytest.raises(MinibatchTimeout):  # the victim's window is full: no one else asks
        ctl.send_mb(batch(held), timeout_s=0.3)
    assert victim.wait_for_line("HOLDING") == "HOLDING 0"
    victim.kill()
    survivor = procs("mb_worker.py", ctl.control_port, ctl.data_port, "take", count)
    survivor_id = worker_id(survivor)
    takers = [ctl.send_mb(batch(i), timeout_s=10) for i in range(held, count)]
    assert takers == [survivor_id] * (count - held)
    ctl.flush_mb(timeout_s=20)  # re-sends the victim's, and waits until they are acknowledged
    assert survivor.wait(30) == 0, survivor.output
    assert sorted(set(got(survivor))) == list(range(count))
    assert ctl.resent_minibatches == held
    serving.join()
    assert [death[0] for death in ctl.deaths] == [victim_id]


def test_flush_mb_returns_after_the_data_connection_is_reset(serve):
    """Before: the worker's acknowledgements came on the new connection, the minibatches
    sent on the old one stayed unacknowledged, and flush_mb never returned."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl, timeout=60)
    link = TcpProxy(ctl.data_port)
    got_first, reset_done, errors, seen = threading.Event(), threading.Event(), [], set()

    def work():
        try:
            with Worker(ctl.control_port, timeout_s=20) as w:
                w.init_mb_sock(link.port, prefetch=1)
                seen.add(int(w.recv_mb()[0][0]))  # holds 0; 1 is prefetched
                got_first.set()
                assert reset_done.wait(20)
                while seen != set(range(6)):
                    seen.add(int(w.recv_mb()[0][0]))
                assert int(w.recv_mb()[0][0]) == -1  # waiting here acknowledges the rest
        except Exception as exc:  # reported by the assertions below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        for i in range(2):
            ctl.send_mb([np.array([i])], timeout_s=10)
        assert got_first.wait(20)
        link.reset()  # a TCP RST on the data connection: ZeroMQ reconnects
        reset_done.set()
        for i in range(2, 6):
            ctl.send_mb([np.array([i])], timeout_s=10)
        ctl.flush_mb(timeout_s=15)
        ctl.send_mb([np.array([-1])], timeout_s=10)
    finally:
        worker.join(30)
        link.close()
    assert not errors and seen == set(range(6))
    serving.join()


def ss(*args):
    """`ss -tnH ARGS` (iproute2): TCP sockets without a header line."""
    done = subprocess.run(["ss", "-tnH"] + list(args), capture_output=True, text=True,
                          timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout


def connections_to(port):
    """{local port: (Recv-Q, bytes received)} of the established connections to port."""
    found, local = {}, None
    for line in ss("-i", "state", "established", "dport", "=", ":%d" % port).splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # Recv-Q Send-Q local peer
            fields = line.split()
            local = int(fields[2].rsplit(":", 1)[1])
            found[local] = (int(fields[0]), 0)
        elif local is not None:  # its details
            match = re.search(r"bytes_received:(\d+)", line)
            if match:
                found[local] = (found[local][0], int(match.group(1)))
    return found


def wait_for(condition, what, timeout=20.0):
    """The first true value of condition() (polled); fails the test after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "%s: not within %.3g s" % (what, timeout)
        time.sleep(0.02)


needs_ss_kill = pytest.mark.skipif(
    shutil.which("ss") is None or os.geteuid() != 0,
    reason="resets a worker's TCP connection with `ss -K`, which needs iproute2 and root")


@needs_ss_kill
def test_no_minibatch_is_lost_when_a_worker_dies_after_a_reset_of_its_data_connection(
        serve, procs):
    """The worker's connection is reset (`ss -K`: its kernel aborts the socket and sends the
    controller a RST; ZeroMQ reconnects) while 7 minibatches wait in its queue; its first
    request on the new connection acknowledges 2 of them. It takes up to minibatch 10 and
    holds it, and is killed. Before: the controller numbered its minibatches from that
    stale 2, so the worker's later requests acknowledged minibatches it had not taken;
    they were not re-sent when it died, and flush_mb returned without them."""
    ctl = Tolerant(control_port=0, data_port=0, num_workers=2, liveness_interval_s=0.2)
    serving = serve(ctl, timeout=90)
    count, last = 24, 10
    victim = procs("mb_worker.py", ctl.control_port, ctl.data_port, "pause", last)
    victim_id = worker_id(victim)
    takers = [ctl.send_mb(batch(i), timeout_s=10) for i in range(8)]  # its window: 8
    assert takers == [victim_id] * 8
    assert victim.wait_for_line("HOLDING") == "HOLDING 0"
    # Every byte of the 8 is in its ZeroMQ queue (read from the kernel), 7 not yet taken.
    size = len(encode_minibatch(batch(0))[0])
    [(local, _)] = wait_for(
        lambda: [(port, got) for port, (queued, got) in connections_to(ctl.data_port).items()
                 if not queued and got >= 8 * size + 64],
        "the victim receiving its 8 minibatches")
    ss("-K", "state", "established", "sport", "=", ":%d" % local)
    if local in connections_to(ctl.data_port):
        pytest.skip("`ss -K` cannot abort sockets here (a kernel without "
                    "CONFIG_INET_DIAG_DESTROY)")
    wait_for(lambda: connections_to(ctl.data_port), "the victim reconnecting")
    os.kill(victim.pid, signal.SIGUSR1)
    # Feed it while it takes, until it holds minibatch `last` and the controller, having
    # read its last requests, has no room for more (a send times out after it is HELD).
    i, held, deadline = 8, False, time.monotonic() + 60
    while i < count:
        assert time.monotonic() < deadline, victim.output
        try:
            assert ctl.send_mb(batch(i), timeout_s=1.0) == victim_id
            i += 1
        except MinibatchTimeout:
            if held:
                break
            if i > last:  # it has been sent every one it takes
                held = victim.wait_for_line("HELD", timeout=30) == "HELD"
    victim.kill()
    survivor = procs("mb_worker.py", ctl.control_port, ctl.data_port, "drain")
    worker_id(survivor)
    for j in range(i, count):
        ctl.send_mb(batch(j), timeout_s=30)
    ctl.flush_mb(timeout_s=30)  # until every one is acknowledged: re-sent ones too
    ctl.send_mb([np.full(125, -1, np.int64)], timeout_s=30)
    assert survivor.wait(60) == 0, survivor.output
    missing = set(range(count)) - set(got(victim)) - set(got(survivor))
    assert not missing, "minibatches %s reached no worker (victim got %s, survivor %s)" % (
        sorted(missing), got(victim), got(survivor))
    serving.join()
    assert [death[0] for death in ctl.deaths] == [victim_id]


def test_an_unauthenticated_flood_does_not_stall_send_mb(serve, procs):
    """Before: the controller read the flood until it ended, so send_mb waited as long
    (about the flood's 8 s instead of milliseconds)."""
    ctl = Tolerant(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl, timeout=90)
    count = 40
    taker = procs("mb_worker.py", ctl.control_port, ctl.data_port, "take", count)
    worker_id(taker)
    calm = timed_sends(ctl, range(10))
    flood = procs("flood_data.py", ctl.data_port, 8)
    flood.wait_for_line("FLOODING")
    flooded = timed_sends(ctl, range(10, count))
    print("send_mb: calm max %.4f s, under the flood max %.4f s" % (max(calm), max(flooded)))
    assert max(flooded) < 2.0, flooded
    assert taker.wait(30) == 0, taker.output
    assert got(taker) == list(range(count))
    assert flood.popen.poll() is None, flood.output  # the flood lasted throughout
    flood.kill()
    serving.join()


def timed_sends(ctl, indices):
    times = []
    for i in indices:
        start = time.monotonic()
        ctl.send_mb([np.array([i])], timeout_s=20)
        times.append(time.monotonic() - start)
    return times


def _feed_from_a_fork(ctl, results):
    for call in (lambda: ctl.send_mb([np.zeros(1)], timeout_s=5), lambda: ctl.flush_mb(5)):
        try:
            call()
            results.put(("returned", ""))
        except Exception as exc:
            results.put((type(exc).__name__, str(exc)))


def test_send_mb_in_a_forked_child_of_the_controller_raises_at_once():
    """Before: the child's sends went nowhere (the sockets' I/O threads do not survive
    fork) and its workers timed out."""
    fork = multiprocessing.get_context("fork")
    with Controller(control_port=0, data_port=0, num_workers=1) as ctl:
        results = fork.Queue()
        child = fork.Process(target=_feed_from_a_fork, args=(ctl, results))
        child.start()
        try:
            answers = [results.get(timeout=30) for _ in range(2)]
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join(5)
            results.close()
            results.join_thread()
    for name, message in answers:
        assert name == "UsedAfterFork", (name, message)
        assert "forked" in message and "thread" in message, message


@pytest.mark.parametrize("how, failure", [
    ("return", None),  # the script ended: the worker is done
    ("exit3", None),  # the controller cannot tell; the launcher fails the job on its code
    ("raise", "RuntimeError: the training script failed"),
    ("os_exit", "died"),  # no exit handlers ran: noticed dead
])
def test_a_worker_process_ending_without_close(serve, procs, how, failure):
    ctl = Tolerant(control_port=0, num_workers=1, liveness_interval_s=0.2)
    serving = serve(ctl, timeout=30)
    proc = procs("unclosed_worker.py", ctl.control_port, how)
    wid = worker_id(proc)
    proc.wait(30)
    serving.join()
    if failure is None:
        assert ctl.deaths == []
    else:
        [(dead, info, _)] = ctl.deaths
        assert dead == wid
        assert info.get("error", "died") == failure, info


def test_acknowledgements_sent_just_before_a_worker_leaves_are_honoured(serve, procs):
    """A worker that acknowledges its minibatches and closes at once: its control goodbye
    can be handled before the requests on the data socket are read (here always: nothing
    reads the data socket until the serve loop has ended). That last acknowledgement, and
    the data goodbye after it, still count: nothing stays held, nothing is re-sent."""
    ctl = Tolerant(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl, timeout=30)
    proc = procs("mb_worker.py", ctl.control_port, ctl.data_port, "ackleave", 5)
    wid = worker_id(proc)
    assert [ctl.send_mb([np.array([i])], timeout_s=10) for i in range(5)] == [wid] * 5
    assert proc.wait(30) == 0, proc.output
    assert got(proc) == list(range(5))
    serving.join()  # the control goodbye was handled: the worker has left the job
    ctl.flush_mb(timeout_s=5)  # reads the acknowledgement, then the data goodbye
    assert ctl.resent_minibatches == 0 and ctl.deaths == []
