"""What the controller offers the parts that serve requests beside it.

The `RequestDispatcher`, `NodeCollectives`, the `Rendezvous`, the `Checkpointer`
and the node link (MPI) hold a `Controller` but use only this interface, so they
do not depend on how it keeps its state (mypy checks that they use nothing else,
and that `Controller` provides all of it). Replies go out on the control socket,
from the serve thread.
"""

from typing import Any, List, Optional, Protocol

import numpy as np


class ControllerServices(Protocol):
    """The controller as its parts see it."""

    job_id: str  # names the job's shared memory
    num_workers: Optional[int]  # workers on this node, if the controller knows
    node_link: Any  # the platoon.mpi.NodeLink when the job spans nodes, else None
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
