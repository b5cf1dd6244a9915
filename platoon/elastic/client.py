"""A node's side of the lighthouse: registration, heartbeats in a thread, the latest quorum."""

import logging
import secrets
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import zmq

from .._os.logthrottle import ThrottledLog
from ..errors import ElasticAuthError, QuorumTimeout
from . import wire
from .quorum import Quorum
from .secret import Signer, load_secret, sign_header, verify

log = logging.getLogger(__name__)

FIRST_REPLY_TIMEOUTS = 5  # request timeouts a connection's first request waits for its reply


def paced(interval_s: float, answer: wire.Message) -> float:
    """The wait (seconds) before a node's next heartbeat after the signed reply `answer`:
    its own `interval_s`, or the pace the lighthouse asks for when longer (`wire.pace_of`;
    none in an older lighthouse's reply: its own)."""
    pace = wire.pace_of(answer)
    return interval_s if pace is None else max(interval_s, pace)


class LighthouseClient:
    """Node `name` (its stable slot) of an elastic job, registered with the lighthouse at
    `lighthouse` ("HOST:PORT") and reachable for the data plane at `address` ("HOST:PORT").

    A thread heartbeats every `heartbeat_interval_s`, or at the lighthouse's pace when its
    replies ask for a longer one (`paced`: a lighthouse with many nodes asks for one, so that
    what they all send it stays within its rate; the node then hears of a new quorum up to
    that pace later; `pace_s`: the pace last asked, None when none); a request unanswered within
    `request_timeout_s` is dropped and sent again on a new connection (the first request of a
    connection is given FIRST_REPLY_TIMEOUTS such timeouts: a lighthouse that a burst of
    nodes starting together keeps busy is not sent each request again), for as long as the
    client is open: while the lighthouse is down the node keeps its last quorum, and it
    registers again (reporting the highest quorum id it has seen) once the lighthouse is
    back. `secret`: the job's secret (default: `load_secret()`). A context manager; `close()`
    tells the lighthouse the node leaves. What the node says of itself (`set_status`) rides on
    its heartbeats when it changed; `tell` sends it in a message of its own (a node's last
    word, also after `close`).

    A refusal (an unsigned reply, or one whose signature fails) before the first signed reply
    means the secrets differ: `wait_for_quorum` and `current_quorum` raise ElasticAuthError.
    Once registered, a refusal is taken for a reply from something else than the job's
    lighthouse (another process on its port while it is down): the lighthouse counts as
    unreachable, and only refusals lasting `refused_for_s` seconds raise.
    """

    def __init__(self, lighthouse: str, name: str, address: str, *,
                 secret: Optional[bytes] = None, heartbeat_interval_s: float = 0.1,
                 request_timeout_s: float = 1.0, refused_for_s: float = 60.0) -> None:
        if not name:
            raise ValueError("a node needs a name (its stable slot), got %r" % (name,))
        if not (heartbeat_interval_s > 0 and request_timeout_s > 0):
            raise ValueError("heartbeat_interval_s and request_timeout_s must be > 0 seconds")
        self.lighthouse, self.name, self.address = lighthouse, name, address
        self._secret = load_secret() if secret is None else secret
        self._signer = Signer(self._secret)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.request_timeout_s = request_timeout_s
        self.refused_for_s = refused_for_s
        self.incarnation = secrets.token_hex(8)  # this process's claim on `name`
        self.name_taken = False  # another live process holds `name` (the lighthouse says)
        self._signed_at: Optional[float] = None  # the last signed reply (None: none yet)
        self._refused_since: Optional[float] = None  # the first refusal since it
        self._warnings = ThrottledLog(log)
        self._context = zmq.Context()
        self._cond = threading.Condition()
        self._quorum: Optional[Quorum] = None
        self._refused: Optional[str] = None  # the lighthouse's last refusal, until a good reply
        self._broken = 0  # `report_broken`'s quorum id, sent with every heartbeat
        self._unreachable: List[str] = []  # `report_unreachable`'s
        self._gone: List[str] = []  # `report_gone`'s
        self._gone_of = 0  # the quorum `_gone` is about (sent with it)
        self._status: Optional[wire.Message] = None  # `set_status`'s, as sent
        self._status_told: Optional[wire.Message] = None  # what the lighthouse took of it
        self.excluded: Optional[str] = None  # why the lighthouse keeps this node out, if it does
        self.reachable = False  # whether the last request was answered
        self.pace_s: Optional[float] = None  # the lighthouse's pace, as its last reply asked
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="platoon-heartbeat", daemon=True)
        self._thread.start()

    # --- what the node asks -------------------------------------------------------------
    def current_quorum(self) -> Optional[Quorum]:
        """The newest quorum heard of (it may no longer hold this node), or None."""
        with self._cond:
            self._raise_refused()
            return self._quorum

    def wait_for_quorum(self, timeout_s: Optional[float] = None,
                        newer_than: int = 0) -> Quorum:
        """The first quorum with an id above `newer_than` that holds this node (its name at
        its address: not a quorum made while another process held the name). Raises
        QuorumTimeout after `timeout_s` seconds (None: forever) and ElasticAuthError when
        the lighthouse refuses this node's secret."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._raise_refused()
                q = self._quorum
                if q is not None and q.id > newer_than and self.name in q.members \
                        and q.addresses[q.rank_of(self.name)] == self.address:
                    return q
                left = None if deadline is None else deadline - time.monotonic()
                if deadline is not None and left is not None and left <= 0:
                    raise QuorumTimeout(
                        "node %s: no quorum above id %d holding it within %.3g s (lighthouse "
                        "%s %s; newest quorum %s): are enough nodes up (--min-nodes)?"
                        % (self.name, newer_than, timeout_s or 0.0, self.lighthouse,
                           "answers" if self.reachable else "does not answer",
                           "none" if q is None else "%d of %s" % (q.id, ", ".join(q.members))))
                self._cond.wait(left)

    @property
    def secret(self) -> bytes:
        """The job's secret (the data plane's store asks for it)."""
        return self._secret

    def sign_header(self, quorum: Quorum, rank: int, header: bytes) -> bytes:
        """Rank `rank`'s signature of its round `header` in `quorum` (the job's secret)."""
        return sign_header(self._secret, quorum.id, quorum.nonce, rank, header)

    def header_signed(self, quorum: Quorum, rank: int, header: bytes, mac: bytes) -> bool:
        """Whether `mac` is rank `rank`'s signature of `header` in `quorum`."""
        return verify(self.sign_header(quorum, rank, header), mac)

    def report_broken(self, quorum_id: int) -> None:
        """Ask the lighthouse for a new quorum id for the same members: quorum `quorum_id`'s
        group broke (a member stalled past the round's timeout) and no newer quorum came.
        Sent with every heartbeat from now on; ignored once `quorum_id` is not current."""
        with self._cond:
            self._broken = max(self._broken, int(quorum_id))

    def report_unreachable(self, names: Sequence[str]) -> None:
        """Tell the lighthouse that the data plane of `names` (members of the current quorum)
        could not be reached when a group failed to form: sent with every heartbeat until the
        next call (``[]`` once a group forms). The lighthouse keeps a member that at least half
        of the others report out of the quorums (`Membership.excluded`)."""
        with self._cond:
            self._unreachable = sorted(names)

    def report_gone(self, names: Sequence[str], quorum_id: int) -> None:
        """Tell the lighthouse that the data plane of `names` (members of quorum `quorum_id`)
        stopped answering when a round of their group broke, or while it formed: perhaps
        dead. Sent with every heartbeat until the next call (``[]`` once a group forms). The
        lighthouse counts such a member out as soon as it is silent too
        (`Membership.gone_silence_s`), not after the whole heartbeat timeout, if it is still
        the process it was in that quorum; one that heartbeats after the report stays."""
        with self._cond:
            self._gone, self._gone_of = sorted(names), quorum_id

    def set_status(self, status: Dict[str, Any]) -> None:
        """What this node says of itself (its status file's: `NodeStatus`), sent to the
        lighthouse with the next heartbeat when it changed (bounded: `wire.node_status`); the
        lighthouse publishes each node's latest in its status file."""
        told = wire.node_status(status)
        with self._cond:
            self._status = told

    def tell(self, status: Dict[str, Any], timeout_s: float = 2.0) -> bool:
        """Send `status` (as `set_status`) to the lighthouse now, in a message of its own on a
        connection of its own (op "status": the membership is not touched), after `close` too:
        a node's last word, its final result. Waits at most `timeout_s` seconds; returns
        whether the lighthouse took it (False: unanswered, or refused)."""
        self.set_status(status)
        deadline = time.monotonic() + timeout_s
        context = zmq.Context()
        sock = self._connect(context)
        try:
            challenge = ""
            for _ in range(2):  # (a new connection: the first reply only gives a challenge)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.rcvtimeo = max(1, int(left * 1000))
                with self._cond:
                    told = self._status
                answer, _ = self._exchange(sock, "status", challenge, told)
                if answer is None or answer["error"] is not None:
                    return False
                if answer["done"]:
                    with self._cond:
                        self._status_told = told  # (no heartbeat need carry it again)
                    return True
                challenge = answer["challenge"]
            return False
        finally:
            sock.close(linger=0)
            context.term()

    def _raise_refused(self) -> None:
        if self._refused is not None:
            raise ElasticAuthError("node %s: the lighthouse at %s refused it: %s"
                                   % (self.name, self.lighthouse, self._refused))

    # --- the heartbeat thread -----------------------------------------------------------
    def _connect(self, context: Optional[zmq.Context] = None  # type: ignore[type-arg]
                 ) -> "zmq.Socket[bytes]":
        sock = (self._context if context is None else context).socket(zmq.REQ)
        sock.linger = 0
        sock.maxmsgsize = wire.MAX_REPLY  # ZeroMQ drops a larger frame unread (and reconnects)
        sock.rcvtimeo = int(self.request_timeout_s * 1000)
        sock.connect("tcp://" + self.lighthouse)
        return sock

    def _exchange(self, sock: "zmq.Socket[bytes]", op: str, challenge: str,
                  status: Optional[wire.Message] = None, timeouts: int = 1
                  ) -> Tuple[Optional[wire.Message], Optional[wire.Message]]:
        """One request (with `status` and `gone`, unless they would make it too long) and (its
        reply, None when unanswered within `timeouts` request timeouts; the status it
        carried, or None)."""
        with self._cond:
            highest = 0 if self._quorum is None else self._quorum.id
            broken = self._broken
            unreachable = [] if op == "status" else self._unreachable
            gone = [] if op == "status" else self._gone
            gone_of = self._gone_of
        body, mac = wire.request(self._signer, op, self.name, self.address, highest, challenge,
                                 broken, self.incarnation, unreachable, status, gone, gone_of)
        if len(body) > wire.MAX_BODY and status is not None and op != "status":
            status = None  # (long lists of members: the status waits)
            body, mac = wire.request(self._signer, op, self.name, self.address, highest,
                                     challenge, broken, self.incarnation, unreachable, None,
                                     gone, gone_of)
        if len(body) > wire.MAX_BODY and gone:  # (too many: the heartbeat timeout counts them)
            body, mac = wire.request(self._signer, op, self.name, self.address, highest,
                                     challenge, broken, self.incarnation, unreachable, status)
        sock.send_multipart([body, mac])
        frames: Optional[List[bytes]] = None
        for _ in range(timeouts):
            try:
                frames = sock.recv_multipart()
                break
            except zmq.Again:
                if self._stop.is_set():  # (closing: no more waiting)
                    break
        if frames is None:
            return None, status
        if len(frames) != 2:
            return {"challenge": "", "quorum": None, "done": False,
                    "error": "malformed reply"}, status
        return wire.read_reply(self._signer, mac, frames[0], frames[1]), status

    def _untold_status(self) -> Optional[wire.Message]:
        """The status to send with the next heartbeat: the latest, unless the lighthouse has
        it."""
        with self._cond:
            return None if self._status == self._status_told else self._status

    def _took(self, answer: wire.Message, status: Optional[wire.Message]) -> None:
        """Note what the lighthouse took of the status sent: all of it when the request was
        done (and the name not taken by another process), none on a new connection (a stale
        challenge: perhaps a restarted lighthouse)."""
        with self._cond:
            if answer["error"] is None and not answer["done"]:
                self._status_told = None
            elif answer["error"] is None and status is not None and not answer.get("taken"):
                self._status_told = status

    def _heard(self, answer: wire.Message) -> bool:
        """Take in a reply; False when it is a refusal not taken as the lighthouse's (see the
        class's doc): the caller then reconnects."""
        with self._cond:
            error, now = answer["error"], time.monotonic()
            if error is not None and self._signed_at is not None:
                if self._refused_since is None:
                    self._refused_since = now
                if now - self._refused_since < self.refused_for_s:
                    self.reachable = False
                    self._warnings.warning(
                        "refusal", "node %s: a reply from %s failed its check (%s): not the "
                        "job's lighthouse (another process on its port?); taken as "
                        "unreachable unless such replies last %.3g s", self.name,
                        self.lighthouse, error, self.refused_for_s)
                    return False
            self.reachable = True
            self._refused = error
            if error is None:
                self._signed_at, self._refused_since = now, None
                self.pace_s = wire.pace_of(answer)
                self.name_taken = bool(answer.get("taken"))
                self.excluded = answer.get("excluded")
                if self.excluded:
                    self._warnings.warning(
                        "excluded", "node %s: the lighthouse %s keeps this node out of the "
                        "quorums: %s", self.name, self.lighthouse, self.excluded)
                if self.name_taken:
                    self._warnings.warning(
                        "taken", "node %s: another live process holds this name at the "
                        "lighthouse %s: this one waits until it leaves or times out (give each "
                        "node its own --name)", self.name, self.lighthouse)
            if error is None and answer["quorum"] is not None:
                quorum = Quorum.from_wire(answer["quorum"])
                if self._quorum is None or quorum.id > self._quorum.id:
                    self._quorum = quorum
            self._cond.notify_all()
            return True

    def _run(self) -> None:
        sock, challenge, answered = self._connect(), "", False
        try:
            while not self._stop.is_set():
                answer, status = self._exchange(
                    sock, "heartbeat", challenge, self._untold_status(),
                    1 if answered else FIRST_REPLY_TIMEOUTS)
                if answer is None:  # the lighthouse is gone or slow: a new connection
                    with self._cond:
                        self.reachable = False
                    sock.close(linger=0)
                    sock, challenge, answered = self._connect(), "", False
                    continue
                answered = True
                if not self._heard(answer):  # not the lighthouse: a new connection, later
                    sock.close(linger=0)
                    self._stop.wait(max(1.0, self.heartbeat_interval_s))
                    sock, challenge, answered = self._connect(), "", False
                    continue
                challenge = answer["challenge"]
                self._took(answer, status)
                if answer["error"] is None and not answer["done"]:
                    continue  # the challenge was stale: send again with the new one
                self._stop.wait(paced(self.heartbeat_interval_s, answer)
                                if answer["error"] is None
                                else max(1.0, self.heartbeat_interval_s))
            if challenge and self.reachable:  # leave at once rather than after the timeout
                self._exchange(sock, "leave", challenge, self._untold_status())
        except zmq.ZMQError as exc:  # the context is gone: close() from another thread
            log.debug("node %s: heartbeat thread ends: %s", self.name, exc)
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        """Stop heartbeating and tell the lighthouse this node leaves (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(self.request_timeout_s + 5.0)
        self._context.term()

    def __enter__(self) -> "LighthouseClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
