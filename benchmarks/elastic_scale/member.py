"""One node of the scale benchmark, run in its namespace: its gloo group with every other node
(their addresses known in advance: each namespace has its own ports), then for each way of
averaging ("reduce-scatter", the round platoon makes; "all-gather", whole messages, the round it
replaced), a barrier, its link's sent bytes, ROUNDS means of an int8-coded array of N float32
with error feedback, a barrier and the bytes again. Prints one JSON line per way.

usage: member.py RANK SIZE N ROUNDS IP..."""

import json
import sys
import time

import numpy as np

from platoon.elastic import Quorum, QuorumGroup, StoreServer
from platoon.node.compress import ErrorFeedback, make_codec

PORT = 29650
SECRET = b"elastic-scale-benchmark"  # the job's secret (every member is a namespace here)
DEVICE = "eth0"


def tx_bytes():
    with open("/sys/class/net/%s/statistics/tx_bytes" % DEVICE) as f:
        return int(f.read())


def main():
    rank, size, n, rounds = (int(x) for x in sys.argv[1:5])
    ips = sys.argv[5:5 + size]
    names = tuple("n%02d" % i for i in range(size))
    with StoreServer(ips[rank], PORT, secret=SECRET):
        quorum = Quorum(1, names, tuple("%s:%d" % (ip, PORT) for ip in ips), "scale")
        with QuorumGroup(quorum, names[rank], timeout_s=120.0, secret=SECRET) as group:
            codec = make_codec("int8")
            rng = np.random.default_rng(rank)
            for way in ("reduce-scatter", "all-gather"):
                mean = group.compressed_mean if way == "reduce-scatter" else \
                    (lambda a, c, f: group._gathered_mean(a, c, f, None, range(size)))
                feedback = ErrorFeedback(n)
                group.all_gather_bytes(np.zeros(8, np.uint8))  # a barrier
                before, times, said = tx_bytes(), [], 0
                for _ in range(rounds):
                    array = rng.normal(size=n).astype(np.float32)
                    start = time.perf_counter()
                    _, sent = mean(array, codec, feedback)
                    times.append(time.perf_counter() - start)
                    said += sent
                group.all_gather_bytes(np.zeros(8, np.uint8))
                print(json.dumps({"way": way, "rank": rank, "size": size, "n": n,
                                  "rounds": rounds, "link_bytes": tx_bytes() - before,
                                  "counted_bytes": said, "message_bytes": codec.encoded_size(n),
                                  "round_s": sorted(times)[len(times) // 2]}), flush=True)


if __name__ == "__main__":
    main()
