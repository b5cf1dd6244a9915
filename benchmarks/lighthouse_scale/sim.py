"""python -m benchmarks.lighthouse_scale.sim LIGHTHOUSE SECRET_FILE FIRST COUNT TOTAL
INTERVAL_S SECONDS

Simulates nodes FIRST..FIRST+COUNT-1 of TOTAL, each heartbeating every INTERVAL_S on its own
REQ socket from source address 127.1.(i // 250).(i % 250 + 1), for SECONDS; prints one JSON
line: each node's registration time and the time it first saw a quorum of TOTAL members
(time.time()), and every heartbeat's reply latency (s) once registered."""

import json
import sys
import time

import zmq

from platoon.elastic import load_secret, wire

REQUEST_TIMEOUT_S = 1.0


def source(i):
    return "127.1.%d.%d" % (i // 250, i % 250 + 1)


def main(argv):
    lighthouse, secret_file = argv[0], argv[1]
    first, count, total = int(argv[2]), int(argv[3]), int(argv[4])
    interval, seconds = float(argv[5]), float(argv[6])
    secret = load_secret(secret_file)
    context = zmq.Context()
    poller = zmq.Poller()
    nodes = {}

    def connect(i):
        sock = context.socket(zmq.REQ)
        sock.linger = 0
        sock.maxmsgsize = wire.MAX_REPLY
        sock.connect("tcp://%s:0;%s" % (source(i), lighthouse))
        poller.register(sock, zmq.POLLIN)
        return sock

    def send(node, now):
        body, mac = wire.request(secret, "heartbeat", "n%05d" % node["i"], source(node["i"]) +
                                 ":1", node["highest"], node["challenge"])
        node["sock"].send_multipart([body, mac])
        node["mac"], node["sent"] = mac, now

    by_sock = {}
    for i in range(first, first + count):
        node = {"i": i, "challenge": "", "highest": 0, "joined": None, "saw_all": None,
                "due": 0.0, "sent": None}
        node["sock"] = connect(i)
        nodes[i] = node
        by_sock[node["sock"]] = node
    latencies, timeouts, refused = [], 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        for node in nodes.values():
            if node["sent"] is None and now >= node["due"]:
                send(node, now)
            elif node["sent"] is not None and now - node["sent"] > REQUEST_TIMEOUT_S:
                timeouts += 1  # a new connection, as LighthouseClient does
                poller.unregister(node["sock"])
                del by_sock[node["sock"]]
                node["sock"].close(linger=0)
                node["sock"], node["challenge"], node["sent"] = connect(node["i"]), "", None
                by_sock[node["sock"]] = node
        for sock, _ in poller.poll(5):
            node = by_sock[sock]
            frames = sock.recv_multipart()
            now = time.monotonic()
            answer = wire.read_reply(secret, node["mac"], frames[0], frames[-1]) \
                if len(frames) == 2 else {"error": "malformed"}
            sent, node["sent"] = node["sent"], None
            if answer.get("error"):
                refused += 1
                node["due"] = now + 1.0
                continue
            node["challenge"] = answer["challenge"]
            if not answer["done"]:
                node["due"] = now  # a fresh challenge: send again at once
                continue
            if node["joined"] is None:
                node["joined"] = time.time()
            else:
                latencies.append(now - sent)
            quorum = answer["quorum"]
            if quorum is not None and quorum["id"] > node["highest"]:
                node["highest"] = quorum["id"]
                if len(quorum["members"]) == total and node["saw_all"] is None:
                    node["saw_all"] = time.time()
            node["due"] = now + interval
    print(json.dumps({"joined": [n["joined"] for n in nodes.values()],
                      "saw_all": [n["saw_all"] for n in nodes.values()],
                      "latencies": latencies, "timeouts": timeouts, "refused": refused}))
    context.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
