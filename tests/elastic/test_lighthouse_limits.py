"""What a process without the job's secret can make the lighthouse, a node's lighthouse
client and a node's data-plane store do: bounded. Real sockets on 127.0.0.x (a stranger
connects from 127.0.0.3, so that its source address differs from the nodes')."""

import logging
import re
import socket
import threading
import time

import pytest
import zmq

from platoon._os.logthrottle import ThrottledLog
from platoon.elastic import MembershipSettings, generate_secret, load_secret, wire
from platoon.elastic.client import LighthouseClient
from platoon.elastic.lighthouse import Lighthouse, Limits
from platoon.errors import ElasticAuthError

from helpers import Proc

STRANGER = "127.0.0.3"  # a stranger's source address (any 127.x reaches 127.0.0.1)
SECRET = b"s" * 32


class Serving:
    """`lighthouse` served in a thread until the block ends."""

    def __init__(self, lighthouse):
        self.lighthouse, self._stop = lighthouse, threading.Event()
        self._thread = threading.Thread(target=lighthouse.serve, args=(self._stop.is_set,),
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self.lighthouse

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the lighthouse did not stop within 10 s"
        self.lighthouse.close()


def stranger_sockets(context, address, count, kind=zmq.REQ):
    socks = []
    for _ in range(count):
        sock = context.socket(kind)
        sock.linger = 0
        sock.connect("tcp://%s:0;%s" % (STRANGER, address))
        socks.append(sock)
    return socks


def replies_within(socks, timeout_s):
    """How many of `socks` get a message within `timeout_s` seconds (all waited together)."""
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    heard, deadline = set(), time.monotonic() + timeout_s
    while len(heard) < len(socks) and time.monotonic() < deadline:
        for sock, _ in poller.poll(50):
            sock.recv_multipart()
            heard.add(sock)
            poller.unregister(sock)
    return len(heard)


def vm_hwm_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1))


def test_a_frame_over_the_limit_is_dropped_unread_and_nodes_go_on(tmp_path):
    secret_file = str(tmp_path / "secret")
    generate_secret(secret_file)
    lighthouse = Proc(["-m", "platoon.elastic.lighthouse", "--bind", "127.0.0.1:0",
                       "--secret-file", secret_file, "--join-grace-s", "0.05"])
    context = zmq.Context()
    try:
        address = lighthouse.wait_for_line("lighthouse: serving on tcp://").split(
            "tcp://")[1].split()[0]
        before = vm_hwm_kib(lighthouse.pid)
        big = context.socket(zmq.DEALER)
        big.linger = 0
        big.connect("tcp://%s:0;%s" % (STRANGER, address))
        big.send_multipart([b"", b"x" * (64 << 20), b"m"])  # 64 MiB
        assert not big.poll(1500), "the lighthouse answered a 64 MiB request"
        # it read none of it (before: the whole frame was taken into memory, then refused)
        assert vm_hwm_kib(lighthouse.pid) - before < 16 << 10
        with LighthouseClient(address, "a", "127.0.0.1:1", secret=load_secret(secret_file),
                              heartbeat_interval_s=0.05) as client:
            assert client.wait_for_quorum(20.0).members == ("a",)
    finally:
        context.destroy(linger=0)
        lighthouse.kill()


def test_a_strangers_refusals_make_one_log_line_per_period_with_a_count(caplog):
    limits = Limits(refusals_per_source=10, log_period_s=0.5)
    context = zmq.Context()
    caplog.set_level(logging.WARNING, logger="platoon.elastic.lighthouse")
    try:
        with Serving(Lighthouse(MembershipSettings(), "127.0.0.1:0", SECRET, limits)) as lh:
            [flood] = stranger_sockets(context, lh.address, 1, zmq.DEALER)
            body, mac = wire.request(b"w" * 32, "heartbeat", "x", "h:1", 0, "")
            for _ in range(300):
                flood.send_multipart([b"", body, mac])
            answered = replies_within([flood], 1.0)
            while flood.poll(300):  # the replies that came: at most the source's refusals
                flood.recv_multipart()
                answered += 1
            assert answered == limits.refusals_per_source
            deadline = time.monotonic() + 5.0
            while not any("more" in r.getMessage() for r in caplog.records) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)  # the period ends, its count is logged (bounded)
    finally:
        context.destroy(linger=0)
    lines = [r.getMessage() for r in caplog.records]
    refused = [line for line in lines if "refused a request from %s" % STRANGER in line]
    assert len(refused) == 1 and "signature does not match" in refused[0], lines
    counted = [line for line in lines if line.startswith("299 more refused %s" % STRANGER)]
    assert len(counted) == 1, lines


def test_connections_past_a_sources_cap_go_unanswered_and_nodes_keep_their_quorum():
    limits = Limits(connections_per_source=20, refusals_per_source=1000)
    settings = MembershipSettings(1, 5.0, 0.05)
    context = zmq.Context()
    try:
        with Serving(Lighthouse(settings, "127.0.0.1:0", SECRET, limits)) as lh:
            socks = stranger_sockets(context, lh.address, 300)
            body, mac = wire.request(b"w" * 32, "heartbeat", "x", "h:1", 0, "")
            for sock in socks:
                sock.send_multipart([body, mac])
            with LighthouseClient(lh.address, "a", "127.0.0.1:1", secret=SECRET,
                                  heartbeat_interval_s=0.05) as client:
                assert client.wait_for_quorum(10.0).members == ("a",)
                assert replies_within(socks, 2.0) == limits.connections_per_source
                assert client.reachable
    finally:
        context.destroy(linger=0)


def test_a_node_drops_a_reply_over_the_limit_unread():
    context = zmq.Context()
    false = context.socket(zmq.ROUTER)
    false.linger = 0
    port = false.bind_to_random_port("tcp://127.0.0.1")
    peers = set()
    try:
        with LighthouseClient("127.0.0.1:%d" % port, "a", "127.0.0.1:1", secret=SECRET,
                              heartbeat_interval_s=0.05, request_timeout_s=0.3) as client:
            deadline = time.monotonic() + 5.0
            while len(peers) < 2 and time.monotonic() < deadline:
                if false.poll(100):
                    peer, _, _, _ = false.recv_multipart()
                    peers.add(peer)
                    false.send_multipart([peer, b"", b"x" * (wire.MAX_REPLY + 1), b""])
            # dropped by ZeroMQ: the node asks again on a new connection rather than reading
            # 16 MiB (before: it read it, and took it for the lighthouse refusing its secret)
            assert len(peers) >= 2
            client.current_quorum()  # no ElasticAuthError
            assert not client.reachable
    except ElasticAuthError as exc:
        pytest.fail("the node read a reply over the limit: %s" % exc)
    finally:
        context.destroy(linger=0)


def test_the_data_plane_store_listens_at_its_host_only():
    from platoon.elastic import StoreServer
    from platoon.elastic.store import StoreClient

    with StoreServer("127.0.0.2", secret=b"s" * 32) as store:
        host, port = store.address.rsplit(":", 1)
        assert host == "127.0.0.2"
        with pytest.raises(OSError):  # before: torch's store listened on every interface
            socket.create_connection(("127.0.0.1", int(port)), timeout=2.0).close()
        with StoreClient(store.address, b"s" * 32, 5.0) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
    with pytest.raises(OSError):  # closed with the node
        socket.create_connection((host, int(port)), timeout=2.0).close()


def test_a_throttled_log_tracks_a_bounded_number_of_kinds():
    lines = []

    class Sink:
        def warning(self, msg, *args):
            lines.append(msg % args)

    throttled = ThrottledLog(Sink(), period_s=60.0, burst=1, max_kinds=3)
    for source in range(10):
        for _ in range(5):
            throttled.warning("refused %d" % source, "refused %d", source)
    assert lines == ["refused 0", "refused 1", "refused 2", "warnings of more kinds than 3"]
    throttled.flush()
    counts = sorted(re.match(r"(\d+) more (.*) warning", line).group(1, 2) for line in lines[4:])
    assert counts == [("34", "other"), ("4", "refused 0"), ("4", "refused 1"), ("4", "refused 2")]


def test_what_a_node_says_of_itself_is_bounded():
    """A node's status is cut to MAX_STATUS bytes before it is sent (its final result's last
    metrics left out, and counted); the lighthouse takes a longer one for malformed, and keeps
    none of it."""
    import json
    metrics = {"metric_%02d_%s" % (i, "m" * 50): "v" * 100 for i in range(32)}
    status = {"name": "a", "state": "finished", "quorums": list(range(1000)), "rounds": 9,
              "error": "e" * 1000, "final_result": {"metrics": metrics, "worker": 0}}
    told = wire.node_status(status)
    assert len(json.dumps(told)) <= wire.MAX_STATUS
    assert "quorums" not in told and "name" not in told and len(told["error"]) == 100
    kept = told["final_result"]["metrics"]
    assert kept and list(kept) == list(metrics)[:len(kept)]
    assert told["final_result"]["metrics_dropped"] == 32 - len(kept)
    with Lighthouse(MembershipSettings(), "127.0.0.1:0", SECRET) as lighthouse:
        body, mac = wire.request(SECRET, "heartbeat", "a", "h:1", 0, "")
        fresh = wire.read_reply(SECRET, mac, *lighthouse.handle(b"p", body, mac, 1.0))
        assert fresh["challenge"] and not fresh["done"]
        body, mac = wire.request(SECRET, "status", "a", "h:1", 0, fresh["challenge"],
                                 status={"state": "x" * wire.MAX_STATUS})
        assert wire.read_reply(SECRET, mac, *lighthouse.handle(b"p", body, mac, 1.0))["error"] \
            == "malformed request"
        assert lighthouse.nodes == {}
