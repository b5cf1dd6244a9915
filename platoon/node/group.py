"""What a centre tie's rounds run over (`Group`: rank, size, its quorum, bounded collectives
over bytes) and who is in them (`Membership`: a fixed world's one group, or an elastic job's
quorums), as protocols: `platoon.mpi.tie` and `platoon.elastic.tie` stand behind them."""

import threading
from typing import Optional, Protocol, Sequence, Tuple

import numpy as np

from ..errors import QuorumBroken
from .compress import Codec, ErrorFeedback


class Quorumlike(Protocol):
    """What a tie reads of a group's membership: its id and its members' names, in rank order."""

    @property
    def id(self) -> int: ...

    @property
    def members(self) -> Sequence[str]: ...


class Group(Protocol):
    """The group a tie round runs over: this node's rank in it, its size, its quorum, and
    collectives over bytes that each member enters alike. Each is bounded (its group's timeout,
    or cancelled once the tie halts) and raises QuorumBroken (or the group's Cancelled) rather
    than hang."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def quorum(self) -> Quorumlike: ...

    def all_gather_bytes(self, message: np.ndarray) -> np.ndarray: ...

    def broadcast_bytes(self, message: np.ndarray, root: int) -> np.ndarray: ...

    def compressed_mean(self, array: np.ndarray, codec: Codec,
                        feedback: Optional[ErrorFeedback] = None,
                        out: Optional[np.ndarray] = None,
                        among: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, int]: ...

    def close(self) -> None: ...


class Membership(Protocol):
    """Who a tie's rounds are among, as a policy: a fixed world (one group for the whole job;
    a loss aborts it) or an elastic job's quorums (a group per quorum; a broken round is
    dropped and the next quorum's group built).

    `changes`: whether members come and go (then a node enters a group only once its centre
    exists, so that it can be healed, and its summary names the quorums). `timeout_s`: the
    bound on each of its groups' collectives (None: none; halting cancels them).
    `final_timeout_s`: how long a done node waits for a round before it gives the final one up
    (None: forever)."""

    @property
    def changes(self) -> bool: ...

    @property
    def timeout_s(self) -> Optional[float]: ...

    @property
    def final_timeout_s(self) -> Optional[float]: ...

    def connect(self) -> None: ...

    def next_group(self, cancel: threading.Event) -> Optional[Group]: ...

    def newest_quorum(self) -> int: ...

    def sign(self, group: Group, header: bytes) -> bytes: ...

    def signed(self, group: Group, rank: int, header: bytes, mac: bytes) -> bool: ...

    def broken(self, group: Optional[Group], exc: QuorumBroken) -> None: ...

    def close(self) -> None: ...
