"""What the controller offers the parts that serve requests beside it.

`NodeCollectives`, the `Rendezvous`, the `Checkpointer` and the node link (MPI)
hold a `Controller` but use only this interface, so they do not depend on how
it keeps its state. Replies go out on the control socket, from the serve thread.
"""

from typing import Any, List, Optional, Protocol


class ControllerServices(Protocol):
    """The controller as its parts see it."""

    job_id: str  # names the job's shared memory
    num_workers: Optional[int]  # workers on this node, if the controller knows
    node_link: Any  # the platoon.mpi.NodeLink when the job spans nodes, else None
    resume_from: Optional[str]  # the checkpoint the job resumes from, if any

    def reply(self, envelope: list, seq: Optional[int], result: Any) -> None:
        """Send `result` (JSON) as the reply to request `seq` from `envelope`."""

    def fail(self, envelope: list, seq: Optional[int], exc: BaseException) -> None:
        """Reply to request `seq` from `envelope` with error `exc` (the worker raises it)."""

    def departed_workers(self) -> List[int]:
        """Ids of the workers that have left the job (done or failed)."""

    def reserve_shared(self, nbytes: int, what: str) -> None:
        """Raise PlatoonError, naming `what`, if `nbytes` more shared memory would exceed
        the job's limit."""

    # The node link's centre tie also reads these:
    centre_ready: bool  # the centre holds its first values
    shared_centre: Any  # the centre's SharedCentre, None until registered
    param_names: Optional[List[str]]  # the centre's parameters' names, if given
    progress: dict  # {"minibatches", "syncs", "metrics"}

    def snapshot_centre(self, timeout_s: Optional[float] = 10.0) -> list:
        """Copies of the centre's arrays, taken under its lock."""
