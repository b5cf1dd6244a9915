"""The controller and its parts as they see each other: what the controller offers the parts
that serve requests beside it (`ControllerServices`), and what it asks of its link to the other
nodes of a multi-node job (`NodeLinkProtocol`).

The `RequestDispatcher`, `NodeCollectives`, the `Rendezvous`, the `Checkpointer`
and the node link's centre tie hold a `Controller` but use only this interface, so they
do not depend on how it keeps its state (mypy checks that they use nothing else,
and that `Controller` provides all of it). Replies go out on the control socket,
from the serve thread. Two links satisfy `NodeLinkProtocol`: `platoon.mpi.NodeLink` (a fixed
world over MPI) and `platoon.elastic.link.ElasticLink` (nodes that come and go); mypy holds
them to it where their runners pass them. On one node the controller has none (None).
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .._centre.shmem import SharedCentre
    from .._centre.stopsignal import JobStop


class ControllerServices(Protocol):
    """The controller as its parts see it."""

    job_id: str  # names the job's shared memory
    num_workers: Optional[int]  # workers on this node, if the controller knows
    node_link: Optional["NodeLinkProtocol"]  # when the job spans nodes, else None
    resume_from: Optional[str]  # the checkpoint the job resumes from, if any
    allow_nonfinite: bool  # resume from a checkpoint holding NaN or Inf
    transport: str  # "tcp" or "ipc": how workers reach the control socket
    control_port: Optional[int]  # the control socket's port (tcp)
    max_request_bytes: int  # the largest request a worker may send

    def handle_control(self, req: str, worker_id: int, req_info: Any) -> Any:
        """The user's answer to a request that is not platoon's own."""

    def reply(self, envelope: list, seq: Optional[int], result: Any) -> None:
        """Send `result` (JSON) as the reply to request `seq` from `envelope`."""

    def fail(self, envelope: list, seq: Optional[int], exc: BaseException) -> None:
        """Reply to request `seq` from `envelope` with error `exc` (the worker raises it)."""

    def departed_workers(self) -> List[int]:
        """Ids of the workers that have left the job (done or failed)."""

    def reserve_shared(self, nbytes: int, what: str) -> None:
        """Raise PlatoonError, naming `what`, if `nbytes` more shared memory would exceed
        the job's limit."""

    # The checkpointer and the node link's centre tie also read these:
    @property
    def centre_ready(self) -> bool:
        """The centre holds its first values."""

    @property
    def shared_centre(self) -> Any:
        """The centre's SharedCentre, None until a worker registers parameters."""

    @property
    def param_names(self) -> Optional[List[str]]:
        """The parameters' names, if the workers gave any."""

    @property
    def progress(self) -> dict:
        """{"minibatches", "syncs", "metrics"} so far."""

    def snapshot_centre(self, timeout_s: Optional[float] = 10.0) -> List[np.ndarray]:
        """Copies of the centre's arrays, taken under its lock."""


@runtime_checkable
class NodeLinkProtocol(Protocol):
    """What a controller asks of its link to the other nodes' controllers, in the order of a
    job: `start` when serve() begins, `topology` at each registration, `initial_centre` as
    the centre is made, `barrier`, `all_reduce` and `fail_round` for the collectives,
    `share_stop` every tick, `trained` and `final_centre` for the final evaluation, `totals`
    for the status file, `finish` when serve() ends (or `end_tie` when the controller closes
    before). Collective methods are called from the serve thread."""

    num_workers: int  # workers on this node (the controller's must match)
    final_result: Optional[Dict[str, Any]]  # the final evaluation, stored by the controller

    def start(self, controller: "ControllerServices") -> None:
        """serve() begins: start the centre tie, if any, for `controller`'s centre."""

    def topology(self, worker_id: int) -> Dict[str, Any]:
        """What worker `worker_id` learns at registration beyond its local id (global rank
        and size, node rank, an elastic node's name)."""

    def initial_centre(self, centre: "SharedCentre") -> Optional[bool]:
        """Where the new `centre`'s first values come from: None while undecided (asked
        again; never blocks), True once the link wrote them (the workers copy them), False
        when a worker writes them."""

    def barrier(self) -> None:
        """Wait for every node's controller (each calls it when its workers are all in);
        PlatoonError where the job has no such step."""

    def all_reduce(self, array: np.ndarray, op: str) -> int:
        """Combine this node's reduced `array` with the other nodes' in place; return the
        number of workers it now covers (the divisor of a mean)."""

    def fail_round(self, reason: str) -> None:
        """This node's collective failed before its data was ready (the others must fail
        the same round)."""

    def share_stop(self, job_stop: "JobStop") -> None:
        """Pass this node's stop to the other nodes, and take theirs."""

    def trained(self) -> bool:
        """This node's workers are past their last sync; whether an agreed centre will come
        (then `final_centre` says when, and whether this node evaluates it)."""

    def final_centre(self) -> Optional[bool]:
        """None until the agreed centre is there; then whether this node evaluates it."""

    def totals(self) -> Dict[str, int]:
        """What the link adds to the controller's progress totals (the status file)."""

    def end_tie(self) -> None:
        """The controller closes before `finish`: end the centre tie now, without its final
        round (the centre is about to go). Not collective; idempotent."""

    def finish(self) -> None:
        """serve() ends: wait for the other nodes as the job requires, and end the tie.
        Idempotent."""
