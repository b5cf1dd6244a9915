"""The centre tie of an elastic job: DiLoCo's outer step, or hierarchical EASGD, among the
members of each quorum, over that quorum's gloo group (`QuorumGroup`), surviving members that
die and taking in members that join.

Every member holds the same anchor and outer momentum, numbered by the outer rounds applied
(`round_no`). Each round begins with a header every member sends (`decision.RoundHeader`:
ready, done, handed over, round_no, the newest quorum id it has heard of, a sha256 of its
anchor and momentum and of its centre's layout, its tie's settings and a summary of its
layout), signed with the job's secret over the quorum's id and nonce and its rank: a header
that fails its check breaks the round before anything is applied (a process without the
secret in a member's place), and a healed member checks the anchor it receives against its
source's signed sha256. Then, the same decision on every member (`decision.decide`):

- a member whose tie settings (codec, rule and its settings) or model layout differ from the
  job's is refused at the door: it ends (NodeRefused, naming the setting), the others drop the
  round and go on without it;
- someone has heard of a newer quorum: all leave this group for it;
- nobody has an anchor yet (the job's first round): the anchor is the mean of the centres,
  sent losslessly;
- the members' anchors differ (a joiner has none; a member missed a round that broke while
  the others applied it; a member was stopped): the lowest-ranked member with the highest
  round_no broadcasts its anchor and momentum, losslessly, and each member that differed
  takes them: a joiner's centre becomes the anchor, another's keeps what its workers added
  (its centre minus its old anchor plus the new one). Nothing else happens in that round;
- otherwise an outer round: each member's pseudo-gradient (centre minus anchor) travels
  compressed with error feedback (`QuorumGroup.compressed_mean`), its arrays packed into one
  message per dtype (one all-gather a round for a model of one dtype); every array's mean is in
  before any anchor changes, so a round that breaks (QuorumBroken) changes no anchor,
  momentum or residual on that member, and no centre is half-updated. DiLoCo: the outer step
  on the anchor, and each centre becomes the new anchor plus what its workers added since the
  snapshot. EASGD: the anchor becomes the members' mean centre, and each training member's
  centre moves toward it by beta. A mean refused for NaN or Inf (in any round, the first
  included) ends the members that hold it and breaks the round for the others.

A round that breaks is dropped: the node waits for a quorum newer than the broken one
(`LighthouseClient.wait_for_quorum`) and builds its group; the header of its first round
repairs whatever anchors differ. A node whose workers are done hands its centre over once
(its last move is in the next mean), then takes every anchor without contributing; when every
member is done and handed over, each sets its centre to the anchor: the same bits on every
node alive at the end. A done node whose group makes no round for `final_timeout_s` (the
others gone, too few nodes for a quorum, the lighthouse gone for good) gives up the final
round and keeps its own centre (the last anchor, once handed over).
"""

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .._os.elasticsettings import FINAL_TIMEOUT_S  # (an elastic node's setting)
from ..errors import NodeRefused, NonFiniteValues, PlatoonError, QuorumBroken, QuorumTimeout
from ..node.compress import ErrorFeedback, RawCodec, make_codec
from ..node.tie import LOCK_TIMEOUT_S, CentreTie, outer_step
from .decision import (
    DIGEST_BYTES,
    HEADER_BYTES,
    RoundHeader,
    decide,
    door_settings,
    layout_summary,
)

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05  # between rounds while some member's centre is not ready
HALT_TIMEOUT_S = 10.0


def _sha256(arrays) -> bytes:
    h = hashlib.sha256()
    for a in arrays:
        h.update(("%s%s" % (a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def _by_dtype(arrays) -> List[List[int]]:
    """The indices of `arrays` grouped by dtype, first seen first: each group's moves travel
    packed as one message."""
    groups: Dict[str, List[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype.str, []).append(i)
    return list(groups.values())


def _feedback_for(arrays) -> List[ErrorFeedback]:
    """One ErrorFeedback for each packed message of `arrays`' moves (`_by_dtype`)."""
    return [ErrorFeedback(sum(arrays[i].size for i in indices), arrays[indices[0]].dtype)
            for indices in _by_dtype(arrays)]


class ElasticTie:
    """The thread that ties node `name`'s `controller`'s centre to the other nodes' as `tie`
    (a CentreTie with ``outer="diloco"``) says, in the quorums that the LighthouseClient
    `connect()` makes hears of: it is made once the centre exists (its layout known), so a
    node enters a quorum only when it can be healed; it leaves when the tie ends.
    `timeout_s` bounds each collective; `final_timeout_s`, the wait of a done node for a
    round (see the module's doc). `on_failure(message)` ends the node when the tie cannot go
    on (a diverged centre, centres of different layouts). `started_at`: the node's start
    (time.time()), for the joiner's time to its first contributing round."""

    def __init__(self, tie: CentreTie, connect: Callable, name: str, controller,
                 timeout_s: float,
                 on_failure: Callable[[str], None], started_at: Optional[float] = None,
                 final_timeout_s: float = FINAL_TIMEOUT_S):
        self.check(tie)
        self.tie, self._connect, self.ctl = tie, connect, controller
        self.client: Any = None  # the LighthouseClient, once the centre exists
        self.name, self.timeout_s, self.on_failure = name, timeout_s, on_failure
        self.final_timeout_s = final_timeout_s
        self.gave_up = False  # no final round within final_timeout_s of the last round
        self._round_at = time.monotonic()  # when a round's header last went round the group
        self._done_at: Optional[float] = None
        self.started_at = time.time() if started_at is None else started_at
        self.codec = make_codec(tie.compress)
        # per centre array, the same bits on every member (None: no anchor yet)
        self.anchor: Any = None  # Optional[List[np.ndarray]]
        self.velocity: Any = None  # the outer momentum, Optional[List[np.ndarray]]
        self._digest: Optional[bytes] = None  # their sha256, once asked (None: not yet)
        self._feedback: Any = None  # this node's Optional[List[ErrorFeedback]]
        self.round_no = -1  # outer rounds applied to the anchor (-1: no anchor)
        self.rounds = self.broken_rounds = self.heals = 0
        self.bytes_sent = 0
        self.quorums: List[int] = []  # the ids of the quorums this node made rounds in
        self.healed_from: Optional[str] = None
        self.healed_after_s: Optional[float] = None  # from the node's start
        self.first_contribution_s: Optional[float] = None  # from the node's start
        self.final_rank: Optional[int] = None  # this node's rank in the final quorum
        self._handed_over = False
        self._done = threading.Event()
        self._halt = threading.Event()
        self.final = threading.Event()
        self._awaiting = threading.Event()  # in `initial_centre`
        self._decided = threading.Event()  # `initial_centre` answers
        self._awaiting_until: Optional[float] = None  # its deadline, from its first call
        self.final_error: Optional[BaseException] = None
        self._group: Any = None  # the current quorum's QuorumGroup
        self._broken_at: Optional[float] = None  # when a round broke, until one succeeds
        self._waiting_since = 0.0  # for a quorum newer than the last group's
        self.recoveries_s: List[float] = []  # from each broken round to the next outer round
        self._last_start = 0.0
        self._thread = threading.Thread(target=self._run, name="platoon-elastic-tie",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def check(tie: CentreTie) -> None:
        """Raise PlatoonError for a tie an elastic job cannot run."""
        if tie.every_s is None:
            raise PlatoonError("an elastic job's rounds come every so many seconds: give "
                               "--tie-every-s")

    # --- the controller's side -----------------------------------------------------------
    def node_done(self) -> None:
        """This node's workers are all done: its centre no longer moves."""
        if self._done_at is None:
            self._done_at = time.monotonic()
        self._done.set()

    def stop(self) -> None:
        """Wait for the final round (every member of the quorum done), or until the node gives
        it up (`final_timeout_s` without a round); raise its error."""
        self.node_done()
        # The thread gives up between rounds; its collectives each wait at most timeout_s.
        # Past that (a thread stuck where nothing should block), it is halted.
        while self._thread.is_alive():
            self._thread.join(1.0)
            if self._thread.is_alive() and self._final_overdue(
                    2 * self.timeout_s + HALT_TIMEOUT_S):
                if not self.halt():
                    log.warning("node %s: the elastic tie thread did not end", self.name)
                break
        if self.final_error is not None:
            raise self.final_error

    def halt(self, timeout_s: float = HALT_TIMEOUT_S) -> bool:
        """End now, without a final round (the controller is closing)."""
        self._halt.set()
        self._done.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def halted(self) -> bool:
        return self._halt.is_set()

    def summary(self) -> str:
        tie = self.tie
        rule = "DiLoCo lr %g, momentum %g" % (tie.outer_lr, tie.outer_momentum) \
            if tie.outer == "diloco" else "EASGD beta %g" % tie.beta
        return ("the elastic tie made %d outer round(s) (%s, %s) in "
                "quorum(s) %s, sent %d bytes from this node; %d round(s) broke and were "
                "dropped; %s" % (
                    self.rounds, tie.compress, rule,
                    ",".join(map(str, self.quorums)) or "none", self.bytes_sent,
                    self.broken_rounds, "healed from %s %.2f s after its start" % (
                        self.healed_from, self.healed_after_s or 0.0) if self.healed_from
                    else "never healed from a peer")) + (
                        "; no final round within %.3g s: it kept its own centre"
                        % self.final_timeout_s if self.gave_up else "")

    # --- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self.ctl.shared_centre is None:
                if self._halt.wait(IDLE_POLL_S):
                    return
            self.client = self._connect()
            while not self._halt.is_set():
                if self._final_overdue():
                    self._give_up()
                    return
                if self._group is None and not self._join_group():
                    continue
                self._wait_for_round()
                if self._halt.is_set():
                    return
                self._last_start = time.monotonic()
                try:
                    if self._round():
                        return
                except QuorumBroken as exc:
                    self.broken_rounds += 1
                    self._waiting_since = time.monotonic()
                    if self._broken_at is None:
                        self._broken_at = self._waiting_since
                    log.warning("%s; the round is dropped", exc)
                    self._leave_group()
        except Exception as exc:  # a diverged or refused centre: the tie cannot go on
            if self._halt.is_set():
                return
            self.final_error = exc
            if isinstance(exc, NodeRefused):
                log.error("%s", exc)
            else:
                log.exception("node %s: the elastic tie failed", self.name)
            if self.client is not None:  # out of the next quorum at once, not after a timeout
                self.client.close()
            self.on_failure("the elastic tie failed: %s" % exc)
        finally:
            self._leave_group()
            if self.client is not None:
                self.client.close()
            self.final.set()

    def _final_overdue(self, slack_s: float = 0.0) -> bool:
        """Done, and no round for `final_timeout_s` (plus `slack_s`)."""
        if self._done_at is None:
            return False
        return time.monotonic() - max(self._done_at, self._round_at) \
            > self.final_timeout_s + slack_s

    def _give_up(self) -> None:
        self.gave_up = True
        log.warning("node %s: done, but no round of its group within %.3g s (its peers gone, "
                    "too few nodes for a quorum, or the lighthouse gone): no final round; it "
                    "keeps its own centre (%s) and ends", self.name, self.final_timeout_s,
                    "the anchor of outer round %d, its last move in it" % self.round_no
                    if self._handed_over else "its last move in no anchor")

    def _join_group(self) -> bool:
        """Build the group of the next quorum holding this node (newer than the last one's)."""
        from .dataplane import QuorumGroup, unreachable_members
        newer_than = self.quorums[-1] if self.quorums else 0
        try:
            quorum = self.client.wait_for_quorum(timeout_s=0.5, newer_than=newer_than)
        except QuorumTimeout:
            if newer_than and time.monotonic() - self._waiting_since > self.timeout_s:
                # every member heartbeats, yet the group broke (one stalled a round past
                # its timeout): no member is dropped, so ask for a new id
                log.warning("node %s: no quorum after %d within %.3g s of its group's end; "
                            "asking the lighthouse for a new one", self.name, newer_than,
                            self.timeout_s)
                self.client.report_broken(newer_than)
                self._waiting_since = time.monotonic()
            return False
        self.quorums.append(quorum.id)
        self._waiting_since = time.monotonic()  # a group that cannot form: as a broken one
        try:
            self._group = QuorumGroup(quorum, self.name, self.timeout_s)
        except QuorumBroken as exc:
            log.warning("%s", exc)
            unreachable = unreachable_members(quorum, self.name)
            if unreachable:
                log.warning("node %s: the data plane of %s (quorum %d) is unreachable from "
                            "here: told the lighthouse", self.name, ", ".join(unreachable),
                            quorum.id)
            self.client.report_unreachable(unreachable)
            return False
        self.client.report_unreachable([])
        log.info("node %s: rank %d of quorum %d (%s)", self.name, self._group.rank, quorum.id,
                 ", ".join(quorum.members))
        return True

    def _leave_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.close()

    def _wait_for_round(self) -> None:
        """`every_s` after the last round began; at once when done and not handed over."""
        while not self._halt.is_set():
            if self._done.is_set() and not self._handed_over:
                return
            left = self._last_start + (self.tie.every_s or 0.0) - time.monotonic()
            if left <= 0:
                return
            self._halt.wait(left)

    def initial_centre(self, timeout_s: float) -> Optional[bool]:
        """Called as this node's centre is created, before its workers write it, then again
        until it answers (it never blocks): None while undecided, True once the centre holds
        a live member's anchor (its workers then start from it), False when no member has an
        anchor yet (the job's start: the workers initialise it) or none came within
        `timeout_s` of the first call."""
        if self._awaiting_until is None:
            self._awaiting_until = time.monotonic() + timeout_s
            self._awaiting.set()
        if not self._decided.is_set():
            if time.monotonic() < self._awaiting_until:
                return None
            log.warning("node %s: no quorum took this node within %.3g s; its workers start "
                        "from their own values", self.name, timeout_s)
            self._awaiting.clear()
            return False
        self._awaiting.clear()
        return self.anchor is not None

    def _header(self) -> RoundHeader:
        centre = self.ctl.shared_centre
        # 2: the centre holds its values; 1: created, awaiting them (`initial_centre`)
        ready = 2 if self.ctl.centre_ready and centre is not None else \
            1 if self._awaiting.is_set() and centre is not None else 0
        newest = self.client.current_quorum()
        digest = bytes(DIGEST_BYTES)
        if self.anchor is not None:
            if self._digest is None:  # once for each new anchor
                self._digest = _sha256(self.anchor + self.velocity)
            digest = self._digest
        layout_digest, layout = bytes(DIGEST_BYTES), ""
        if ready:
            layout_digest = hashlib.sha256(repr(centre.layout).encode()).digest()
            layout = layout_summary(centre.layout)
        return RoundHeader(ready, self._done.is_set(), self._handed_over, self.round_no,
                           0 if newest is None else newest.id, digest, layout_digest,
                           door_settings(self.tie), layout)

    def _gather_headers(self, group) -> List[RoundHeader]:
        """Every member's signed header of this round, in rank order; QuorumBroken, before
        anything is applied, when one is not signed with the job's secret."""
        packed = self._header().pack()
        mac = self.client.sign_header(group.quorum, group.rank, packed)
        rows = group.all_gather_bytes(np.frombuffer(packed + mac, np.uint8))
        self._round_at = time.monotonic()  # every member answered: the group is alive
        for r, row in enumerate(rows):
            if not self.client.header_signed(group.quorum, r, bytes(row[:HEADER_BYTES]),
                                             bytes(row[HEADER_BYTES:])):
                raise QuorumBroken(
                    "node %s (rank %d of quorum %d: %s): the round header of rank %d (%s) is "
                    "not signed with the job's secret (another process in that member's "
                    "place?); nothing was applied: the round is dropped"
                    % (self.name, group.rank, group.quorum.id, ", ".join(group.quorum.members),
                       r, group.quorum.members[r]))
        return [RoundHeader.unpack(bytes(row[:HEADER_BYTES])) for row in rows]

    def _round(self) -> bool:
        """One round in the current group (see the module's doc); True after the final one."""
        group = self._group
        headers = self._gather_headers(group)
        decision = decide(headers, group.quorum.id, group.quorum.members)
        if decision.action == "leave":  # every member leaves for the newer quorum alike
            self._leave_group()
            return False
        if decision.action == "refuse":
            self._refuse(group, decision.refused)
        if all(h.round_no < 0 for h in headers) and headers[group.rank].ready == 1:
            self._decided.set()  # the job's start: the workers write the first values
        if decision.action == "first_anchor":
            self._first_anchor(group)
        elif decision.action == "heal":
            self._heal(group, decision.source, decision.best, list(decision.differing),
                       headers[decision.source].anchor_digest)
        elif decision.action == "final":
            self._final(group)
            return True
        elif decision.action == "outer":
            self._outer_round(group, list(decision.members))
        else:  # "wait"
            time.sleep(IDLE_POLL_S)
        return False

    def _refuse(self, group, refused) -> None:
        """The members in `refused` (rank -> why) differ from the job: NodeRefused on them (the
        node ends), QuorumBroken on the others (they drop the round and go on without them)."""
        names = group.quorum.members
        where = "quorum %d: %s" % (group.quorum.id, ", ".join(names))
        if group.rank in refused:
            raise NodeRefused("node %s is refused by the job's other nodes (%s): %s; nothing "
                              "was applied" % (self.name, where, refused[group.rank]))
        raise QuorumBroken("node(s) %s refused at the door (%s): %s; nothing was applied: the "
                           "round is dropped, and the others go on without it" % (
                               ", ".join(names[r] for r in refused), where,
                               "; ".join("%s: %s" % (names[r], why)
                                         for r, why in sorted(refused.items()))))

    def _snapshot(self):
        centre = self.ctl.shared_centre
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            return centre, [a.copy() for a in centre.arrays]
        finally:
            centre.lock.release()

    @staticmethod
    def _set_centre(centre, new, keep_since=None) -> None:
        """Each centre array := new, plus what the workers added since `keep_since` (the
        arrays it was compared to), if given: in one hold of the lock, so that no sync landing
        meanwhile is lost."""
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            for i, c in enumerate(centre.arrays):
                if keep_since is not None:
                    c -= keep_since[i]
                    c += new[i]
                else:
                    c[...] = new[i]
        finally:
            centre.lock.release()

    def _first_anchor(self, group) -> None:
        """The job's first round: the anchor is the mean of the centres, losslessly."""
        training = not self._done.is_set()  # read once, before the snapshot (as _outer_round)
        centre, snaps = self._snapshot()
        means, sent_total = [], 0
        try:
            for s in snaps:
                mean, sent = group.compressed_mean(s, RawCodec(s.dtype))
                sent_total += sent
                means.append(mean)
        except NonFiniteValues as exc:
            raise self._diverged(group, exc) from exc
        self.bytes_sent += sent_total
        self.anchor = means
        self.velocity = [np.zeros_like(a) for a in means]
        self._feedback = _feedback_for(means)
        self.round_no = 0
        self._digest = None
        self._set_centre(centre, self.anchor, keep_since=snaps if training else None)
        self._note_contribution()

    def _heal(self, group, source: int, best: int, differing: List[int],
              digest: bytes) -> None:
        """The anchor and momentum of `source` to every member in `differing`, losslessly;
        `digest`: their sha256 in `source`'s signed header, which what arrives must match."""
        centre = self.ctl.shared_centre
        shapes = list(centre.arrays) * 2  # the anchor's arrays, then the momentum's
        if group.rank == source:
            payload = np.concatenate([np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8)
                                      for a in self.anchor + self.velocity])
        else:
            payload = np.zeros(sum(a.nbytes for a in shapes), np.uint8)
        got = group.broadcast_bytes(payload, source)
        if group.rank == source:
            self.bytes_sent += payload.size * len(differing)
        if group.rank not in differing:
            return
        offset, arrays = 0, []
        for a in shapes:
            arrays.append(np.frombuffer(got[offset:offset + a.nbytes].tobytes(),
                                        a.dtype).reshape(a.shape).copy())
            offset += a.nbytes
        if _sha256(arrays) != digest:
            raise QuorumBroken(
                "node %s (rank %d of quorum %d: %s): the anchor received from rank %d (%s) "
                "does not match the sha256 in its signed header; nothing was applied: the "
                "round is dropped" % (self.name, group.rank, group.quorum.id,
                                      ", ".join(group.quorum.members), source,
                                      group.quorum.members[source]))
        half = len(arrays) // 2
        old, joiner = self.anchor, self.anchor is None
        self.anchor, self.velocity, self.round_no = arrays[:half], arrays[half:], best
        self._digest = digest
        self._feedback = _feedback_for(self.anchor)
        self.heals += 1
        if joiner:
            self._set_centre(centre, self.anchor)
            self._decided.set()
            self.healed_from = group.quorum.members[source]
            self.healed_after_s = time.time() - self.started_at
            log.warning("node %s: healed from %s in quorum %d (outer round %d), %.2f s after "
                        "its start", self.name, self.healed_from, group.quorum.id, best,
                        self.healed_after_s)
        else:  # its centre minus its old anchor plus the new one, in one hold of the lock
            self._set_centre(centre, self.anchor, keep_since=old)
            log.warning("node %s: its anchor repaired from %s in quorum %d (outer round %d); "
                        "its workers' work since its old anchor kept", self.name,
                        group.quorum.members[source], group.quorum.id, best)

    def _outer_round(self, group, members: List[int]) -> None:
        """DiLoCo's outer step on the anchor from the mean move of `members`.

        Whether this node is done is read once, before the snapshot: a sync landing after it
        is kept in the centre (and sent in the next round) even if the node is done by the
        round's end; a node done before it hands its whole last move over now. A mean refused
        for NaN or Inf raises NonFiniteValues on the members that hold it (their node ends)
        and QuorumBroken on the others (they go on without them)."""
        contributes = group.rank in members
        done = self._done.is_set()
        centre, snaps = self._snapshot()
        moves = [s - a for s, a in zip(snaps, self.anchor)]
        residuals = [f.residual.copy() for f in self._feedback]
        means: List[Any] = [None] * len(moves)
        sent_total = 0
        try:
            for indices, feedback in zip(_by_dtype(moves), self._feedback):
                packed = np.concatenate([moves[i].reshape(-1) for i in indices])
                mean, sent = group.compressed_mean(packed, self.codec, feedback, among=members)
                offset = 0
                for i in indices:
                    means[i] = mean[offset:offset + moves[i].size].reshape(moves[i].shape)
                    offset += moves[i].size
                sent_total += sent
        except (QuorumBroken, NonFiniteValues) as exc:
            for f, r in zip(self._feedback, residuals):  # as if never sent
                f.residual[...] = r
            if isinstance(exc, NonFiniteValues):
                raise self._diverged(group, exc) from exc
            raise
        easgd = self.tie.outer == "easgd"
        for anchor, velocity, mean in zip(self.anchor, self.velocity, means):
            if easgd:  # the anchor is the members' mean centre
                anchor += mean
            else:
                outer_step(anchor, velocity, mean, self.tie.outer_lr, self.tie.outer_momentum)
        self._digest = None
        self.round_no += 1
        self.rounds += 1
        self.bytes_sent += sent_total
        if group.quorum.id not in self.quorums:
            self.quorums.append(group.quorum.id)
        if not easgd:
            self._set_centre(centre, self.anchor, keep_since=None if done else snaps)
        elif not done:  # each centre moves toward the mean by beta, keeping later syncs
            self._move_centre(centre, snaps)
        if self._broken_at is not None:
            self.recoveries_s.append(time.monotonic() - self._broken_at)
            self._broken_at = None
            log.warning("node %s: outer rounds go on in quorum %d (%s), %.2f s after a round "
                        "broke", self.name, group.quorum.id, ", ".join(group.quorum.members),
                        self.recoveries_s[-1])
        if contributes:
            self._note_contribution()
            self._handed_over = done

    def _diverged(self, group, exc: NonFiniteValues) -> PlatoonError:
        """A mean refused for NaN or Inf: NonFiniteValues on the members whose centre holds it
        (their node ends), QuorumBroken on the others (they drop the round and go on)."""
        if not exc.ranks or group.rank in exc.ranks:
            return exc
        return QuorumBroken(
            "the centre of node(s) %s (rank(s) %s of quorum %d: %s) holds NaN or Inf (training "
            "diverged there; that node ends): the round is dropped, and the others go on "
            "without it" % (", ".join(group.quorum.members[r] for r in exc.ranks),
                            ", ".join(map(str, exc.ranks)), group.quorum.id,
                            ", ".join(group.quorum.members)))

    def _move_centre(self, centre, snaps) -> None:
        """EASGD's move of each centre array toward the anchor (the members' mean) from its
        snapshot `snaps`, ``c += beta * (anchor - snap)``, in one hold of the lock: what the
        workers added since the snapshot stays."""
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            for c, snap, anchor in zip(centre.arrays, snaps, self.anchor):
                move = anchor - snap
                move *= self.tie.beta
                c += move
        finally:
            centre.lock.release()

    def _note_contribution(self) -> None:
        if self.first_contribution_s is None:
            self.first_contribution_s = time.time() - self.started_at
            log.warning("node %s: first contributing round %.2f s after its start", self.name,
                        self.first_contribution_s)

    def _final(self, group) -> None:
        """Every member is done and handed over: each centre is the anchor, the same bits."""
        self._set_centre(self.ctl.shared_centre, self.anchor)
        self.final_rank = group.rank
        log.info("node %s: final round in quorum %d: its centre is the anchor of outer round "
                 "%d, as on %s", self.name, group.quorum.id, self.round_no,
                 ", ".join(group.quorum.members))
