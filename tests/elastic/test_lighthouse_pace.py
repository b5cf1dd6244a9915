"""The lighthouse paces its nodes' heartbeats (platoon.elastic.lighthouse `pace_s`, the
client's `paced`): in-process lighthouses (a real one, and an older one's replies from a raw
socket) with real LighthouseClients on 127.0.0.1."""

import contextlib
import json
import time

import pytest
import zmq

from platoon.elastic import LighthouseClient, MembershipSettings, wire
from platoon.elastic.client import paced
from platoon.elastic.lighthouse import Lighthouse, Limits, pace_s
from platoon.elastic.secret import Signer

from elastic_helpers import serving_lighthouse
from helpers import wait_until

SECRET = b"p" * 32


def _serving(limits, timeout_s=5.0):
    """A Lighthouse on 127.0.0.1 within `limits` (min nodes 1, grace 0.05 s) serving in a
    thread, stopped and joined as the block ends."""
    return serving_lighthouse(SECRET, 1, heartbeat_timeout_s=timeout_s, limits=limits)


def test_the_pace_is_the_live_nodes_over_the_rate_within_a_fifth_of_the_timeout():
    limits = Limits(heartbeats_per_s=2000)  # the default: 200 nodes keep their own 0.1 s
    assert pace_s(200, limits, 5.0) == pytest.approx(0.1)
    assert pace_s(1000, limits, 5.0) == pytest.approx(0.5)
    assert pace_s(100000, limits, 5.0) == pytest.approx(1.0)  # a fifth of the timeout
    assert paced(0.1, {"pace_s": 0.05}) == 0.1  # a node's own interval when longer
    assert paced(0.1, {"pace_s": 0.5}) == 0.5
    for older in ({}, {"pace_s": None}, {"pace_s": "1"}, {"pace_s": True},
                  {"pace_s": float("nan")}, {"pace_s": -1}):
        assert paced(0.1, older) == 0.1, older  # an older lighthouse's reply: its own


def test_the_pace_is_inside_what_the_reply_signs():
    settings = MembershipSettings(min_nodes=1)
    with Lighthouse(settings, "127.0.0.1:0", SECRET) as lighthouse:
        lighthouse.pace_s = 0.25
        body, mac = wire.request(SECRET, "heartbeat", "a", "h:1", 0, "")
        reply_body, reply_mac = lighthouse.handle(b"p", body, mac, 1.0)
        assert wire.read_reply(SECRET, mac, reply_body, reply_mac)["pace_s"] == 0.25
        forged = reply_body.replace(b'"pace_s": 0.25', b'"pace_s": 0.001')
        assert forged != reply_body
        assert "signature" in wire.read_reply(SECRET, mac, forged, reply_mac)["error"]


def test_nodes_heartbeat_at_the_lighthouses_pace_and_still_hear_each_quorum():
    """Four nodes asking for 0.05 s send a lighthouse of 20 heartbeats a second about that
    (each at 4 / 20 = 0.2 s), not 80 a second; a fifth node's quorum still reaches them all
    within a pace or two."""
    with _serving(Limits(heartbeats_per_s=20)) as lighthouse, contextlib.ExitStack() as stack:
        clients = [stack.enter_context(LighthouseClient(
            lighthouse.address, name, "h:%d" % i, secret=SECRET, heartbeat_interval_s=0.05))
            for i, name in enumerate("abcd")]
        wait_until(lambda: all(c.pace_s == pytest.approx(0.2) for c in clients), 10,
                   "every node to hear the pace of 4 nodes at 20 heartbeats a second")
        before, start = lighthouse.counts["requests"], time.monotonic()
        time.sleep(1.0)  # (a window to count in, not a synchronisation)
        sent = lighthouse.counts["requests"] - before
        rate = sent / (time.monotonic() - start)
        assert 1 <= sent and rate <= 30, "%.1f heartbeats a second (paced: 20, not: 80)" % rate

        first = clients[0].wait_for_quorum(timeout_s=10)
        joiner = stack.enter_context(LighthouseClient(
            lighthouse.address, "e", "h:9", secret=SECRET, heartbeat_interval_s=0.05))
        joined = joiner.wait_for_quorum(timeout_s=10, newer_than=first.id)
        seen = time.monotonic()
        pace = 5 / 20
        for client in clients:  # (each hears of it at its next heartbeat: within a pace)
            left = seen + 2 * pace + 1.0 - time.monotonic()  # (1 s: a loaded machine)
            assert client.wait_for_quorum(timeout_s=max(0.0, left), newer_than=first.id) \
                .members == joined.members == ("a", "b", "c", "d", "e")
        wait_until(lambda: joiner.pace_s == pytest.approx(pace), 10, "the pace of 5 nodes")


def test_a_reply_without_a_pace_leaves_a_node_at_its_own_interval():
    """An older lighthouse's signed replies carry no "pace_s": the node heartbeats at its own
    interval (0.05 s: about 20 in a second)."""
    signer = Signer(SECRET)
    context = zmq.Context()
    older = context.socket(zmq.ROUTER)
    older.linger = 0
    try:
        port = older.bind_to_random_port("tcp://127.0.0.1")
        with LighthouseClient("127.0.0.1:%d" % port, "a", "h:1", secret=SECRET,
                              heartbeat_interval_s=0.05, request_timeout_s=0.3) as client:
            heard, start = 0, None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (start is None
                                                   or time.monotonic() - start < 1.0):
                if not older.poll(100):
                    continue
                peer, _, _, mac = older.recv_multipart()
                body = json.dumps({"challenge": "c", "quorum": None, "done": True,
                                   "error": None, "taken": False, "excluded": None}).encode()
                older.send_multipart([peer, b"", body, signer.reply(mac, body)])
                if start is None:
                    start = time.monotonic()
                else:
                    heard += 1
            assert start is not None, "the node sent nothing to the older lighthouse"
            assert client.reachable and client.pace_s is None
        assert heard >= 8, "%d heartbeats in 1 s at the node's own 0.05 s" % heard
    finally:
        older.close(linger=0)
        context.term()
