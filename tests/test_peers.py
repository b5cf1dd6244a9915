"""The controller's check of a registering worker's pid: the kernel's socket diagnostics (fast)
and /proc/net (the fallback) find the same connections, on real TCP sockets."""

import os
import subprocess
import sys

import pytest
import zmq

from platoon._controller import peers


@pytest.fixture
def connected():
    """(port, connect) where connect() opens one more established DEALER connection to a ROUTER
    on 127.0.0.1:port (or [::1]:port for an IPv6 one) from this process."""
    ctx = zmq.Context()
    sockets = []

    def socket(kind, ipv6):
        sock = ctx.socket(kind)
        sock.linger = 0
        sock.ipv6 = ipv6
        sockets.append(sock)
        return sock

    router = socket(zmq.ROUTER, True)
    port = router.bind_to_random_port("tcp://*")

    def connect(host="127.0.0.1"):
        dealer = socket(zmq.DEALER, ":" in host)
        dealer.connect("tcp://%s:%d" % ("[%s]" % host if ":" in host else host, port))
        dealer.send(b"hello")
        assert router.poll(5000), "no connection within 5 s"
        router.recv_multipart()
    try:
        yield port, connect
    finally:
        for sock in sockets:
            sock.close()
        ctx.term()


def test_both_ways_of_asking_the_kernel_find_the_same_connections(connected):
    """Before: every registration read /proc/net/tcp and tcp6, several ms each here."""
    port, connect = connected
    connect()
    connect("::1")
    via_diag = peers._diag_inodes(port)
    if via_diag is None:
        pytest.skip("no sock_diag netlink here (not Linux, or filtered)")
    via_proc = peers._proc_inodes(port)
    if via_proc is None:
        pytest.skip("/proc/net/tcp cannot be read here")
    assert len(via_diag) == 2 and via_diag == via_proc
    assert peers.count_connections(os.getpid(), port) == 2
    assert peers.count_connections(os.getpid(), port + 1 if port < 65535 else port - 1) == 0


def test_another_process_holds_none_of_our_connections(connected):
    port, connect = connected
    connect()
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert peers.count_connections(other.pid, port) == 0
    finally:
        other.stdin.close()
        other.wait(10)
    with pytest.raises(LookupError, match="no process %d" % other.pid):
        peers.count_connections(other.pid, port)
