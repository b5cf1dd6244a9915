"""The controller's check of a registering worker's pid: the kernel's socket diagnostics (fast)
and /proc/net (the fallback) find the same connections, and the other end of one connection is
found by its addresses, on real TCP sockets."""

import os
import socket
import subprocess
import sys

import pytest
import zmq

from platoon._controller import peers


@pytest.fixture
def connected():
    """(port, connect) where connect() opens one more established DEALER connection to a ROUTER
    on 127.0.0.1:port (or [::1]:port for an IPv6 one) from this process, and returns the
    frames the ROUTER received on it."""
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
        return router.recv_multipart(copy=False)
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


def test_the_other_end_of_one_connection_is_found_by_its_addresses(connected):
    """Before: each registration dumped every TCP connection of the machine, for IPv4 and
    IPv6 (about 300 us here); now one lookup by the connection's addresses."""
    port, connect = connected
    if peers._diag_inodes(port) is None:
        pytest.skip("no sock_diag netlink here (not Linux, or filtered)")
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        for host in ("127.0.0.1", "::1"):  # (on a dual-stack ROUTER: IPv4-mapped, and IPv6)
            fd = connect(host)[-1].get(zmq.SRCFD)  # the ROUTER's descriptor of the connection
            inode = peers.other_end_inode(fd)
            assert inode is not None and inode in peers._diag_inodes(port), host
            assert peers.holds_other_end(os.getpid(), fd), host
            assert not peers.holds_other_end(other.pid, fd), host
    finally:
        other.stdin.close()
        other.wait(10)
    with open(os.devnull) as not_a_socket:
        assert peers.other_end_inode(not_a_socket.fileno()) is None
    assert peers.other_end_inode(-1) is None
    assert not peers.holds_other_end(os.getpid(), -1)


@pytest.mark.skipif(os.getuid() != 0, reason="a connection from another user needs root")
def test_the_owner_of_the_other_end_is_told_and_its_connection_can_be_hung_up():
    """What the controller drops connections of other local users by: the uid of the other
    end, found without opening a descriptor, and a shutdown of our end."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        stranger = subprocess.Popen(
            [sys.executable, "-c", "import os, socket; os.setgid(65534); os.setuid(65534); "
             "s = socket.socket(); s.connect(('127.0.0.1', %d)); print(len(s.recv(1)), "
             "flush=True)" % port], stdout=subprocess.PIPE, text=True)
        try:
            server.settimeout(10)
            theirs, _ = server.accept()
            with theirs, socket.create_connection(("127.0.0.1", port)), \
                    server.accept()[0] as ours:
                diag = peers.open_diag()
                if diag is None:
                    pytest.skip("no sock_diag netlink here (not Linux, or filtered)")
                with diag:
                    assert peers.other_end(theirs.fileno(), diag)[1] == 65534
                    assert peers.other_end(ours.fileno(), diag)[1] == os.getuid()
                peers.hang_up(theirs.fileno())
                assert stranger.communicate(timeout=10)[0] == "0\n"  # it read the end
                assert theirs.fileno() >= 0  # hung up, still ours to close
        finally:
            stranger.kill()
            stranger.wait(10)
