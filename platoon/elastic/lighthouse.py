"""The lighthouse: the small process that nodes of an elastic job register and heartbeat
with, and that numbers their quorums. No training runs in it and it needs no torch::

    python -m platoon.elastic.lighthouse --min-nodes 2 --heartbeat-timeout-s 5 \\
        --bind 0.0.0.0:29510 --secret-file SECRET

It keeps no state on disk: restarted, it learns the nodes again from their heartbeats and
numbers its next quorum above the highest id any of them reports.
"""

import argparse
import logging
import os
import secrets
import signal
import sys
import time
from typing import Dict, Optional, Sequence, Tuple

import zmq

from .._os.environment import JobEnvironment
from .._os.logthrottle import ThrottledLog
from .._os.process import announce
from ..errors import PlatoonError
from . import wire
from .quorum import Membership, MembershipSettings
from .secret import generate_secret, load_secret

log = logging.getLogger(__name__)

TICK_S = 0.05
CHALLENGE_TTL_S = 600.0  # a connection silent this long must fetch a new challenge
MAX_CONNECTIONS = 10000  # challenges kept at most (the oldest are forgotten first)


class Lighthouse:
    """Serves `settings` (MembershipSettings) on `bind` ("HOST:PORT"; port 0 picks one) for
    holders of `secret`. A context manager; `serve(stop)` runs until `stop()` is true."""

    def __init__(self, settings: MembershipSettings, bind: str, secret: bytes):
        self.membership = Membership(settings)
        self._secret = secret
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        host, _, port = bind.rpartition(":")
        try:
            if port == "0":
                port = str(self._socket.bind_to_random_port("tcp://" + host))
            else:
                self._socket.bind("tcp://%s:%s" % (host, port))
        except zmq.ZMQError as exc:
            self.close()
            raise PlatoonError("the lighthouse cannot bind tcp://%s:%s (%s): choose a free port "
                               "with --bind HOST:PORT" % (host, port, exc)) from None
        self.address = "%s:%s" % (host, port)
        self._challenges: Dict[bytes, Tuple[str, float]] = {}
        self._warnings = ThrottledLog(log)

    def _challenge_for(self, peer: bytes, now: float) -> str:
        if len(self._challenges) >= MAX_CONNECTIONS:
            oldest = min(self._challenges, key=lambda p: self._challenges[p][1])
            del self._challenges[oldest]
        challenge = secrets.token_hex(16)
        self._challenges[peer] = (challenge, now)
        return challenge

    def handle(self, peer: bytes, body: bytes, mac: bytes, now: float) -> Tuple[bytes, bytes]:
        """The reply frames to one request from connection `peer`."""
        data, why = wire.read_request(self._secret, body, mac)
        if data is None:
            log.warning("refused a request: %s", why)
            return wire.refusal(why)
        expected, issued = self._challenges.get(peer, ("", 0.0))
        done = bool(expected) and data["challenge"] == expected \
            and now - issued < CHALLENGE_TTL_S
        taken = False
        if done:
            if data["op"] == "leave":
                log.info("node %s leaves", data["node"])
                self.membership.leave(data["node"], data["incarnation"])
            else:
                taken = not self.membership.heartbeat(
                    data["node"], data["address"], data["highest_seen"], now, data["broken"],
                    data["incarnation"], data["unreachable"])
                if taken:
                    self._warnings.warning(
                        "name", "a second process heartbeats as node %s (from %s) while the "
                        "first is live: it waits until the first leaves or times out",
                        data["node"], data["address"])
        quorum = self.membership.quorum
        excluded = self.membership.excluded(now).get(data["node"]) if done else None
        return wire.reply(self._secret, mac, self._challenge_for(peer, now),
                          None if quorum is None else quorum.to_wire(), done, taken, excluded)

    def serve(self, stop=lambda: False) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not stop():
            if poller.poll(int(TICK_S * 1000)):
                frames = self._socket.recv_multipart()
                if len(frames) == 4 and frames[1] == b"":  # REQ: identity, delimiter, 2 frames
                    self._socket.send_multipart(
                        [frames[0], b""] + list(self.handle(frames[0], frames[2], frames[3],
                                                            time.monotonic())))
            now = time.monotonic()
            quorum = self.membership.tick(now)
            if quorum is not None:
                for name, why in sorted(self.membership.excluded(now).items()):
                    log.warning("node %s is out of the quorums: %s", name, why)
                log.info("quorum %d: %s", quorum.id, ", ".join(quorum.members))

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon.elastic.lighthouse",
        description="Membership of an elastic platoon job: numbered quorums of live nodes.")
    parser.add_argument("--min-nodes", type=int, default=1,
                        help="no quorum with fewer live nodes (default 1)")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=5.0, metavar="S",
                        help="a node silent this many seconds is out of the next quorum "
                             "(default 5; 1 for fast recovery on a quiet network)")
    parser.add_argument("--join-grace-s", type=float, default=0.3, metavar="S",
                        help="wait this long after a change for more joiners (default 0.3)")
    parser.add_argument("--bind", default="127.0.0.1:29510", metavar="HOST:PORT",
                        help="where nodes reach it (default 127.0.0.1:29510; port 0 picks one)")
    parser.add_argument("--secret-file", metavar="PATH",
                        help="the job's secret (default: $PLATOON_ELASTIC_SECRET_FILE)")
    parser.add_argument("--new-secret", metavar="PATH",
                        help="write a new secret file (0600) for a job to PATH and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, format="lighthouse: %(message)s",
                        level=os.environ.get("PLATOON_LOG_LEVEL", "INFO").upper())
    try:
        if args.new_secret:
            print("wrote a new secret to %s: copy it to every node" % generate_secret(
                args.new_secret))
            return 0
        settings = MembershipSettings(args.min_nodes, args.heartbeat_timeout_s, args.join_grace_s)
        secret = load_secret(args.secret_file)
        lighthouse = Lighthouse(settings, args.bind, secret)
    except (PlatoonError, ValueError, OSError) as exc:
        print("lighthouse: %s" % exc, file=sys.stderr)
        return 2
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    with lighthouse:
        log.info("serving on tcp://%s (min nodes %d, heartbeat timeout %g s)",
                 lighthouse.address, settings.min_nodes, settings.heartbeat_timeout_s)
        ready_fd = JobEnvironment.read("ready_fd").ready_fd  # platoon-launcher --elastic's
        if ready_fd is not None:
            announce(ready_fd, {"address": lighthouse.address})
        lighthouse.serve(lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
