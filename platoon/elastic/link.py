"""An elastic node controller's link to the other nodes: its centre tie (`ElasticTie`) and the
refusals of what cannot hold when nodes come and go (the controller's NodeLink interface)."""

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, NoReturn, Optional, Tuple

import numpy as np

from ..errors import PlatoonError
from ..node.tie import CentreTie
from .client import LighthouseClient
from .tie import FINAL_TIMEOUT_S, ElasticTie

if TYPE_CHECKING:
    from .._centre.shmem import SharedCentre
    from .._centre.stopsignal import JobStop
    from .._controller.services import ControllerServices

log = logging.getLogger(__name__)

_NOT_ELASTIC = ("%s across nodes does not exist in an elastic job: its nodes come and go, so "
                "no step holds every node's workers. Use it on one node (python -m platoon or "
                "the launcher) or in a fixed world (python -m platoon.mpi)")


class ElasticLink:
    """What an elastic node's controller sees of the other nodes (as ``node_link``).

    `slot` (I, N): the node's place among the job's N node slots (``--slot``, which
    platoon-launcher gives each host): a worker's `global_rank`/`global_size` are then
    ``I * workers + local rank`` of ``N * workers``, which `platoon.shard` splits the data by,
    each slot its own part, whoever holds it now. Without a slot they are its node's own (its
    local rank and the node's worker count) and `Worker.placed_in_job` is False. Its node's name
    is PLATOON_ELASTIC_NODE (`Worker.elastic_node`); its final evaluation waits for the final
    round without a deadline of its own (the node bounds it). The cross-node `all_reduce` and
    `barrier` refuse with PlatoonError."""

    def __init__(self, num_workers: int, connect: Callable[[], LighthouseClient], name: str,
                 tie: CentreTie, timeout_s: float,
                 on_failure: Callable[[str], None], started_at: Optional[float] = None,
                 final_timeout_s: float = FINAL_TIMEOUT_S,
                 slot: Optional[Tuple[int, int]] = None) -> None:
        if slot is not None and not (isinstance(slot[0], int) and isinstance(slot[1], int)
                                     and 0 <= slot[0] < slot[1]):
            raise ValueError("an elastic node's slot is I of N, 0 <= I < N, got %r" % (slot,))
        self.slot = slot
        self.num_workers = int(num_workers)
        self.connect, self.name, self.tie, self.timeout_s = connect, name, tie, timeout_s
        self.on_failure, self.started_at = on_failure, started_at
        self.final_timeout_s = final_timeout_s
        self.final_result: Optional[Dict[str, Any]] = None  # the agreed centre's evaluation
        self._tie_thread: Optional[ElasticTie] = None
        self._finished = False
        ElasticTie.check(tie)

    @property
    def tie_thread(self) -> Optional[ElasticTie]:
        return self._tie_thread

    def totals(self) -> Dict[str, int]:
        thread = self._tie_thread
        return {} if thread is None else {"tie_rounds": thread.rounds,
                                          "tie_bytes_sent": thread.bytes_sent,
                                          "tie_broken_rounds": thread.broken_rounds}

    def topology(self, worker_id: int) -> Dict[str, Any]:
        if self.slot is None:
            return {"global_rank": worker_id, "global_size": self.num_workers,
                    "elastic_node": self.name, "placed_in_job": False}
        index, slots = self.slot
        return {"global_rank": index * self.num_workers + worker_id,
                "global_size": slots * self.num_workers, "node_rank": index,
                "num_nodes": slots, "elastic_node": self.name}

    def all_reduce(self, array: np.ndarray, op: str) -> NoReturn:
        raise PlatoonError(_NOT_ELASTIC % "all_reduce")

    def barrier(self) -> NoReturn:
        raise PlatoonError(_NOT_ELASTIC % "a barrier")

    def fail_round(self, reason: str) -> None:
        """Nothing to tell the other nodes: a node's all_reduce never leaves it."""

    def share_stop(self, job_stop: "JobStop") -> None:
        """A stop ends this node only (the others go on, as when it dies)."""

    def start(self, controller: "ControllerServices") -> None:
        if self._tie_thread is None:
            self._tie_thread = ElasticTie(self.tie, self.connect, self.name, controller,
                                          self.timeout_s, self.on_failure, self.started_at,
                                          self.final_timeout_s)

    def initial_centre(self, centre: "SharedCentre") -> Optional[bool]:
        """Asked as the centre is created, then again until decided: None while undecided
        (at most twice the tie's timeout), True once the centre holds a live member's anchor
        (the workers copy it), False when they write the first values (see `ElasticTie`).
        Never blocks: the controller serves on meanwhile."""
        thread = self._tie_thread
        return False if thread is None else thread.initial_centre(2 * self.timeout_s)

    def trained(self) -> bool:
        thread = self._tie_thread
        if thread is None:
            return False
        thread.node_done()
        return True

    def final_centre(self) -> Optional[bool]:
        """None until the final round; then whether this node evaluates the agreed centre
        (the lowest-ranked member of the final quorum does)."""
        thread = self._tie_thread
        if thread is None or not thread.final.is_set():
            return None
        return thread.final_error is None and thread.final_rank == 0

    def end_tie(self) -> None:
        thread = self._tie_thread
        if thread is None or self._finished or thread.halted:
            return
        if not thread.halt():
            log.warning("node %s: the elastic tie thread did not end in time", self.name)

    def finish(self) -> None:
        """This node's workers are done: wait for the final round among the nodes alive (or
        `final_timeout_s` without any round: then this node keeps its own centre)."""
        if self._finished:
            return
        self._finished = True
        if self._tie_thread is not None:
            self._tie_thread.stop()

    def close(self) -> None:
        self.finish()

    def tie_summary(self) -> Optional[str]:
        return None if self._tie_thread is None else self._tie_thread.summary()
