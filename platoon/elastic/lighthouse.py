"""The lighthouse: the small process that nodes of an elastic job register and heartbeat
with, and that numbers their quorums. No training runs in it and it needs no torch::

    python -m platoon.elastic.lighthouse --min-nodes 2 --heartbeat-timeout-s 5 \\
        --bind 0.0.0.0:29510 --secret-file SECRET

It keeps no state on disk: restarted, it learns the nodes again from their heartbeats and
numbers its next quorum above the highest id any of them reports.

A node silent for the heartbeat timeout is out of the next quorum; one that a member reports
gone (its data plane stopped answering when a round of their group broke, or while their
next group waited for it) is out once silent for `Membership.gone_silence_s` (1 s at up to a
few hundred nodes), so that the others go on without waiting out the timeout for a dead
process.

What a process without the secret can make it do is bounded (`Limits`): a frame over
`wire.MAX_BODY` bytes is dropped by ZeroMQ before it is read (the connection with it); at most
`connections_per_source` connections from one source address are served (the others' requests
are dropped unanswered); unsigned requests from one source get at most `refusals_per_source`
replies per `log_period_s` (then none: a REQ socket so refused sends nothing more), and one
log line per source per period, with a count. What a node says of itself (its state, its final
result) is kept only from signed requests, at most `wire.MAX_STATUS` bytes a node and
`MAX_CONNECTIONS` nodes.

It paces its nodes' heartbeats (as large membership services do), so that what they send it
stays near `Limits.heartbeats_per_s` whatever their number: each reply asks for a heartbeat
no more often than every `pace_s` (live nodes / that rate, within a fifth of the heartbeat
timeout); a node heartbeats at that pace or its own interval, whichever is longer. The cost:
the members of a quorum hear of the next one at their next heartbeat, so with more nodes than
the rate's tenth (200 by default) a joiner's group may wait up to one pace longer to form
(0.5 s at 1,000 nodes); with fewer, the pace is under a node's own 0.1 s and nothing changes.

A burst of connections (a job's nodes started together) waits in the kernel until it is
accepted (a listen backlog of BACKLOG, which net.core.somaxconn caps), rather than losing
its SYNs (a node's first heartbeat then waits for their retransmission, 1 s or more).

Per heartbeat it reads, checks and answers one signed request; replies to the requests read
together are sent together, its HMAC keys are set up once, a reply is formatted rather than
encoded, and the membership is ticked every TICK_S, not per message.
"""

import argparse
import json
import logging
import os
import secrets
import signal
import sys
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import zmq
from zmq.backend import Socket as _RawSocket

from .._os.elasticsettings import LighthouseSettings, Limits
from .._os.environment import JobEnvironment
from .._os.logthrottle import ThrottledLog
from .._os.process import announce
from .._os.statusfile import quorum_entry, write_status
from ..errors import PlatoonError
from . import wire
from .quorum import Membership, MembershipSettings
from .secret import Signer, generate_secret, load_secret

log = logging.getLogger(__name__)

TICK_S = 0.05  # the membership is ticked this often (not after every message)
SWEEP_S = 1.0  # idle connections and stale challenges are looked for this often
STATUS_EVERY_S = 0.5  # the status file is rewritten at most this often for nodes' statuses
CHALLENGE_TTL_S = 600.0  # a connection silent this long must fetch a new challenge
CHALLENGES_PER_READ = 64  # challenges made of one read of the system's randomness
MAX_CONNECTIONS = 10000  # connections served at once (new ones wait for idle ones to go)
IDLE_S = 10.0  # a connection silent this long no longer counts against its source's cap
BACKLOG = 4096  # connections the kernel holds before they are accepted (net.core.somaxconn caps)
DRAIN = 64  # requests read, then answered together, between two polls at most
# The pace asked is at most the heartbeat timeout over this: a node then heartbeats at least
# 5 times a timeout, so that a request lost (its 1 s request timeout, then a new connection
# and its challenge) or answered late leaves it several more before it is counted out, and a
# quorum change reaches every member within a fifth of the timeout (1 s at the default 5 s).
PACE_OF_TIMEOUT = 5
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)  # (ints: no enum arithmetic a frame)
_send = _RawSocket.send  # (pyzmq's own send under its wrapper: half the CPU of a reply's frames)


def pace_s(live: int, limits: Limits, heartbeat_timeout_s: float) -> float:
    """How often, at most, the lighthouse asks each of `live` nodes to heartbeat (seconds):
    so that they send about `limits.heartbeats_per_s` in all, and never less often than
    PACE_OF_TIMEOUT times per `heartbeat_timeout_s`."""
    return min(live / limits.heartbeats_per_s, heartbeat_timeout_s / PACE_OF_TIMEOUT)


class Lighthouse:
    """Serves `settings` (MembershipSettings) on `bind` ("HOST:PORT"; port 0 picks one) for
    holders of `secret`, within `limits` (default `Limits()`), writing its status (its address,
    latest quorum and each node's latest word: `platoon._os.statusfile`) to `status_file` as
    `serve` starts, at each new quorum, at most every STATUS_EVERY_S as nodes' statuses change,
    and as it ends (None: nowhere). Its replies ask for heartbeats no more often than
    `pace_s` (`pace_s()` of the live nodes as of the last tick). A context manager;
    `serve(stop)` runs until `stop()` is true."""

    def __init__(self, settings: MembershipSettings, bind: str, secret: bytes,
                 limits: Optional[Limits] = None, status_file: Optional[str] = None) -> None:
        self.membership = Membership(settings)
        self.limits = Limits() if limits is None else limits
        self.status_file = status_file
        self._signer = Signer(secret)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.maxmsgsize = wire.MAX_BODY  # ZeroMQ drops a larger frame unread
        self._socket.backlog = BACKLOG
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
        self._random = ""  # hex digits not yet given out as challenges
        self._peers: Dict[bytes, Tuple[str, float]] = {}  # connection -> (source, last heard)
        self._sources: Dict[str, int] = {}  # source -> connections in `_peers`
        self._refusals: Dict[str, int] = {}  # source -> refusals replied to in this period
        self._period = time.monotonic()  # when `_refusals`' period began
        self._quorum_json: Tuple[Optional[object], str] = (None, "null")
        self.pace_s = 0.0  # the pace its replies ask for (`pace_s()`; set at each tick)
        self.nodes: Dict[str, wire.Message] = {}  # each node's latest status (`wire.node_status`)
        self._nodes_changed = False  # since the status file was last written
        self._warnings = ThrottledLog(log, self.limits.log_period_s)
        self._refused = ThrottledLog(log, self.limits.log_period_s, burst=1)
        # what `serve` did: requests read, reads that found some (a read takes at most DRAIN),
        # requests dropped unanswered (a capped source, not a REQ envelope, a source past its
        # refusals), refused (unsigned, malformed: some answered, see `handle`)
        self.counts = {"requests": 0, "reads": 0, "dropped": 0, "refused": 0}

    def _challenge_for(self, peer: bytes, now: float) -> str:
        if not self._random:  # (one read of the system's randomness for many challenges)
            self._random = secrets.token_hex(16 * CHALLENGES_PER_READ)
        challenge, self._random = self._random[:32], self._random[32:]
        self._challenges[peer] = (challenge, now)
        return challenge

    def _admit(self, peer: bytes, frame: zmq.Frame, now: float) -> Optional[str]:
        """The source address of a request on connection `peer` (`frame`: its first), or None
        when it is dropped unanswered: its source is at its cap, or the lighthouse at
        MAX_CONNECTIONS."""
        known = self._peers.get(peer)
        if known is not None:
            source = known[0]
        else:
            try:
                source = str(frame.get("Peer-Address"))
            except zmq.ZMQError:  # (not a TCP connection)
                source = "?"
            cap = self.limits.connections_per_source
            held = self._sources.get(source, 0)
            if (cap and held >= cap) or len(self._peers) >= MAX_CONNECTIONS:
                self._refused.warning(
                    "capped " + source, "dropped requests of new connections from %s: it holds "
                    "%d connections (at most %d from one source address, %d in all; give "
                    "--max-connections-per-source when many nodes share an address)",
                    source, held, cap, MAX_CONNECTIONS)
                return None
            self._sources[source] = held + 1
        self._peers[peer] = (source, now)
        return source

    def _forget_idle(self, now: float) -> None:
        """Connections silent for IDLE_S no longer count (nor their challenges past the
        TTL); a new period of refusals begins every `log_period_s`."""
        for peer, (source, heard) in list(self._peers.items()):
            if now - heard > IDLE_S:
                del self._peers[peer]
                left = self._sources[source] - 1
                if left:
                    self._sources[source] = left
                else:
                    del self._sources[source]
                if now - heard > CHALLENGE_TTL_S:
                    self._challenges.pop(peer, None)
        for peer in [p for p in self._challenges if p not in self._peers]:
            if now - self._challenges[peer][1] > CHALLENGE_TTL_S:
                del self._challenges[peer]
        if now - self._period >= self.limits.log_period_s:
            self._period, self._refusals = now, {}
        self._refused.flush(expired_only=True)
        self._warnings.flush(expired_only=True)

    def handle(self, peer: bytes, body: bytes, mac: bytes, now: float,
               source: str = "") -> Optional[Tuple[bytes, bytes]]:
        """The reply frames to one request from connection `peer` at `source` (its address);
        None when it goes unanswered (a source past its refusals)."""
        data, why = wire.read_request(self._signer, body, mac)
        if data is None:
            self.counts["refused"] += 1
            self._refused.warning("refused " + source, "refused a request from %s: %s",
                                  source or "?", why)
            count = self._refusals.get(source, 0)
            if count >= self.limits.refusals_per_source or len(self._refusals) >= MAX_CONNECTIONS:
                return None
            self._refusals[source] = count + 1
            return wire.refusal(why)
        expected, issued = self._challenges.get(peer, ("", 0.0))
        done = bool(expected) and data["challenge"] == expected \
            and now - issued < CHALLENGE_TTL_S
        taken = False
        if done:
            op = data["op"]
            if op == "leave":
                log.info("node %s leaves", data["node"])
                self.membership.leave(data["node"], data["incarnation"])
            elif op == "heartbeat":
                taken = not self.membership.heartbeat(
                    data["node"], data["address"], data["highest_seen"], now, data["broken"],
                    data["incarnation"], data["unreachable"], data["gone"], data["gone_of"])
                if taken:
                    self._warnings.warning(
                        "name", "a second process heartbeats as node %s (from %s) while the "
                        "first is live: it waits until the first leaves or times out",
                        data["node"], data["address"])
            if "status" in data and not taken:
                self._keep_status(data["node"], data["incarnation"], data["status"])
        quorum = self.membership.quorum
        # (as of the last tick: no pass over the live nodes for each request)
        excluded = self.membership.left_out.get(data["node"]) if done else None
        if quorum is None or data["highest_seen"] >= quorum.id:
            return wire.reply(self._signer, mac, self._challenge_for(peer, now), None, done,
                              taken, excluded, pace_s=self.pace_s)  # the node has it (or none)
        if self._quorum_json[0] is not quorum:
            self._quorum_json = (quorum, json.dumps(quorum.to_wire()))
        return wire.reply(self._signer, mac, self._challenge_for(peer, now), None, done, taken,
                          excluded, quorum_json=self._quorum_json[1], pace_s=self.pace_s)

    def _keep_status(self, name: str, incarnation: str, status: wire.Message) -> None:
        """Keep node `name`'s latest status (not from a process whose name another live
        process holds; at most MAX_CONNECTIONS names, the oldest forgotten first)."""
        if self.membership.holder(name) not in (None, incarnation):
            return
        if self.nodes.get(name) == status:
            return
        if name not in self.nodes and len(self.nodes) >= MAX_CONNECTIONS:
            del self.nodes[next(iter(self.nodes))]
        self.nodes.pop(name, None)  # (re-inserted: the newest last)
        self.nodes[name] = status
        self._nodes_changed = True

    def _drain(self) -> None:
        """Read and answer the requests waiting (at most DRAIN), the replies sent together
        once all are read."""
        sock, replies, read, dropped = self._socket, [], 0, 0
        while read < DRAIN:
            try:
                frame = sock.recv(_NOBLOCK, copy=False)
            except zmq.Again:
                break
            read += 1
            frames = [frame]
            while frame.more:  # (all of a message's frames are there once its first is)
                frame = sock.recv(0, copy=False)
                if len(frames) < 5:
                    frames.append(frame)
            peer, now = frames[0].bytes, time.monotonic()
            source = self._admit(peer, frames[0], now)
            if source is None or len(frames) != 4 or frames[1].bytes:  # REQ: identity,
                dropped += 1  # delimiter, body, signature
                continue
            answer = self.handle(peer, frames[2].bytes, frames[3].bytes, now, source)
            if answer is None:
                dropped += 1
            else:
                replies.append((peer, answer[0], answer[1]))
        counts = self.counts
        counts["requests"] += read
        if read:
            counts["reads"] += 1
        counts["dropped"] += dropped
        for peer, body, mac in replies:
            _send(sock, peer, _SNDMORE)
            _send(sock, b"", _SNDMORE)
            _send(sock, body, _SNDMORE)
            _send(sock, mac)

    def write_status(self) -> None:
        """Write the status file (if any): what the launcher shows of this lighthouse. A
        failure is logged (at most once per period), never raised: nodes are served on."""
        self._nodes_changed = False
        if self.status_file is None:
            return
        quorum = self.membership.quorum
        try:
            write_status(self.status_file, {
                "address": self.address, "pid": os.getpid(),
                "quorum": None if quorum is None else quorum_entry(quorum.id, quorum.members),
                "left_out": dict(self.membership.left_out), "nodes": dict(self.nodes)})
        except OSError as exc:
            self._warnings.warning("status", "cannot write the status file %s: %s",
                                   self.status_file, exc)

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Serve until `stop()` is true; then log what it served (`counts`) and the CPU
        time its thread spent."""
        cpu = time.thread_time()
        self.write_status()
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        next_tick = next_sweep = next_status = time.monotonic()
        try:
            while not stop():
                wait_ms = max(0, int((next_tick - time.monotonic()) * 1000))
                if poller.poll(wait_ms):
                    self._drain()
                now = time.monotonic()
                if now < next_tick:
                    continue
                next_tick = now + TICK_S
                if now >= next_sweep:
                    next_sweep = now + SWEEP_S
                    self._forget_idle(now)
                quorum = self.membership.tick(now)
                self.pace_s = self.membership.pace_s = pace_s(
                    self.membership.live_count, self.limits,
                    self.membership.settings.heartbeat_timeout_s)
                if quorum is not None:
                    for name, why in sorted(self.membership.left_out.items()):
                        log.warning("node %s is out of the quorums: %s", name, why)
                    log.info("quorum %d: %s", quorum.id, ", ".join(quorum.members))
                if quorum is not None or (self._nodes_changed and now >= next_status):
                    next_status = now + STATUS_EVERY_S
                    self.write_status()
        finally:
            if self._nodes_changed:  # (the nodes' last words, as the job ends)
                self.write_status()
            counts, cpu = self.counts, time.thread_time() - cpu
            log.info("served %d requests in %d reads (%.3g a read); dropped %d, refused %d; "
                     "its thread's CPU %.3f s (%.3g us a request)", counts["requests"],
                     counts["reads"], counts["requests"] / max(1, counts["reads"]),
                     counts["dropped"], counts["refused"], cpu,
                     1e6 * cpu / max(1, counts["requests"]))

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()

    def __enter__(self) -> "Lighthouse":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_arguments(argv: Optional[Sequence[str]] = None
                   ) -> Tuple[LighthouseSettings, Optional[str]]:
    """(the settings, --new-secret's path or None) of
    ``python -m platoon.elastic.lighthouse``'s command line; exits with status 2 (argparse's
    usage error) naming a bad option."""
    parser = argparse.ArgumentParser(
        prog="python -m platoon.elastic.lighthouse",
        description="Membership of an elastic platoon job: numbered quorums of live nodes.")
    LighthouseSettings.add_arguments(parser)
    parser.add_argument("--new-secret", metavar="PATH",
                        help="write a new secret file (0600) for a job to PATH and exit")
    args = parser.parse_args(argv)
    try:
        return LighthouseSettings.from_arguments(args), getattr(args, "new_secret", None)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # (parser.error exits)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m platoon.elastic.lighthouse``: serve until SIGTERM or SIGINT."""
    settings, new_secret = read_arguments(argv)
    logging.basicConfig(stream=sys.stdout, format="lighthouse: %(message)s",
                        level=os.environ.get("PLATOON_LOG_LEVEL", "INFO").upper())
    try:
        if new_secret:
            print("wrote a new secret to %s: copy it to every node" % generate_secret(
                new_secret))
            return 0
        secret = load_secret(settings.secret_file)
        lighthouse = Lighthouse(settings.membership, settings.bind, secret, settings.limits,
                                settings.status_file)
    except (PlatoonError, OSError) as exc:
        print("lighthouse: %s" % exc, file=sys.stderr)
        return 2
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    membership = settings.membership
    with lighthouse:
        log.info("serving on tcp://%s (min nodes %d, heartbeat timeout %g s, at most %d "
                 "heartbeats a second)", lighthouse.address, membership.min_nodes,
                 membership.heartbeat_timeout_s, lighthouse.limits.heartbeats_per_s)
        ready_fd = JobEnvironment.read("ready_fd").ready_fd  # platoon-launcher --elastic's
        if ready_fd is not None:
            announce(ready_fd, {"address": lighthouse.address})
        lighthouse.serve(lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
