"""A stranger to an elastic job that reaches a node's data plane store: for up to DURATION_S
seconds it connects as a torch.distributed TCPStore client (what the store was), lists the
keys, and sets every key it finds, and every gloo address key of ranks 0-7 under the quorum
prefixes it finds, to an address of its own; then it shakes hands with the store as a client
without the secret. Prints one JSON line: what it learned and what it managed to set.

usage: store_stranger.py HOST:PORT DURATION_S
"""

import datetime
import json
import os
import socket
import sys
import time

import torch.distributed as dist

HELLO = b"platoon-store/1\0"  # platoon.elastic.store's (a stranger reads the source too)


def as_tcpstore_client(host, port, deadline):
    learned, was_set, errors = [], [], []
    while time.monotonic() < deadline and not was_set:
        try:
            store = dist.TCPStore(host, port, is_master=False,
                                  timeout=datetime.timedelta(seconds=0.5))
            keys = store.list_keys()
            learned.extend(k for k in keys if k not in learned)
            prefixes = {k[:k.index("/0/") + 1] for k in keys if "/0/" in k}
            for key in list(keys) + ["%s0/%d" % (p, r) for p in prefixes for r in range(8)]:
                store.set(key, b"127.0.0.1:9 the stranger's address")
                was_set.append(key)
        except Exception as exc:  # noqa: BLE001 (reported: what the store made of it)
            errors.append("%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:200]))
    return learned, was_set, errors[-3:]


def without_the_secret(host, port):
    """What the store says to a client that answers its challenge with random bytes."""
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(HELLO + os.urandom(16))
        challenge_and_proof = conn.recv(48)
        conn.sendall(os.urandom(32))
        try:
            after = conn.recv(100)
        except OSError as exc:
            after = str(exc).encode()
    return len(challenge_and_proof), after.hex()


host, _, port = sys.argv[1].rpartition(":")
deadline = time.monotonic() + float(sys.argv[2])
learned, was_set, errors = as_tcpstore_client(host, int(port), deadline)
try:
    got, after = without_the_secret(host, int(port))
except OSError as exc:
    got, after = 0, str(exc)
print(json.dumps({"keys": learned, "set": was_set, "errors": errors,
                  "handshake_bytes": got, "after_a_wrong_proof": after}), flush=True)
