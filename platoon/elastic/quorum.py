"""Quorums and the lighthouse's membership rule: pure logic, no sockets, no clocks of its own.

A quorum is a numbered list of the nodes that make the next outer rounds together. Its id
only grows: a node reports the highest id it has seen whenever it heartbeats, and the
lighthouse numbers its next quorum above every report, so a lighthouse restarted with no
memory still issues ids above every id its members knew. Each quorum also carries a random
nonce: its group meets under a store prefix holding it, so two quorums that share an id (a
lighthouse restarted before any node could report) never share a group (the nonce is no
secret: the store serves the job's nodes only).
The rule's settings (`MembershipSettings`) are declared with the lighthouse's other settings,
in `platoon._os.elasticsettings` (the launcher reads them, and loads no elastic module), and
re-exported here.
"""

import secrets
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .._os.elasticsettings import MembershipSettings  # (declared with the lighthouse's)

# A member whose data plane most other members of its quorum reported unreachable is out of
# the quorums this long (or until it heartbeats from another address or process), then tried
# again: each try costs the others one group that cannot form (--tie-timeout-s).
UNREACHABLE_FOR_S = 120.0
# A member that another reported gone (its data plane stopped answering as a round of their
# group broke: its process dead, most likely) is out of the next quorum once it has been
# silent this long, or GONE_SILENCE_PACES of the pace the lighthouse asks when longer, within
# the heartbeat timeout: ten of a node's 0.1 s heartbeats, where the timeout waits five
# seconds. A member heard from after the report stays (it is alive: the timeout decides).
GONE_SILENCE_S = 1.0
GONE_SILENCE_PACES = 3
# A report is checked against the processes the quorum it is on was issued with (a member
# restarted since is another process): those of the last GONE_QUORUMS_KEPT quorums are kept.
GONE_QUORUMS_KEPT = 8


@dataclass(frozen=True)
class Quorum:
    """One membership of the job: `id` (grows with every change), `members` (node names,
    sorted: a member's rank is its index) and `addresses` (each member's data-plane address,
    "host:port", in the same order); `nonce`, random hex the lighthouse gives it (it names
    the quorum's group; not compared)."""

    id: int
    members: Tuple[str, ...]
    addresses: Tuple[str, ...]
    nonce: str = field(default="", compare=False)

    def rank_of(self, name: str) -> int:
        """`name`'s rank in this quorum; raises ValueError when it is not a member."""
        try:
            return self.members.index(name)
        except ValueError:
            raise ValueError("node %r is not in quorum %d (members: %s)"
                             % (name, self.id, ", ".join(self.members))) from None

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def store_address(self) -> str:
        """Where this quorum's data plane meets: the address of its rank 0."""
        return self.addresses[0]

    def to_wire(self) -> Dict[str, Any]:
        return {"id": self.id, "members": list(self.members), "addresses": list(self.addresses),
                "nonce": self.nonce}

    @classmethod
    def from_wire(cls, data: Dict[str, Any]) -> "Quorum":
        members, addresses = data["members"], data["addresses"]
        nonce = data.get("nonce", "")
        if not (isinstance(data["id"], int) and isinstance(members, list)
                and isinstance(addresses, list) and len(members) == len(addresses)
                and all(isinstance(x, str) for x in members + addresses + [nonce])):
            raise ValueError("not a quorum: %r" % (data,))
        return cls(data["id"], tuple(members), tuple(addresses), nonce)


@dataclass
class _Unreachable:
    """A report that a member's data plane at `address` (the process `incarnation`) could not
    be reached, first made at `since`, by `reporters`."""

    address: str
    incarnation: str
    since: float
    reporters: Set[str] = field(default_factory=set)


class Membership:
    """Who is live and which quorum holds. Feed it `heartbeat`s and `leave`s, call `tick(now)`
    often; it returns a new Quorum when one is issued. Times are the caller's monotonic
    seconds."""

    def __init__(self, settings: MembershipSettings):
        self.settings = settings
        self._last_seen: Dict[str, float] = {}
        self._addresses: Dict[str, str] = {}
        self._incarnations: Dict[str, str] = {}  # each live name's process (its client's id)
        self._highest_reported = 0
        self.quorum: Optional[Quorum] = None
        self._change_since: Optional[float] = None  # when the live set first differed
        self._issued_at: Optional[float] = None  # when the current quorum was issued
        self._rebuild = False  # a member asked for a new id (`heartbeat`'s `broken`)
        self._unreachable: Dict[str, _Unreachable] = {}  # by the name reported
        self._gone: Dict[str, str] = {}  # reported gone: name -> its incarnation then
        self._issued: Dict[int, Dict[str, str]] = {}  # recent quorums: id -> member -> process
        self._gone_counted: Set[Tuple[str, int, str]] = set()  # (reporter, quorum, reported)
        self.pace_s = 0.0  # the pace the lighthouse asks (`gone_silence_s` scales with it)
        self.left_out: Dict[str, str] = {}  # `excluded` as of the last `tick`

    def heartbeat(self, name: str, address: str, highest_seen: int, now: float,
                  broken: int = 0, incarnation: str = "",
                  unreachable: Sequence[str] = (), gone: Sequence[str] = (),
                  gone_of: int = 0) -> bool:
        """`name` is alive at `now`, reachable for the data plane at `address`, and has seen
        quorum ids up to `highest_seen`. `broken`: the id of a quorum whose group broke for
        `name` with no newer quorum since (every member alive, yet one stalled a round past
        its timeout): while it is the current quorum and `name` a member, the next tick
        issues a new id for the same members, so that they build a new group.
        `incarnation`: the heartbeating process's id. Returns False, changing nothing, when
        another incarnation holds `name` and is live (two processes given one name): the
        second is taken in once the first leaves or times out. `unreachable`: members of the
        current quorum whose data plane `name` could not reach when their group failed to
        form (see `excluded`). `gone`: members of quorum `gone_of` whose data plane stopped
        answering when a round of its group broke, or while it formed: each is out once
        silent for `gone_silence_s` (see `live`), if it is still the process that quorum was
        issued with (a node restarted under its name is another) and `name` was one of its
        members.
        A report counts once (the reporter sends it with every heartbeat until its next
        group forms): a member heard from after it is left to the heartbeat timeout."""
        held = self._incarnations.get(name)
        if held is not None and held != incarnation and name in self._last_seen \
                and now - self._last_seen[name] <= self.settings.heartbeat_timeout_s:
            return False
        if broken and self.quorum is not None and broken == self.quorum.id \
                and name in self.quorum.members:
            self._rebuild = True
        self._last_seen[name] = now
        self._addresses[name] = address
        self._incarnations[name] = incarnation
        self._highest_reported = max(self._highest_reported, int(highest_seen))
        if self._gone:
            self._gone.pop(name, None)  # (heard from: alive, whatever was reported)
        members = () if not unreachable or self.quorum is None \
            or name not in self.quorum.members else self.quorum.members  # (a pass over them)
        issued = self._issued.get(int(gone_of)) if gone else None
        if issued is not None and issued.get(name) == incarnation:
            for other in gone:
                report = (name, int(gone_of), other)
                process = self._incarnations.get(other)
                if other != name and process is not None and process == issued.get(other) \
                        and report not in self._gone_counted:
                    self._gone_counted.add(report)
                    self._gone.setdefault(other, process)
        for other in unreachable:
            if other == name or other not in members or other not in self._addresses:
                continue
            entry = self._unreachable.get(other)
            if entry is None or not self._still(other, entry, now):
                entry = self._unreachable[other] = _Unreachable(
                    self._addresses[other], self._incarnations.get(other, ""), now)
            entry.reporters.add(name)
        return True

    def _still(self, name: str, entry: "_Unreachable", now: float) -> bool:
        """Whether the report `entry` on `name` holds: recent, and `name` heartbeats from the
        address and process reported."""
        return now - entry.since <= UNREACHABLE_FOR_S and name in self._last_seen \
            and (self._addresses.get(name), self._incarnations.get(name, "")) \
            == (entry.address, entry.incarnation)

    def excluded(self, now: float) -> Dict[str, str]:
        """The live nodes out of the quorums because at least half of the other live nodes
        (at least one) reported their data plane unreachable, within `UNREACHABLE_FOR_S` and
        while they heartbeat from the address and process reported: name -> why. Among three
        or more, a node that reported every other one is not counted (its own side is more
        likely the broken one)."""
        live = set(self._last_seen)
        for name, entry in list(self._unreachable.items()):
            if not self._still(name, entry, now):
                del self._unreachable[name]
        named: Dict[str, int] = {}  # reporter -> how many it reported
        for entry in self._unreachable.values():
            for reporter in entry.reporters:
                named[reporter] = named.get(reporter, 0) + 1
        out = {}
        for name, entry in self._unreachable.items():
            voters = sorted(r for r in entry.reporters & live
                            if len(live) < 3 or named[r] < len(live) - 1)
            if voters and 2 * len(voters) >= len(live) - 1:
                out[name] = ("its data plane at %s was unreachable from %s: give its --host an "
                             "address the other nodes reach (out of the quorums for up to %g s, "
                             "or until it heartbeats from another address)"
                             % (entry.address, ", ".join(voters), UNREACHABLE_FOR_S))
        return out

    def holder(self, name: str) -> Optional[str]:
        """The incarnation (process id) that holds `name` as of its last heartbeat, or None
        (not heard of, left or timed out)."""
        return self._incarnations.get(name)

    def leave(self, name: str, incarnation: Optional[str] = None) -> None:
        """`name` leaves (if `incarnation` holds it, when given): out of the next quorum,
        without waiting for its timeout."""
        if incarnation is not None and self._incarnations.get(name, incarnation) != incarnation:
            return
        self._last_seen.pop(name, None)
        self._addresses.pop(name, None)
        self._incarnations.pop(name, None)

    @property
    def gone_silence_s(self) -> float:
        """How long a member reported gone must have been silent to be out (GONE_SILENCE_S,
        or GONE_SILENCE_PACES paces when longer, within the heartbeat timeout)."""
        return min(self.settings.heartbeat_timeout_s,
                   max(GONE_SILENCE_S, GONE_SILENCE_PACES * self.pace_s))

    def live(self, now: float) -> List[str]:
        """The nodes heard from within the heartbeat timeout, or within `gone_silence_s` for
        those reported gone since they were last heard from (the silent ones are
        forgotten)."""
        timeout = self.settings.heartbeat_timeout_s
        for name, seen in list(self._last_seen.items()):
            if now - seen > timeout:
                self.leave(name)
        if self._gone:
            silence = self.gone_silence_s
            for name, incarnation in list(self._gone.items()):
                heard = self._last_seen.get(name)
                if heard is None or self._incarnations.get(name) != incarnation:
                    del self._gone[name]  # (timed out, left, or another process now)
                elif now - heard > silence:
                    del self._gone[name]
                    self.leave(name)
        return sorted(self._last_seen)

    @property
    def live_count(self) -> int:
        """How many nodes are live as of the last `tick` (and any heard of since), without a
        pass over them."""
        return len(self._last_seen)

    def tick(self, now: float) -> Optional[Quorum]:
        """Issue the next quorum when the live nodes differ from the current quorum's (or a
        member's address changed), at least `min_nodes` are live, and the grace window since
        the change began has passed; returns it, else None. A change that only adds joiners
        to a running quorum (its members all live, at their addresses) does not wait for the
        grace window, only for the current quorum to be that old (so that a burst of joiners
        makes a quorum per window at most, not one each)."""
        live = self.live(now)
        self.left_out = excluded = self.excluded(now)
        names = [n for n in live if n not in excluded]
        addresses = tuple(self._addresses[n] for n in names)
        current = self.quorum
        changed = current is None or self._rebuild or (tuple(names), addresses) != (
            current.members, current.addresses)
        if not changed or len(names) < self.settings.min_nodes:
            self._change_since = None
            return None
        if self._change_since is None:
            self._change_since = now
        since = self._change_since
        if current is not None and self._issued_at is not None and not self._rebuild \
                and set(zip(current.members, current.addresses)) <= set(zip(names, addresses)):
            since = min(since, self._issued_at)  # joiners only: the running quorum's age
        if now - since < self.settings.join_grace_s:
            return None
        self._change_since = None
        self._rebuild = False
        self._issued_at = now
        last = 0 if current is None else current.id
        self.quorum = Quorum(max(last, self._highest_reported) + 1, tuple(names), addresses,
                             secrets.token_hex(16))
        self._issued[self.quorum.id] = {n: self._incarnations.get(n, "") for n in names}
        for old in sorted(self._issued)[:-GONE_QUORUMS_KEPT]:
            del self._issued[old]
        self._gone_counted = {r for r in self._gone_counted if r[1] in self._issued}
        return self.quorum
