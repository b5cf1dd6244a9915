"""platoon.elastic.store: a node's data plane store serves the job's nodes only (a stranger that
reaches its port learns no key, sets none, and cannot pass for the store), and holds a bounded
amount; real sockets, a real stranger process, real gloo groups on 127.0.0.1."""

import json
import os
import secrets
import select
import socket
import threading
import time

import numpy as np
import pytest

from platoon.elastic import Quorum
from platoon.elastic.store import HELLO, StoreClient, StoreError, StoreLimits, StoreServer
from platoon.errors import QuorumBroken

from elastic_helpers import SLACK_S
from helpers import PROCS, Proc

SECRET = b"s" * 32
STRANGER = os.path.join(PROCS, "store_stranger.py")


def test_a_stranger_at_the_store_learns_no_key_and_cannot_redirect_a_member():
    pytest.importorskip("torch")
    from platoon.elastic import QuorumGroup
    from platoon.node.compress import make_codec

    with StoreServer("127.0.0.1", secret=SECRET) as store:
        quorum = Quorum(1, ("a", "b"), (store.address, "127.0.0.1:1"), secrets.token_hex(16))
        groups, failed = {}, {}

        def form(name):
            try:
                groups[name] = QuorumGroup(quorum, name, 20.0, secret=SECRET)
            except Exception as exc:  # noqa: BLE001 (before: gloo's MemoryError on its garbage)
                failed[name] = exc

        # rank 0 writes its addresses and waits for rank 1's while the stranger is at work
        first = threading.Thread(target=form, args=("a",))
        first.start()
        stranger = Proc([STRANGER, store.address, "1"])
        try:
            assert stranger.wait(30) == 0, stranger.output
            second = threading.Thread(target=form, args=("b",))
            second.start()
            for thread in (first, second):
                thread.join(30)
            assert not failed and sorted(groups) == ["a", "b"], failed
            report = json.loads(stranger.output.splitlines()[-1])
            # before: the stranger listed platoon/quorum/1/<nonce>/0/0 and set the others
            assert report["keys"] == [] and report["set"] == [], report
            assert quorum.nonce not in stranger.output
            assert report["handshake_bytes"] == 48 and report["after_a_wrong_proof"] == ""
            means = {}
            run = [threading.Thread(target=lambda n=n, v=v: means.__setitem__(
                n, groups[n].compressed_mean(np.full(4, v, np.float32), make_codec("float32"))[0]))
                for n, v in (("a", 1.0), ("b", 3.0))]
            for thread in run:
                thread.start()
            for thread in run:
                thread.join(30)
            assert [means[n].tolist() for n in ("a", "b")] == [[2.0] * 4] * 2
        finally:
            stranger.kill()
            for group in groups.values():
                group.close()


def test_a_member_refuses_a_store_without_the_secret_and_is_refused_without_it():
    pytest.importorskip("torch")
    from platoon.elastic import QuorumGroup

    # a process on rank 0's port that is not the job's store (its node died, a stranger
    # took the port) cannot hand the members addresses: the group fails, within its timeout
    with StoreServer("127.0.0.1", secret=b"not the job's secret") as impostor:
        quorum = Quorum(2, ("a", "b"), (impostor.address, "127.0.0.1:1"), "n0nce")
        started = time.monotonic()
        with pytest.raises(QuorumBroken, match=r"forming the group failed.*does not show this "
                                               r"node's secret: it is not the job's data plane"):
            QuorumGroup(quorum, "b", 2.0, secret=SECRET)
        assert time.monotonic() - started < 2.0 + SLACK_S
        assert impostor.held() == (0, 0)
    with StoreServer("127.0.0.1", secret=SECRET) as store:
        with StoreClient(store.address, b"another secret", 2.0) as stranger:
            with pytest.raises(StoreError, match="does not show this node's secret"):
                stranger.set("platoon/quorum/1/x/0/1", b"127.0.0.1:9")
        assert store.held() == (0, 0)


def test_the_store_holds_a_bounded_number_of_entries_and_bytes():
    limits = StoreLimits(max_keys=4, max_bytes=120, max_value_bytes=32)
    with StoreServer("127.0.0.1", secret=SECRET, limits=limits) as store, \
            StoreClient(store.address, SECRET, 2.0) as client:
        for k in range(10):
            client.set("k%d" % k, b"%02d" % k)
        # the oldest are forgotten (a past quorum's group's addresses)
        assert store.held() == (4, 16) and client.num_keys() == 4
        assert [client.check(["k%d" % k]) for k in range(10)] == [False] * 6 + [True] * 4
        assert client.get("k9") == b"09"
        for k in range(4):
            client.set("big%d" % k, b"x" * 30)
        keys, held = store.held()
        assert held <= 120 and keys == 3 and client.get("big3") == b"x" * 30
        with pytest.raises(StoreError, match="over the store's cap"):
            client.set("k", b"x" * 33)
        with pytest.raises(StoreError, match="over the store's cap"):  # a frame over it
            client.set("k", b"x" * 2000)
        assert client.get("big3") == b"x" * 30  # a new connection after that one
        with pytest.raises(StoreError, match="not set within 0.2 s"):
            client.get("never", timeout_s=0.2)


def _closed_by_the_store(conn):
    try:
        return conn.recv(48) == b""
    except ConnectionResetError:  # closed with what this end had sent unread
        return True


def test_the_store_bounds_connections_that_do_not_show_the_secret():
    limits = StoreLimits(handshakes_per_source=2, handshake_timeout_s=0.5)
    with StoreServer("127.0.0.1", secret=SECRET, limits=limits) as store:
        host, port = store.address.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
        try:
            started = time.monotonic()
            with socket.create_connection((host, int(port)), timeout=5) as third:
                third.sendall(HELLO + os.urandom(16))
                assert _closed_by_the_store(third)  # at once: two are already waiting
            for conn in silent:  # closed after the handshake's timeout
                assert _closed_by_the_store(conn)
            assert time.monotonic() - started < 0.5 + SLACK_S
        finally:
            for conn in silent:
                conn.close()
        with StoreClient(store.address, SECRET, 2.0) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"


def test_a_handshake_sent_a_byte_at_a_time_is_closed_within_its_timeout():
    limits = StoreLimits(handshake_timeout_s=0.3)
    with StoreServer("127.0.0.1", secret=SECRET, limits=limits) as store:
        host, port = store.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            started, closed = time.monotonic(), False
            for byte in HELLO + os.urandom(16):  # a byte every 0.2 s: 6.4 s in all
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                readable, _, _ = select.select([conn], [], [], 0.2)
                if readable and _closed_by_the_store(conn):
                    closed = True
                    break
            # before: each read had the timeout afresh, and the slot was held past it
            assert closed and time.monotonic() - started < 0.3 + SLACK_S
