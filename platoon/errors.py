"""The exceptions platoon raises: one root, each subclass also a fitting builtin."""

from typing import Sequence


class PlatoonError(Exception):
    """Root of every error raised by platoon."""


class ControllerTimeout(PlatoonError, TimeoutError):
    """The controller did not answer in time (it may be down, busy or at another address)."""


class LockTimeout(PlatoonError, TimeoutError):
    """The lock on the central parameters could not be taken in time."""


class SyncTimeout(PlatoonError, TimeoutError):
    """`SyncHandle.wait(timeout)` ran out of time; the sync is still in flight."""


class ServeTimeout(PlatoonError, TimeoutError):
    """`Controller.serve(timeout)` ran out of time before every worker was done."""


class MinibatchTimeout(PlatoonError, TimeoutError):
    """No minibatch arrived on the data channel in time."""


class UsedAfterFork(PlatoonError, RuntimeError):
    """A controller's minibatch channel was used in a process forked from the one that made
    it: ZeroMQ sockets do not work after fork(). Feed minibatches from a thread instead."""


class ProtocolError(PlatoonError, ValueError):
    """A message on the control or data channel is malformed."""


class NotRegistered(ProtocolError):
    """A request came on a connection the controller does not know (never registered, or
    reset since); a Worker registers again with its token and retries."""


class RemoteError(PlatoonError, RuntimeError):
    """The controller answered a request with an error.

    `remote_type` is the name of the controller-side exception and
    `remote_traceback` its formatted traceback (empty for protocol errors).
    """

    def __init__(self, message: str, remote_type: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __str__(self):
        text = super().__str__()
        if self.remote_traceback:
            text += "\n\nController-side traceback:\n" + self.remote_traceback.rstrip()
        return text


class LayoutMismatch(PlatoonError, ValueError):
    """A worker's parameters differ in count, dtype or shape from the job's centre (at
    `init_shared_params`, or at a later sync when a tensor was converted, e.g. model.double())."""


class CheckpointError(PlatoonError, ValueError):
    """A checkpoint cannot be read (missing, truncated, corrupt) or holds values that are
    refused (NaN or Inf)."""


class PortInUse(PlatoonError, OSError):
    """The controller could not bind its socket because the address is taken."""


class SegmentExists(PlatoonError, FileExistsError):
    """A shared-memory segment could not be created: its name exists already."""


class WorkerDied(PlatoonError, RuntimeError):
    """A worker process exited without saying it was done (raised by the default
    `Controller.handle_worker_death`)."""


class WorkerClosed(PlatoonError, ValueError):
    """A Worker was used after `close()` (or after its ``with`` block ended)."""


class ControllerGone(PlatoonError, ConnectionError):
    """The controller process has exited; the worker cannot go on."""


class StopRequested(PlatoonError):
    """A stop of the job was requested (`Worker.request_stop`, `Controller.request_stop`);
    raised by `Worker.recv_mb` instead of waiting for minibatches that will not come.
    A ``with Worker()`` block left through it closes the worker as done, not failed."""


class NonFiniteValues(PlatoonError, ValueError):
    """An array to be averaged between nodes holds NaN or Inf (training diverged): refused
    whatever the codec, or it would reach every node (`platoon.mpi.compress`). `ranks`: the
    ranks (nodes) that hold it, where known."""

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = list(ranks)


class ElasticAuthError(PlatoonError, PermissionError):
    """The lighthouse refused a node's messages (or a reply failed its check): the two do not
    hold the same job secret (`platoon.elastic`)."""


class QuorumTimeout(PlatoonError, TimeoutError):
    """No quorum holding this node came within the time given (`platoon.elastic`)."""


class NodeRefused(PlatoonError, ValueError):
    """The other members of an elastic quorum refused this node at the door of a round: a tie
    setting or its model's layout differs from the job's (`platoon.elastic`). Nothing was
    applied; the node ends, the others go on without it."""


class QuorumBroken(PlatoonError, ConnectionError):
    """An outer round over a quorum's data plane failed (a member died, stopped answering, or
    the quorum changed under it): nothing was averaged; wait for the next quorum and rebuild
    (`platoon.elastic`)."""
