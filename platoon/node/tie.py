"""The centre tie of a multi-node job, one engine under both paths: a thread per node that ties
its controller's centre to the other nodes' in rounds over a group (`Group`: a fixed world's
MPI communicator, `platoon.mpi.tie`; an elastic job's quorum over gloo, `platoon.elastic.tie`),
its membership a policy (`Membership`: which group comes next, how headers are signed, what a
broken round means: the fixed world aborts, an elastic job drops the round and goes on).

Every member holds the same anchor and outer momentum, numbered by the outer rounds applied
(`round_no`). Each round begins with a header every member sends (`decision.RoundHeader`:
ready, done, handed over, round_no, the newest quorum id it has heard of, a sha256 of its
anchor and momentum (before the first anchor: of its centre) and of its centre's layout, its
tie's settings and a summary of its layout), signed as the membership says: a header that
fails its check breaks the round before anything is applied, and a healed member checks the
anchor it receives against its source's signed sha256. Then, the same decision on every member
(`decision.decide`):

- a member whose tie settings (codec, rule and its settings) or model layout differ from the
  job's is refused at the door (NodeRefused, naming the setting); the others drop the round;
- someone has heard of a newer quorum: all leave this group for it;
- nobody has an anchor yet (the job's first round): the anchor is the mean of the centres,
  sent losslessly; when every centre is already the same bits (their sha256s in the headers
  say so: nodes started from one seed), none is sent;
- the members' anchors differ (a joiner has none; a member missed a round that broke while
  the others applied it): the lowest-ranked member with the highest round_no broadcasts its
  anchor and momentum, losslessly, and each member that differed takes them (a joiner's centre
  becomes the anchor; another's keeps what its workers added). Then, in the same round, an
  outer round as below, every member taking its step: a repaired member's move in the mean,
  a joiner's not (nothing yet: its centre is the anchor it just took; counted, it would shrink
  the step by 1/p; its workers' first work goes in the next round), and a round that breaks
  there keeps the heal (every healed anchor is the source's, checked against its signed
  sha256);
- otherwise an outer round: each member's move (centre minus anchor) travels compressed with
  error feedback (`Group.compressed_mean`), its arrays packed into one message per dtype; every
  array's mean is in before any anchor changes, so a round that breaks changes no anchor,
  momentum or residual, and no centre is half-updated. The outer rule (`OuterRule`, chosen by
  ``--tie-outer``) makes the new anchor: DiLoCo's outer step, or EASGD's mean centre, after
  which each training member's centre moves toward it by beta. A mean refused for NaN or Inf
  (in any round, the first included) ends the members that hold it and breaks the round for
  the others.

Rounds come every `every_s` (or `every_syncs`) from the last one's start, but a group's first
round comes at once, and a node that hears of a newer quorum (a joiner's, the membership says)
starts its next round at once, in which every member leaves for it: a joiner waits for no
member's pace. After a round that healed a joiner, the next one comes as soon as the joiner's
workers have synced once from the anchor (at most its pace later): the other members start it
at once and wait there for the joiner, whose first move is in it.

A node whose workers are done hands its centre over once (its last move is in the next mean),
then takes every anchor without contributing; when every member is done and handed over, each
sets its centre to the anchor (the final agreement): the same bits on every node alive at the
end. A done node whose group makes no round for `final_timeout_s` (elastic: the others gone)
gives the final round up and keeps its own centre.
"""

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._os.nodesettings import OUTER_RULES, CentreTie
from ..errors import NodeRefused, NonFiniteValues, PlatoonError, QuorumBroken
from .compress import ErrorFeedback, RawCodec, make_codec
from .decision import (
    DIGEST_BYTES,
    HEADER_BYTES,
    RoundHeader,
    decide,
    door_settings,
    layout_summary,
)
from .group import Group, Membership
from .outer import DiLoCoOuter, EASGDOuter, OuterRule, outer_rule, outer_step

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 60.0  # a worker stopped while holding the centre fails the tie
IDLE_POLL_S = 0.05  # between rounds while some member's centre is not ready
SYNC_POLL_S = 0.01  # a wait for the workers' syncs
HALT_TIMEOUT_S = 10.0

__all__ = ["CentreTie", "OUTER_RULES", "LOCK_TIMEOUT_S", "outer_step", "OuterRule", "DiLoCoOuter",
           "EASGDOuter", "outer_rule", "Group", "Membership", "NodeTie"]


def _sha256(arrays: Sequence[np.ndarray]) -> bytes:
    h = hashlib.sha256()
    for a in arrays:
        h.update(("%s%s" % (a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def _by_dtype(arrays: Sequence[np.ndarray]) -> List[List[int]]:
    """The indices of `arrays` grouped by dtype, first seen first: each group's moves travel
    packed as one message."""
    groups: Dict[str, List[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype.str, []).append(i)
    return list(groups.values())


def _feedback_for(arrays: Sequence[np.ndarray]) -> List[ErrorFeedback]:
    """One ErrorFeedback for each packed message of `arrays`' moves (`_by_dtype`)."""
    return [ErrorFeedback(sum(arrays[i].size for i in indices), arrays[indices[0]].dtype)
            for indices in _by_dtype(arrays)]


class NodeTie:
    """The thread that ties node `name`'s `controller`'s centre to the other nodes' as `tie` (a
    CentreTie) says, in the groups `membership` gives (see the module's doc). `outer`: the
    outer rule (default: the one `tie` names). `on_failure(message)` ends the node (a fixed
    world: the job) when the tie cannot go on. `started_at`: the node's start (time.time()),
    for the joiner's time to its first contributing round.

    The controller's side: `node_done` (its workers are all done), `stop` (wait for the final
    round; raise its error), `halt` (end now, no final round: the centre is going)."""

    def __init__(self, tie: CentreTie, membership: Membership, name: str, controller: Any,
                 on_failure: Callable[[str], None], started_at: Optional[float] = None,
                 outer: Optional[OuterRule] = None):
        self.tie, self.membership, self.ctl = tie, membership, controller
        self.name, self.on_failure = name, on_failure
        self.outer = outer_rule(tie) if outer is None else outer
        self.final_timeout_s = membership.final_timeout_s
        self.gave_up = False  # no final round within final_timeout_s of the last round
        self._round_at = time.monotonic()  # when a round's header last went round the group
        self._done_at: Optional[float] = None
        self.started_at = time.time() if started_at is None else started_at
        self.codec = make_codec(tie.compress)
        # per centre array, the same bits on every member (None: no anchor yet)
        self.anchor: Any = None  # Optional[List[np.ndarray]]
        self.velocity: Any = None  # the outer rule's state, Optional[List[np.ndarray]]
        self._digest: Optional[bytes] = None  # their sha256, once asked (None: not yet)
        self._feedback: Any = None  # this node's Optional[List[ErrorFeedback]]
        self._first_snaps: Any = None  # before the first anchor: the centre its header hashed
        self.round_no = -1  # outer rounds applied to the anchor (-1: no anchor)
        self.rounds = self.broken_rounds = self.heals = 0
        self.sent_rounds = 0  # outer rounds with a message of this node's
        self.bytes_sent = 0
        # of which the lossless rounds this node took part in (the first anchor, heals)
        self.lossless_rounds = self.lossless_bytes = 0
        self.quorums: List[int] = []  # the ids of the quorums this node made rounds in
        self._group_rounds = 0  # the rounds begun in the current group
        self.healed_from: Optional[str] = None
        self.healed_after_s: Optional[float] = None  # from the node's start
        self.first_contribution_s: Optional[float] = None  # from the node's start
        # on the way to it (seconds from the node's start): its centre, heartbeating, its group
        self.milestones: Dict[str, float] = {}
        # after a round that healed a joiner: -1 on the others (their next round at once), the
        # joiner's sync count at its heal (its next round once its workers synced since)
        self._after_joiner: Optional[int] = None
        self.final_rank: Optional[int] = None  # this node's rank in the final group
        self._handed_over = False
        self._done = threading.Event()
        self._halt = threading.Event()
        self.final = threading.Event()
        self._awaiting = threading.Event()  # in `initial_centre`
        self._decided = threading.Event()  # `initial_centre` answers
        self._awaiting_until: Optional[float] = None  # its deadline, from its first call
        self.final_error: Optional[BaseException] = None
        self._group: Any = None  # the current Group
        self._broken_at: Optional[float] = None  # when a round broke, until one succeeds
        self.recoveries_s: List[float] = []  # from each broken round to the next outer round
        self._last_start = 0.0
        self._thread = threading.Thread(target=self._run, name="platoon-centre-tie",
                                        daemon=True)
        self._thread.start()

    # --- the controller's side -----------------------------------------------------------
    def node_done(self) -> None:
        """This node's workers are all done: its centre no longer moves."""
        if self._done_at is None:
            self._done_at = time.monotonic()
        self._done.set()

    def stop(self) -> None:
        """Wait for the final round (every member done), or, where the membership bounds it,
        until the node gives it up (`final_timeout_s` without a round); raise its error."""
        self.node_done()
        while self._thread.is_alive():
            self._thread.join(1.0)
            if self._thread.is_alive() and self._final_overdue(
                    HALT_TIMEOUT_S + 2 * (self.membership.timeout_s or 0.0)):
                if not self.halt():
                    log.warning("node %s: the centre tie thread did not end", self.name)
                break
        if self.final_error is not None:
            raise self.final_error

    def halt(self, timeout_s: float = HALT_TIMEOUT_S) -> bool:
        """End now, without a final round (the controller is closing): a round under way is
        left unfinished and the centre not touched again. Returns whether the thread ended
        within `timeout_s`."""
        self._halt.set()
        self._done.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def halted(self) -> bool:
        return self._halt.is_set()

    def summary(self) -> str:
        """What this node's tie did and sent, one line."""
        lossless, coded_bytes = self.lossless_rounds, self.bytes_sent - self.lossless_bytes
        where = " in quorum(s) %s" % (",".join(map(str, self.quorums)) or "none") \
            if self.membership.changes else ""
        text = ("the centre tie sent %d bytes from this node: %d outer round(s), %d with its "
                "move in %s, %d bytes (%.0f a round), and %d lossless (the first anchor, "
                "heals), %d bytes; %s%s"
                % (self.bytes_sent, self.rounds, self.sent_rounds, self.tie.compress,
                   coded_bytes, coded_bytes / self.sent_rounds if self.sent_rounds else 0.0,
                   lossless, self.lossless_bytes, self.outer.describe(), where))
        if self.membership.changes:
            text += "; %d round(s) broke and were dropped; %s" % (
                self.broken_rounds, "healed from %s %.2f s after its start" % (
                    self.healed_from, self.healed_after_s or 0.0) if self.healed_from
                else "never healed from a peer")
        if self.gave_up:
            text += ("; no final round within %.3g s: it kept its own centre"
                     % (self.final_timeout_s or 0.0))
        return text

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

    # --- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            # A node that can be healed enters only with a centre; in a fixed world every
            # node is in every round, with a centre or without (a node whose workers share
            # nothing says so, and the others do not wait for it).
            while self.membership.changes and self.ctl.shared_centre is None:
                if self._halt.wait(IDLE_POLL_S):
                    return
            self._milestone("centre")
            self.membership.connect()
            self._milestone("heartbeating")
            while not self._halt.is_set():
                if self._final_overdue():
                    self._give_up()
                    return
                if self._group is None:
                    self._group = self.membership.next_group(self._halt)
                    if self._group is None:
                        continue
                    self._milestone("group")
                self._wait_for_round()
                if self._halt.is_set():
                    return
                self._last_start = time.monotonic()
                try:
                    if self._round():
                        return
                except QuorumBroken as exc:
                    self.broken_rounds += 1
                    if self._broken_at is None:
                        self._broken_at = time.monotonic()
                    group = self._group
                    self._leave_group()
                    self.membership.broken(group, exc)  # a fixed world raises: the tie ends
                    log.warning("%s; the round is dropped", exc)
        except Exception as exc:  # a diverged or refused centre: the tie cannot go on
            if self._halt.is_set():  # the controller is closing: not a failure of the tie
                log.debug("node %s: the centre tie ended while halted", self.name, exc_info=True)
                return
            self.final_error = exc
            if isinstance(exc, NodeRefused):
                log.error("%s", exc)
            else:
                log.exception("node %s: the centre tie failed", self.name)
            self.membership.close()  # out of the next quorum at once, not after a timeout
            self.on_failure("the centre tie failed: %s" % exc)
        finally:
            self._leave_group()
            self.membership.close()
            self.final.set()

    def _final_overdue(self, slack_s: float = 0.0) -> bool:
        """Done, and no round for `final_timeout_s` (plus `slack_s`)."""
        if self._done_at is None or self.final_timeout_s is None:
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

    def _milestone(self, name: str) -> None:
        """Note the first time this node reached `name` (seconds from its start)."""
        self.milestones.setdefault(name, time.time() - self.started_at)

    def _leave_group(self) -> None:
        group, self._group = self._group, None
        self._group_rounds = 0
        self._after_joiner = None  # a new group's rounds keep their own pace
        if group is not None:
            group.close()

    def _wait_for_round(self) -> None:
        """Return when this node is due for a round: `every_s` after the last round began, or
        once its workers made `every_syncs` syncs since; at once when done and not handed over
        (or done, paced in syncs: they no longer come), in a new group (its first round
        repairs what differs: a joiner's heal), or when a quorum newer than its group's is
        heard of (every member then leaves for it: a joiner waits for no pace)."""
        if self._group_rounds == 0:
            return
        after_joiner, self._after_joiner = self._after_joiner, None
        if after_joiner is not None and after_joiner < 0:
            return  # a joiner was healed: this round waits for its first move, not for a pace
        tie, start = self.tie, self._last_start
        syncs = self.ctl.progress["syncs"] if tie.every_syncs is not None else 0
        group = self._group
        while not self._halt.is_set():
            if self._done.is_set() and (not self._handed_over or tie.every_s is None):
                return
            if after_joiner is not None:  # healed as a joiner: once its workers synced
                if self.ctl.progress["syncs"] > after_joiner:
                    return
            left = None if tie.every_s is None else start + tie.every_s - time.monotonic()
            if left is not None and left <= 0:
                return
            if tie.every_syncs is not None:
                if self.ctl.progress["syncs"] - syncs >= tie.every_syncs:
                    return
            if tie.every_syncs is not None or after_joiner is not None:
                left = SYNC_POLL_S if left is None else min(left, SYNC_POLL_S)  # syncs: a poll
            if self.membership.changes and group is not None:
                if self.membership.newest_quorum() > group.quorum.id:
                    log.debug("node %s: quorum %d heard of: leaving quorum %d before its pace",
                              self.name, self.membership.newest_quorum(), group.quorum.id)
                    return
                left = IDLE_POLL_S if left is None else min(left, IDLE_POLL_S)  # a poll
            (self._halt if self._done.is_set() else self._done).wait(left)

    def _header(self) -> RoundHeader:
        centre = self.ctl.shared_centre
        # 2: the centre holds its values; 1: created, awaiting them (`initial_centre`)
        ready = 2 if self.ctl.centre_ready and centre is not None else \
            1 if self._awaiting.is_set() and centre is not None else 0
        digest = bytes(DIGEST_BYTES)
        if self.anchor is not None:
            if self._digest is None:  # once for each new anchor
                self._digest = _sha256(self.anchor + self.velocity)
            digest = self._digest
        elif ready == 2:  # before the first anchor: its centre's, to skip sending equal ones
            _, self._first_snaps = self._snapshot()
            digest = _sha256(self._first_snaps)
        layout_digest, layout = bytes(DIGEST_BYTES), ""
        if ready:
            layout_digest = hashlib.sha256(repr(centre.layout).encode()).digest()
            layout = layout_summary(centre.layout)
        return RoundHeader(ready, self._done.is_set(), self._handed_over, self.round_no,
                           self.membership.newest_quorum(), digest, layout_digest,
                           door_settings(self.tie), layout)

    def _gather_headers(self, group: Group) -> List[RoundHeader]:
        """Every member's signed header of this round, in rank order; QuorumBroken, before
        anything is applied, when one fails its signature's check."""
        packed = self._header().pack()
        mac = self.membership.sign(group, packed)
        rows = group.all_gather_bytes(np.frombuffer(packed + mac, np.uint8))
        self._round_at = time.monotonic()  # every member answered: the group is alive
        for r, row in enumerate(rows):
            if not self.membership.signed(group, r, bytes(row[:HEADER_BYTES]),
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
        self._group_rounds += 1
        headers = self._gather_headers(group)
        decision = decide(headers, group.quorum.id, group.quorum.members)
        if group.quorum.id not in self.quorums:
            self.quorums.append(group.quorum.id)
        if decision.action == "leave":  # every member leaves for the newer quorum alike
            self._leave_group()
            return False
        if decision.action == "refuse":
            self._refuse(group, decision.refused)
        if all(h.round_no < 0 for h in headers) and headers[group.rank].ready == 1:
            self._decided.set()  # the job's start: the workers write the first values
        if decision.action == "first_anchor":
            self._first_anchor(group, [h.anchor_digest for h in headers])
        elif decision.action == "heal":
            joiner = self.anchor is None
            self._heal(group, decision.source, decision.best, list(decision.differing),
                       headers[decision.source].anchor_digest)
            if decision.members:  # the outer round comes with the heal
                self._outer_round(group, list(decision.members))
                if any(headers[r].round_no < 0 for r in decision.differing):
                    # the next round: once the joiner's workers synced from the anchor
                    self._after_joiner = self.ctl.progress["syncs"] if joiner else -1
        elif decision.action in ("final", "end"):
            self._final(group, agreed=decision.action == "final")
            return True
        elif decision.action == "outer":
            self._outer_round(group, list(decision.members))
        else:  # "wait"
            self._halt.wait(IDLE_POLL_S)
        return False

    def _refuse(self, group: Group, refused: Mapping[int, str]) -> None:
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

    def _snapshot(self) -> Tuple[Any, List[np.ndarray]]:
        centre = self.ctl.shared_centre
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            return centre, [a.copy() for a in centre.arrays]
        finally:
            centre.lock.release()

    @staticmethod
    def _set_centre(centre: Any, new: Sequence[np.ndarray],
                    keep_since: Optional[Sequence[np.ndarray]] = None) -> None:
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

    def _first_anchor(self, group: Group, digests: Optional[Sequence[bytes]] = None) -> None:
        """The job's first round: the anchor is the mean of the centres, losslessly (DiLoCo's
        centres become it, EASGD's move toward it by beta); when the members' headers carried
        one sha256 (`digests`: their centres are the same bits), it is this node's centre as
        its header hashed it, and nothing is sent."""
        training = not self._done.is_set()  # read once, before the snapshot (as _outer_round)
        snaps = self._first_snaps  # what this round's header hashed: its own digest is in
        if digests is not None and snaps is not None and len(set(digests)) == 1:
            centre, sent_total = self.ctl.shared_centre, 0
            if not all(np.isfinite(s).all() for s in snaps):  # the same answer on every member
                raise self._diverged(group, NonFiniteValues(
                    "NaN or Inf in the centres", list(range(group.size))))
            means = [s.copy() for s in snaps]
        else:
            centre, snaps = self._snapshot()
            means, sent_total = [], 0
            try:
                for s in snaps:
                    mean, sent = group.compressed_mean(s, RawCodec(s.dtype))
                    sent_total += sent
                    means.append(mean)
            except NonFiniteValues as exc:
                raise self._diverged(group, exc) from exc
        self._first_snaps = None
        self.bytes_sent += sent_total
        self.lossless_rounds += 1
        self.lossless_bytes += sent_total
        self.anchor = means
        self.velocity = [np.zeros_like(a) for a in means]
        self._feedback = _feedback_for(means)
        self.round_no = 0
        self._digest = None
        if not self.outer.moves_centres:
            self._set_centre(centre, self.anchor, keep_since=snaps if training else None)
        elif training:  # EASGD: toward the mean by beta, as in every round
            self._move_centre(centre, snaps)
        self._note_contribution(group)

    def _heal(self, group: Group, source: int, best: int, differing: List[int],
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
            self.lossless_bytes += payload.size * len(differing)
            self.lossless_rounds += 1
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
        self.lossless_rounds += 1
        if joiner:
            self._set_centre(centre, self.anchor)
            self._decided.set()
            self.healed_from = group.quorum.members[source]
            self.healed_after_s = time.time() - self.started_at
            self.milestones.setdefault("healed", self.healed_after_s)
            log.warning("node %s: healed from %s in quorum %d (outer round %d), %.2f s after "
                        "its start", self.name, self.healed_from, group.quorum.id, best,
                        self.healed_after_s)
        else:  # its centre minus its old anchor plus the new one, in one hold of the lock
            self._set_centre(centre, self.anchor, keep_since=old)
            log.warning("node %s: its anchor repaired from %s in quorum %d (outer round %d); "
                        "its workers' work since its old anchor kept", self.name,
                        group.quorum.members[source], group.quorum.id, best)

    def _outer_round(self, group: Group, members: List[int]) -> None:
        """The outer rule's step on the anchor from the mean move of `members`.

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
        for anchor, velocity, mean in zip(self.anchor, self.velocity, means):
            self.outer.step(anchor, velocity, mean)
        self._digest = None
        self.round_no += 1
        self.rounds += 1
        self.bytes_sent += sent_total
        if not self.outer.moves_centres:
            self._set_centre(centre, self.anchor, keep_since=None if done else snaps)
        elif not done:  # each centre moves toward the anchor, keeping later syncs
            self._move_centre(centre, snaps)
        if self._broken_at is not None:
            self.recoveries_s.append(time.monotonic() - self._broken_at)
            self._broken_at = None
            log.warning("node %s: outer rounds go on in quorum %d (%s), %.2f s after a round "
                        "broke", self.name, group.quorum.id, ", ".join(group.quorum.members),
                        self.recoveries_s[-1])
        if contributes:
            self.sent_rounds += 1
            self._note_contribution(group)
            self._handed_over = done
        log.debug("node %s: centre tie round %d, %d bytes sent so far", self.name, self.rounds,
                  self.bytes_sent)

    def _diverged(self, group: Group, exc: NonFiniteValues) -> PlatoonError:
        """A mean refused for NaN or Inf: NonFiniteValues on the members whose centre holds it
        (their node ends), QuorumBroken on the others (they drop the round and go on)."""
        names = group.quorum.members
        nodes = ", ".join(names[r] for r in exc.ranks) or "?"
        where = "rank(s) %s of quorum %d: %s" % (", ".join(map(str, exc.ranks)) or "?",
                                                 group.quorum.id, ", ".join(names))
        if not exc.ranks or group.rank in exc.ranks:
            return NonFiniteValues(
                "node(s) %s's centre holds NaN or Inf (training diverged there?; %s): the "
                "centre tie refuses it rather than average it into every node's centre, "
                "whatever --tie-compress; that node ends (resume it from its last good "
                "checkpoint, with a lower learning rate)" % (nodes, where), exc.ranks)
        return QuorumBroken(
            "node(s) %s's centre holds NaN or Inf (%s; training diverged there, that node "
            "ends): the round is dropped" % (nodes, where))

    def _move_centre(self, centre: Any, snaps: Sequence[np.ndarray]) -> None:
        """The outer rule's move of each centre array toward the anchor from its snapshot
        `snaps`, in one hold of the lock: what the workers added since the snapshot stays."""
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            for c, snap, anchor in zip(centre.arrays, snaps, self.anchor):
                self.outer.move_centre(c, snap, anchor)
        finally:
            centre.lock.release()

    def _note_contribution(self, group: Group) -> None:
        if self.first_contribution_s is None:
            self.first_contribution_s = time.time() - self.started_at
            if self.membership.changes:
                log.warning("node %s: first contributing round %.2f s after its start (outer "
                            "round %d; round %d of its group in quorum %d; on the way: %s)",
                            self.name, self.first_contribution_s, self.round_no,
                            self._group_rounds, group.quorum.id, ", ".join(
                                "%s %.2f s" % item for item in self.milestones.items()))

    def _final(self, group: Group, agreed: bool = True) -> None:
        """Every member is done and handed over: each centre is the anchor, the same bits.
        Not `agreed` (some member never had a centre): each keeps its own."""
        self.final_rank = group.rank
        if not agreed or self.anchor is None:
            if self.ctl.shared_centre is not None:
                log.warning("node %s: no final centre tie: another node has no centre (its "
                            "workers never shared parameters)", self.name)
            return
        self._set_centre(self.ctl.shared_centre, self.anchor)
        log.info("node %s: final round in quorum %d: its centre is the anchor of outer round "
                 "%d, as on %s", self.name, group.quorum.id, self.round_no,
                 ", ".join(group.quorum.members))
