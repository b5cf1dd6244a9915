"""python -m benchmarks.lighthouse_scale.sim LIGHTHOUSE SECRET_FILE FIRST COUNT TOTAL
INTERVAL_S SECONDS [NICE]

Simulates nodes FIRST..FIRST+COUNT-1 of TOTAL, each heartbeating every INTERVAL_S, or at the
lighthouse's pace when its replies ask for a longer one (`client.paced`, as LighthouseClient
does), on its own REQ socket from source address 127.1.(i // 250).(i % 250 + 1), for SECONDS;
prints one JSON line: each node's registration time and the time it first saw a quorum of
TOTAL members (time.time()), every heartbeat's reply latency (s) once registered, the requests
sent, its timeouts by cause, the longest pace the lighthouse last asked any of its nodes for
(None: none asked) and this process's CPU seconds. NICE (default 0): its niceness, added with
os.nice (a node on another machine does not compete for the lighthouse's cores).

A request unanswered REQUEST_TIMEOUT_S after it was sent (the first of a connection:
FIRST_REPLY_TIMEOUTS times that) is a timeout (the node then sends again on a new connection,
as LighthouseClient does), counted as "connecting" when it was the
first request of its connection (not answered before: the connection, or the lighthouse
reading it, was late) or "registered" (a connection answered before: a heartbeat the
lighthouse dropped or was slow to answer). Replies are read before timeouts are looked for,
and a socket with a reply waiting is not timed out: a simulator that falls behind its own
schedule does not count its lateness as the lighthouse's.

A latency is from just before a request is sent to the return of the poll (over every socket)
that saw its reply: not the checks of the replies read with it, but this process's own delays
in sending and in waking (when it waits for a core, or sends other nodes' heartbeats first).
Run with few nodes (the benchmark's probe: a process idle between heartbeats), its latencies
are nearly the lighthouse's and the network's."""

import heapq
import json
import os
import sys
import time

import zmq

from platoon.elastic import load_secret, wire
from platoon.elastic.client import FIRST_REPLY_TIMEOUTS, paced
from platoon.elastic.secret import Signer

REQUEST_TIMEOUT_S = 1.0


def source(i):
    return "127.1.%d.%d" % (i // 250, i % 250 + 1)


def main(argv):
    lighthouse, secret_file = argv[0], argv[1]
    first, count, total = int(argv[2]), int(argv[3]), int(argv[4])
    interval, seconds = float(argv[5]), float(argv[6])
    if len(argv) > 7 and int(argv[7]):
        os.nice(int(argv[7]))
    signer = Signer(load_secret(secret_file))
    context = zmq.Context()
    poller = zmq.Poller()

    def connect(node):
        sock = context.socket(zmq.REQ)
        sock.linger = 0
        sock.maxmsgsize = wire.MAX_REPLY
        sock.connect("tcp://%s:0;%s" % (source(node["i"]), lighthouse))
        poller.register(sock, zmq.POLLIN)
        node["sock"], node["challenge"], node["sent"], node["answered"] = sock, "", None, False
        by_sock[sock] = node

    by_sock = {}
    nodes = []
    for i in range(first, first + count):
        node = {"i": i, "name": "n%05d" % i, "address": source(i) + ":1", "highest": 0,
                "joined": None, "saw_all": None, "sock": None, "pace": None}
        nodes.append(node)
    # (when, index in `nodes`): the next sends. Each node has its phase in the interval (its
    # first send), and keeps it (a heartbeat an interval after the last one was due, as a
    # node's own timer would): nodes that share a process are not sent, nor read, in lockstep.
    # A node connects as it first sends (a burst of connections over one interval)
    start = time.monotonic()
    due = [(start + interval * index / count, index) for index in range(count)]
    for when, index in due:
        nodes[index]["due"] = when
    waiting = []  # (when timed out, when sent, index): requests in flight, soonest first
    latencies, refused, sent = [], 0, 0
    timeouts = {"connecting": 0, "registered": 0}
    cpu0 = time.process_time()
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        wait_ms = max(0, min(5.0, 1000 * ((due[0][0] if due else end) - now)))
        ready = poller.poll(wait_ms)
        arrived = time.monotonic()  # (every reply of this poll was there by now)
        for sock, _ in ready:
            node = by_sock[sock]
            frames = sock.recv_multipart()
            answer = wire.read_reply(signer, node["mac"], frames[0], frames[-1]) \
                if len(frames) == 2 else {"error": "malformed"}
            when, node["sent"], node["answered"] = node["sent"], None, True
            index = node["i"] - first
            if answer.get("error"):
                refused += 1
                node["due"] = arrived + 1.0
                heapq.heappush(due, (node["due"], index))
                continue
            node["challenge"] = answer["challenge"]
            if not answer["done"]:
                node["due"] = arrived
                heapq.heappush(due, (arrived, index))  # a fresh challenge: again at once
                continue
            if node["joined"] is None:
                node["joined"] = time.time()
            else:
                latencies.append(arrived - when)
            quorum = answer["quorum"]
            if quorum is not None and quorum["id"] > node["highest"]:
                node["highest"] = quorum["id"]
                if len(quorum["members"]) == total and node["saw_all"] is None:
                    node["saw_all"] = time.time()
            node["pace"] = wire.pace_of(answer)
            node["due"] = max(arrived, node["due"] + paced(interval, answer))
            heapq.heappush(due, (node["due"], index))
        now = time.monotonic()
        while waiting and now > waiting[0][0]:
            late, when, index = heapq.heappop(waiting)
            node = nodes[index]
            if node["sent"] != when:
                continue  # answered
            if node["sock"].poll(0):  # its reply is here: read by the next poll, not late
                heapq.heappush(waiting, (late, when, index))
                break
            timeouts["registered" if node["answered"] else "connecting"] += 1
            poller.unregister(node["sock"])  # a new connection, as LighthouseClient does
            del by_sock[node["sock"]]
            node["sock"].close(linger=0)
            node["sock"] = None
            node["due"] = now
            heapq.heappush(due, (now, index))
        while due and due[0][0] <= now:
            node = nodes[heapq.heappop(due)[1]]
            if node["sock"] is None:
                connect(node)
            body, mac = wire.request(signer, "heartbeat", node["name"], node["address"],
                                     node["highest"], node["challenge"])
            node["mac"], node["sent"] = mac, time.monotonic()
            node["sock"].send_multipart([body, mac])
            patience = REQUEST_TIMEOUT_S * (1 if node["answered"] else FIRST_REPLY_TIMEOUTS)
            heapq.heappush(waiting, (node["sent"] + patience, node["sent"], node["i"] - first))
            sent += 1
    print(json.dumps({"joined": [n["joined"] for n in nodes],
                      "saw_all": [n["saw_all"] for n in nodes],
                      "latencies": latencies, "timeouts": timeouts, "refused": refused,
                      "sent": sent, "pace_s": max((n["pace"] for n in nodes
                                                   if n["pace"] is not None), default=None),
                      "cpu_s": time.process_time() - cpu0}))
    context.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
