"""A node of an elastic job, for tests: heartbeats to the lighthouse and prints each quorum
that holds it; with --value V, also averages an array of V's over each such quorum's gloo
group in int8 (one round per quorum).

usage: elastic_node.py LIGHTHOUSE NAME [--value V]
prints "quorum ID: NAME NAME..." per quorum, "round ID size N mean M digest D" per round,
"broken ID: ..." for a failed round, "refused: ..." (exit 3) if the lighthouse refuses it.
Exits by itself after 60 s.
"""

import argparse
import hashlib
import sys
import time

import numpy as np

from platoon.elastic import LighthouseClient, load_secret
from platoon.errors import ElasticAuthError, QuorumBroken, QuorumTimeout

parser = argparse.ArgumentParser()
parser.add_argument("lighthouse")
parser.add_argument("name")
parser.add_argument("--value", type=float)
args = parser.parse_args()

store = None
if args.value is not None:
    from platoon.elastic import QuorumGroup, StoreServer
    from platoon.node.compress import ErrorFeedback, make_codec
    store = StoreServer("127.0.0.1", secret=load_secret())
    codec, feedback = make_codec("int8"), ErrorFeedback(1000)
address = store.address if store is not None else "127.0.0.1:1"
end = time.monotonic() + 60
with LighthouseClient(args.lighthouse, args.name, address) as client:
    last = 0
    while time.monotonic() < end:
        try:
            quorum = client.wait_for_quorum(timeout_s=1.0, newer_than=last)
        except QuorumTimeout:
            continue
        except ElasticAuthError as exc:
            print("refused: %s" % exc, flush=True)
            sys.exit(3)
        last = quorum.id
        print("quorum %d: %s" % (quorum.id, " ".join(quorum.members)), flush=True)
        if store is None:
            continue
        try:
            with QuorumGroup(quorum, args.name, timeout_s=5.0, secret=client.secret) as group:
                mean, _ = group.compressed_mean(np.full(1000, args.value, np.float32), codec,
                                                feedback)
        except QuorumBroken as exc:
            print("broken %d: %s" % (quorum.id, exc), flush=True)
            continue
        print("round %d size %d mean %.6f digest %s" % (
            quorum.id, quorum.size, float(mean[0]),
            hashlib.sha1(mean.tobytes()).hexdigest()[:12]), flush=True)
