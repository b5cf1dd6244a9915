"""The node centres of a fixed world, tied over MPI: the node layer's tie
(`platoon.node.tie.NodeTie`, whose doc says what a round does: hierarchical EASGD or DiLoCo's
outer step, the signed header's door, the anchor's digest and healing, the final agreement)
over one group for the whole job (`MpiGroup`, a communicator of its own, one rank per node),
as `FixedWorld` says: the members never change, so a round that breaks, or a node refused at
the door, aborts the job (`on_failure`), as a node's death does.

The tie reads its controller only through `Controller.centre_ready`,
`Controller.shared_centre` (arrays and lock) and, for `every_syncs`, the sync count in
`Controller.progress`. Its messages go through `compress.compressed_mean`.
"""

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from ..errors import PlatoonError, QuorumBroken
from ..node.compress import Codec, ErrorFeedback
from ..node.group import Group
from ..node.tie import (  # noqa: F401 (CentreTie, OUTER_RULES: names of this module too)
    LOCK_TIMEOUT_S,
    OUTER_RULES,
    CentreTie,
    NodeTie,
    OuterRule,
)
from ._comm import Cancelled, import_mpi, wait
from .compress import compressed_mean

FIXED_QUORUM_ID = 1  # a fixed world's only group
# mpi4py's communicators and requests are typed Any: mpi4py is imported lazily (`import_mpi`)


@dataclass(frozen=True)
class FixedQuorum:
    """A fixed world's membership as a tie reads a quorum: one id, the nodes named by rank."""

    members: Tuple[str, ...]
    id: int = FIXED_QUORUM_ID


class MpiGroup:
    """A fixed world's group for the tie: `comm` (one rank per node; the tie's own), its
    collectives non-blocking and completed without spinning a core (`_comm.wait`), left
    unfinished with Cancelled once `cancel` is set (the job is going down)."""

    def __init__(self, comm: Any, cancel: threading.Event) -> None:
        self.comm, self._cancel = comm, cancel
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.quorum = FixedQuorum(tuple(str(r) for r in range(self.size)))

    def _wait(self, request: Any, doing: str) -> None:
        if not wait(request, cancel=self._cancel):
            raise Cancelled("%s: cancelled (the centre tie was halted)" % doing)

    def all_gather_bytes(self, message: np.ndarray) -> np.ndarray:
        """Every rank's uint8 `message` (all of one size), one row per rank in rank order."""
        MPI = import_mpi()
        mine = np.ascontiguousarray(message, np.uint8).reshape(-1)
        rows = np.empty((self.size, mine.size), np.uint8)
        self._wait(self.comm.Iallgather([mine, MPI.BYTE], [rows, MPI.BYTE]), "the all-gather")
        return rows

    def broadcast_bytes(self, message: np.ndarray, root: int) -> np.ndarray:
        """`root`'s uint8 `message` on every rank (each passes a buffer of its size)."""
        MPI = import_mpi()
        buf = np.array(message, np.uint8).reshape(-1)
        self._wait(self.comm.Ibcast([buf, MPI.BYTE], root=root),
                   "the broadcast from rank %d" % root)
        return buf

    def compressed_mean(self, array: np.ndarray, codec: Codec,
                        feedback: Optional[ErrorFeedback] = None,
                        out: Optional[np.ndarray] = None,
                        among: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, int]:
        """`compress.compressed_mean` over this group."""
        return compressed_mean(self.comm, array, codec, feedback, among=among, out=out,
                               cancel=self._cancel)

    def close(self) -> None:
        """Nothing: the communicator is the node link's."""


class FixedWorld:
    """The membership of a fixed world: every node in one group (`MpiGroup` over `comm`) for
    the whole job. MPI's launcher started every rank, so headers are not signed; a round that
    breaks (a node refused at the door, or whose centre holds NaN or Inf) cannot be dropped,
    since no member can leave: the tie fails, and the job is aborted."""

    changes = False
    timeout_s = None  # MPI's collectives: unbounded, cancelled when the tie halts
    final_timeout_s = None

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def connect(self) -> None:
        """Nothing to connect: the communicator is there."""

    def next_group(self, cancel: threading.Event) -> MpiGroup:
        return MpiGroup(self.comm, cancel)

    def newest_quorum(self) -> int:
        return FIXED_QUORUM_ID

    def sign(self, group: Group, header: bytes) -> bytes:
        return b""

    def signed(self, group: Group, rank: int, header: bytes, mac: bytes) -> bool:
        return mac == b""

    def broken(self, group: Optional[Group], exc: QuorumBroken) -> None:
        raise PlatoonError("%s; a fixed world (platoon.mpi) cannot go on without a member: the "
                           "job is aborted" % exc) from exc

    def close(self) -> None:
        """Nothing: the communicator is the node link's."""


def fixed_world_tie(tie: CentreTie, comm: Any, controller: Any,
                    on_failure: Callable[[int], None],
                    outer: Optional[OuterRule] = None) -> NodeTie:
    """The tie thread of this rank's node over `comm` (its own communicator, one rank per
    node); `on_failure(code)` aborts the job if the tie fails."""
    rank = comm.Get_rank()
    return NodeTie(tie, FixedWorld(comm), str(rank), controller,
                   lambda message: on_failure(1), outer=outer)
