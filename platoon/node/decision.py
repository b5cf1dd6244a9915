"""What a group of node centres does in a tie round (an elastic job's quorum or a fixed world's
MPI communicator), decided alike on every member from the round headers they all-gathered: pure
logic, no sockets, no clocks (unit-tested from a table).

Each member's header (`RoundHeader`, a fixed `HEADER_BYTES`, signed by the tie) says where its
centre stands (ready, done, handed over, outer rounds applied, the newest quorum it heard of),
the sha256 of its anchor and of its centre's layout, and what it must share with every other
member to take part: the tie's settings that decide what a round's messages are and what is
done with them (`door_settings`), and a summary of its model's layout. A member whose settings
or layout differ from the job's is refused at this door, alone, before any payload travels
(the payloads' sizes follow from them: a collective over buffers of different sizes aborts
every member inside gloo). The job's settings are those most members hold; a tie between
groups goes to the one holding the most outer rounds, then to the lowest rank.
"""

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Mapping, Sequence, Tuple

import numpy as np

from .._os.nodesettings import CentreTie

VERSION = 1  # of the header's layout; a member of another version is refused
DIGEST_BYTES = 32
_FIELDS = 5  # ready, done, handed_over, round_no, newest quorum id (int64 each)
_DOOR_BYTES = 280  # the door's JSON, NUL-padded
HEADER_BYTES = 8 * _FIELDS + 2 * DIGEST_BYTES + _DOOR_BYTES  # then the signature


def door_settings(tie: CentreTie) -> Dict[str, Any]:
    """The settings of `tie` every member of a quorum must share: the codec and the outer rule
    (a user's own by its ``MODULE:FACTORY`` name) with that rule's own settings (the pace,
    every_s, is each node's own)."""
    settings: Dict[str, Any] = {"compress": tie.compress, "outer": tie.outer}
    if tie.outer == "diloco":
        settings.update(outer_lr=tie.outer_lr, outer_momentum=tie.outer_momentum)
    elif tie.outer == "easgd":
        settings.update(beta=tie.beta)
    else:  # a user's own rule may read any of them
        settings.update(outer_lr=tie.outer_lr, outer_momentum=tie.outer_momentum, beta=tie.beta)
    return settings


def layout_summary(layout: Sequence[Mapping[str, Any]]) -> str:
    """A short, human-readable summary of a centre's layout (its arrays' "dtype" and "shape",
    as `SharedCentre.layout` holds them)."""
    values: Dict[str, int] = {}
    for entry in layout:
        dtype = np.dtype(entry["dtype"]).name
        values[dtype] = values.get(dtype, 0) + int(math.prod(entry["shape"]))
    return "%d array(s): %s" % (len(layout), ", ".join(
        "%d %s" % (n, dtype) for dtype, n in values.items()))


@dataclass(frozen=True)
class RoundHeader:
    """One member's header of a round. ready: 2 its centre holds values, 1 created and
    awaiting them, 0 none yet; round_no: the outer rounds applied to its anchor (-1: none);
    newest_quorum: the newest quorum id it heard of; anchor_digest / layout_digest: sha256s
    (zeros when it has none); settings: `door_settings` of its tie; layout: `layout_summary`
    of its centre ("" without one)."""

    ready: int
    done: bool
    handed_over: bool
    round_no: int
    newest_quorum: int
    anchor_digest: bytes = bytes(DIGEST_BYTES)
    layout_digest: bytes = bytes(DIGEST_BYTES)
    settings: Mapping[str, Any] = field(default_factory=dict)
    layout: str = ""
    version: int = VERSION

    def pack(self) -> bytes:
        """The header as `HEADER_BYTES` bytes (ValueError when its door does not fit)."""
        fields = np.array([self.ready, self.done, self.handed_over, self.round_no,
                           self.newest_quorum], "<i8").tobytes()
        door = json.dumps({"v": self.version, "tie": dict(self.settings),
                           "layout": self.layout}, sort_keys=True).encode()
        if len(door) > _DOOR_BYTES:  # a summary too long: shortened, the digest stays exact
            door = json.dumps({"v": self.version, "tie": dict(self.settings),
                               "layout": self.layout[:60] + "..."}, sort_keys=True).encode()
        if len(door) > _DOOR_BYTES:
            raise ValueError("a round header's settings take %d bytes, more than %d"
                             % (len(door), _DOOR_BYTES))
        return fields + self.anchor_digest + self.layout_digest + door.ljust(_DOOR_BYTES, b"\0")

    @classmethod
    def unpack(cls, data: bytes) -> "RoundHeader":
        """The header `pack` made; one that cannot be read is returned with version -1 (its
        member is refused: another platoon, or not a header)."""
        if len(data) != HEADER_BYTES:
            return cls(0, False, False, -1, 0, version=-1)
        ready, done, handed, round_no, newest = (int(x) for x in np.frombuffer(
            data[:8 * _FIELDS], "<i8"))
        digests = data[8 * _FIELDS:8 * _FIELDS + 2 * DIGEST_BYTES]
        try:
            door = json.loads(data[8 * _FIELDS + 2 * DIGEST_BYTES:].rstrip(b"\0").decode())
            version, settings, layout = int(door["v"]), dict(door["tie"]), str(door["layout"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(0, False, False, -1, 0, version=-1)
        return cls(ready, bool(done), bool(handed), round_no, newest, digests[:DIGEST_BYTES],
                   digests[DIGEST_BYTES:], settings, layout, version)


@dataclass(frozen=True)
class Decision:
    """What every member does in this round. action:

    - "leave": someone heard of a newer quorum; all leave this group for it;
    - "refuse": the members in `refused` (rank -> why, naming the setting) differ from the
      job at the door; they end, the others drop the round and go on without them;
    - "wait": some member is not ready (no centre yet, or a differing anchor it cannot take
      yet): nothing happens;
    - "first_anchor": nobody has an anchor yet and every centre holds values: the anchor is
      the mean of the centres, losslessly;
    - "heal": the members in `differing` take the anchor and momentum of `source` (the
      lowest rank among those with the most outer rounds, `best`), losslessly; then, in the
      same round, an outer round among the ranks in `members` (empty: none) that every member
      steps by: a repaired member's move is in it, a joiner's not (it has none yet);
    - "final": every member is done and handed over: each centre becomes the anchor;
    - "end": every member is done but some never had a centre (its workers shared nothing):
      nothing to agree, each keeps its own;
    - "outer": an outer round, the mean move of the ranks in `members`.
    """

    action: str
    refused: Mapping[int, str] = field(default_factory=dict)
    source: int = -1
    best: int = -1
    differing: Tuple[int, ...] = ()
    members: Tuple[int, ...] = ()


def _majority(ranks: Sequence[int], key: Callable[[int], Hashable],
              headers: Sequence[RoundHeader]) -> List[int]:
    """The ranks holding the job's value of `key` when `ranks` hold more than one (empty when
    they agree): the most members, then the most outer rounds, then the lowest rank."""
    groups: Dict[Hashable, List[int]] = {}
    for r in ranks:
        groups.setdefault(key(r), []).append(r)
    if len(groups) < 2:
        return []
    return max(groups.values(), key=lambda rs: (len(rs), max(headers[r].round_no for r in rs),
                                                -min(rs)))


def _setting_flag(name: str) -> str:
    return "--tie-" + name.replace("_", "-")


def refusals(headers: Sequence[RoundHeader], members: Sequence[str]) -> Dict[int, str]:
    """The members refused at the door (rank -> why, naming each differing setting and the
    members holding the job's): another header version, other tie settings, then (among
    those with a centre) another model layout."""
    why: Dict[int, str] = {}

    def holders(job: Sequence[int], verb: str = "has", verbs: str = "have") -> str:
        return "%s %s" % (", ".join(members[r] for r in job), verb if len(job) == 1 else verbs)

    ranks = list(range(len(headers)))
    job = _majority(ranks, lambda r: headers[r].version, headers)
    for r in ranks:
        if job and r not in job:
            why[r] = ("its round header is not one this platoon reads (version %d where %s "
                      "%d): run the same platoon on every node"
                      % (headers[r].version, holders(job), headers[job[0]].version))
    rest = [r for r in ranks if r not in why]
    job = _majority(rest, lambda r: json.dumps(dict(headers[r].settings), sort_keys=True),
                    headers)
    for r in rest:
        if job and r not in job:
            mine, theirs = headers[r].settings, headers[job[0]].settings
            differing = ["%s %s where %s %s" % (_setting_flag(k), mine.get(k, "(not given)"),
                                                holders(job), theirs.get(k, "(not given)"))
                         for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
            why[r] = "its %s: start it with the job's settings" % "; ".join(differing)
    with_centre = [r for r in ranks if r not in why and headers[r].ready]
    job = _majority(with_centre, lambda r: headers[r].layout_digest, headers)
    for r in with_centre:
        if job and r not in job:
            mine_layout, job_layout = headers[r].layout or "?", headers[job[0]].layout or "?"
            why[r] = ("its model differs from the job's: its centre holds %s, where %s %s%s: "
                      "every node must run the same model" % (
                          mine_layout, holders(job, "holds", "hold"), job_layout,
                          " (another shape or order)" if mine_layout == job_layout else ""))
    return why


def decide(headers: Sequence[RoundHeader], quorum_id: int,
           members: Sequence[str]) -> Decision:
    """The round every member of quorum `quorum_id` (its `members`, in rank order) makes,
    from the headers they all-gathered (one per rank): see `Decision`."""
    if max(h.newest_quorum for h in headers) > quorum_id:
        return Decision("leave")
    refused = refusals(headers, members)
    if refused:
        return Decision("refuse", refused=refused)
    ready = [h.ready for h in headers]
    if all(h.done for h in headers) and not all(x == 2 for x in ready):
        return Decision("end")
    if all(h.round_no < 0 for h in headers):
        return Decision("first_anchor" if all(x == 2 for x in ready) else "wait")
    best = max(h.round_no for h in headers)
    source = next(r for r, h in enumerate(headers) if h.round_no == best)
    digest = headers[source].anchor_digest
    differing = tuple(r for r, h in enumerate(headers)
                      if h.round_no != best or h.anchor_digest != digest)
    contributors = tuple(r for r, h in enumerate(headers) if not (h.done and h.handed_over))
    if differing and all(ready[r] for r in differing):
        # a healed centre holds the anchor: with every other centre ready, the outer round
        # comes in this round too, every member taking its step; a joiner's move is nothing
        # yet, so its message is not in the mean (counted, it would shrink the step by 1/p)
        outer = all(x == 2 or r in differing for r, x in enumerate(ready))
        movers = tuple(r for r in contributors if not (r in differing and
                                                        headers[r].round_no < 0))
        return Decision("heal", source=source, best=best, differing=differing,
                        members=movers if outer else ())
    if differing or not all(x == 2 for x in ready):
        return Decision("wait")
    if not contributors:
        return Decision("final")
    return Decision("outer", members=contributors)
