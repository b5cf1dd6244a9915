"""The centre tie of an elastic job: the node layer's tie (`platoon.node.tie.NodeTie`, whose
doc says what a round does) among the members of each quorum the lighthouse forms, over that
quorum's gloo group (`QuorumGroup`), as `ElasticMembership` says: headers signed with the job's
secret over the quorum's id and nonce and the member's rank, a round that breaks dropped (the
node waits for a quorum newer than the broken one and builds its group; the header of its first
round repairs whatever anchors differ), a member whose data plane cannot be reached reported
to the lighthouse (gone, when a round broke or a group waited for it: out once silent; left
out, when a group could not form), and a done node whose group makes no round for
`final_timeout_s` (the others gone, too few nodes for a quorum, the lighthouse gone for good)
giving the final round up and keeping its own centre (the last anchor, once handed over).
"""

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional, cast

from .._os.elasticsettings import FINAL_TIMEOUT_S  # (an elastic node's setting)
from ..errors import PlatoonError, QuorumBroken, QuorumTimeout
from ..node.group import Group
from ..node.tie import (  # noqa: F401 (_sha256, _feedback_for: read by the tests)
    CentreTie,
    NodeTie,
    OuterRule,
    _feedback_for,
    _sha256,
)
from .client import LighthouseClient
from .quorum import Quorum

if TYPE_CHECKING:
    from .._controller.services import ControllerServices
    from .dataplane import QuorumGroup

log = logging.getLogger(__name__)
# A group forming that has waited this long for its members tries their data planes (once):
# longer than a group of members all alive takes to meet (a member ending a round of its
# old group comes a round later: then it answers).
GONE_PROBE_AFTER_S = 1.0


def _quorum_of(group: Group) -> Quorum:
    """The quorum of `group`, one of those `ElasticMembership.next_group` gives (QuorumGroups:
    the tie hands back only those), whose nonce the signatures cover."""
    return cast(Quorum, group.quorum)


class ElasticMembership:
    """The quorums a LighthouseClient (made by `connect()`) hears of, each a gloo group built
    for node `name`, its collectives bounded by `timeout_s`."""

    changes = True

    def __init__(self, connect: Callable[[], LighthouseClient], name: str, timeout_s: float,
                 final_timeout_s: Optional[float] = FINAL_TIMEOUT_S) -> None:
        self._connect, self.name, self.timeout_s = connect, name, timeout_s
        self.final_timeout_s = final_timeout_s
        self.client: Optional[LighthouseClient] = None  # once connected
        self._last_id = 0  # the quorum of the last group built (or tried)
        self._waiting_since = 0.0  # for a quorum newer than the last group's

    def connect(self) -> None:
        if self.client is None:
            self.client = self._connect()

    @property
    def _lighthouse(self) -> LighthouseClient:
        """The client (`connect()` made it before any group)."""
        assert self.client is not None, "ElasticMembership.connect() comes first"
        return self.client

    def next_group(self, cancel: threading.Event) -> "Optional[QuorumGroup]":
        """The group of the next quorum holding this node (newer than the last one's), or None
        (none yet; a group that cannot form, its unreachable members told to the lighthouse)."""
        from .dataplane import QuorumGroup, unreachable_members
        try:
            quorum = self._lighthouse.wait_for_quorum(timeout_s=0.5, newer_than=self._last_id)
        except QuorumTimeout:
            if self._last_id and time.monotonic() - self._waiting_since > self.timeout_s:
                # every member heartbeats, yet the group broke (one stalled a round past
                # its timeout): no member is dropped, so ask for a new id
                log.warning("node %s: no quorum after %d within %.3g s of its group's end; "
                            "asking the lighthouse for a new one", self.name, self._last_id,
                            self.timeout_s)
                self._lighthouse.report_broken(self._last_id)
                self._waiting_since = time.monotonic()
            return None
        self._last_id = quorum.id
        self._waiting_since = time.monotonic()  # a group that cannot form: as a broken one
        try:
            group = QuorumGroup(quorum, self.name, self.timeout_s,
                                secret=self._lighthouse.secret, abandon=self._forming(quorum))
        except QuorumBroken as exc:
            log.warning("%s", exc)
            unreachable = unreachable_members(quorum, self.name)
            if unreachable:
                log.warning("node %s: the data plane of %s (quorum %d) is unreachable from "
                            "here: told the lighthouse", self.name, ", ".join(unreachable),
                            quorum.id)
            self._lighthouse.report_unreachable(unreachable)
            return None
        self._lighthouse.report_unreachable([])
        self._lighthouse.report_gone([], 0)
        log.info("node %s: rank %d of quorum %d (%s)", self.name, group.rank, quorum.id,
                 ", ".join(quorum.members))
        return group

    def _forming(self, quorum: Quorum) -> Callable[[], Optional[str]]:
        """What a group of `quorum` forming asks while it waits for its members: a reason to
        give it up once a newer quorum is heard of (the lighthouse dropped a member that
        never came), or None to wait on. After GONE_PROBE_AFTER_S of waiting it tries the
        members' data planes once and reports those that no longer answer as gone, as a
        broken round does: a member that died after the quorum was issued is then out within
        seconds, not after the heartbeat timeout (the group's, `timeout_s`, before)."""
        probe_at = time.monotonic() + GONE_PROBE_AFTER_S

        def abandon() -> Optional[str]:
            nonlocal probe_at
            newest = self._lighthouse.current_quorum()
            if newest is not None and newest.id > quorum.id:
                return "quorum %d came" % newest.id
            if time.monotonic() >= probe_at:
                probe_at = float("inf")
                self._report_gone(quorum)
            return None
        return abandon

    def _report_gone(self, quorum: Quorum) -> None:
        """Tell the lighthouse which members of `quorum` no longer answer on their data plane
        (perhaps dead: out once silent too, not after the heartbeat timeout)."""
        from .dataplane import unreachable_members
        gone = unreachable_members(quorum, self.name)
        if gone:
            log.warning("node %s: the data plane of %s (quorum %d) no longer answers: told the "
                        "lighthouse", self.name, ", ".join(gone), quorum.id)
        self._lighthouse.report_gone(gone, quorum.id)

    def newest_quorum(self) -> int:
        newest = self._lighthouse.current_quorum()
        return 0 if newest is None else newest.id

    def sign(self, group: Group, header: bytes) -> bytes:
        return self._lighthouse.sign_header(_quorum_of(group), group.rank, header)

    def signed(self, group: Group, rank: int, header: bytes, mac: bytes) -> bool:
        return self._lighthouse.header_signed(_quorum_of(group), rank, header, mac)

    def broken(self, group: Optional[Group], exc: QuorumBroken) -> None:
        """A round broke: tell the lighthouse which members' data plane no longer answers
        (perhaps dead: out once silent too, not after the heartbeat timeout), then wait for a
        newer quorum (its id asked for after `timeout_s`)."""
        if group is not None:
            self._report_gone(_quorum_of(group))
        self._waiting_since = time.monotonic()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class ElasticTie(NodeTie):
    """The node layer's tie for node `name` in the quorums of the LighthouseClient `connect()`
    makes (`ElasticMembership`): it is made once the centre exists (its layout known), so a node
    enters a quorum only when it can be healed; it leaves when the tie ends. `timeout_s` bounds
    each collective; `final_timeout_s`, the wait of a done node for a round."""

    def __init__(self, tie: CentreTie, connect: Callable[[], LighthouseClient], name: str,
                 controller: "ControllerServices", timeout_s: float,
                 on_failure: Callable[[str], None], started_at: Optional[float] = None,
                 final_timeout_s: float = FINAL_TIMEOUT_S,
                 outer: Optional[OuterRule] = None) -> None:
        self.check(tie)
        self.elastic_membership = ElasticMembership(connect, name, timeout_s, final_timeout_s)
        super().__init__(tie, self.elastic_membership, name, controller, on_failure, started_at,
                         outer)

    @staticmethod
    def check(tie: CentreTie) -> None:
        """Raise PlatoonError for a tie an elastic job cannot run."""
        if tie.every_s is None:
            raise PlatoonError("an elastic job's rounds come every so many seconds: give "
                               "--tie-every-s")

    @property
    def client(self) -> Optional[LighthouseClient]:
        """The LighthouseClient, once the centre exists."""
        return self.elastic_membership.client

    @client.setter
    def client(self, client: Optional[LighthouseClient]) -> None:
        self.elastic_membership.client = client
