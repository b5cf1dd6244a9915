"""A compressed mean across MPI ranks (`compressed_mean`): every rank all-gathers the others'
messages and decodes and adds them up alike, so the mean is the same bits on every rank.

The codecs and error feedback it sends with are the node layer's (`platoon.node.compress`,
numpy only), re-exported here under their former path. mpi4py is imported by
`compressed_mean` alone.
"""

from typing import Optional, Sequence, Tuple

import numpy as np

from ..node.compress import (  # the codecs, under their former path too
    BLOCK,
    CODECS,
    Codec,
    ErrorFeedback,
    RawCodec,
    make_codec,
    mean_of_messages,
    own_message,
)

__all__ = ["make_codec", "CODECS", "Codec", "ErrorFeedback", "compressed_mean", "own_message",
           "mean_of_messages", "BLOCK", "RawCodec"]


def compressed_mean(comm, array: np.ndarray, codec: Codec,
                    feedback: Optional[ErrorFeedback] = None, *,
                    among: Optional[Sequence[int]] = None,
                    out: Optional[np.ndarray] = None,
                    cancel=None) -> Tuple[np.ndarray, int]:
    """The mean over the ranks of `comm` of their `array`s, each sent compressed by `codec`;
    returns (mean, bytes_sent).

    Collective: every rank of `comm` calls it with an array of the same size and dtype and the
    same codec and `among` (not checked here: agree them once beforehand). Each rank in
    `among` (default: every rank) encodes ``array + feedback.residual`` (feedback None: just
    `array`) into `codec.encoded_size(array.size)` bytes: the size depends on the codec and
    the length alone (no header, one scale per block however small the values), so the
    messages all have one size and one Allgatherv collects them; a rank outside `among`
    sends nothing and only receives. Every rank then decodes the messages of `among` in rank
    order and adds them up in float32 (float64 for a float64 array), starting from the first
    message, and divides by their count: the same operations on the same bytes, hence the
    same bits on every rank. The rank's residual becomes what its own message lost.

    mean: an array of `array`'s shape and dtype (written into `out` if given). bytes_sent:
    the payload this rank puts on the network for it, its message once for each other rank
    (``encoded_size * (size - 1)``; 0 outside `among`); over all ranks this is what any
    all-gather algorithm must carry, without MPI's own headers.
    `cancel` (a threading.Event): once set, the all-gather is left unfinished and
    `_comm.Cancelled` is raised (the job is going down).
    Raises NonFiniteValues when any rank's input holds NaN or Inf, whatever the codec
    (averaged, it would reach every rank): that rank sends a refusal in place of its message,
    so every rank raises the same error (none is left waiting), with `ranks` the ranks that
    refused; nothing is averaged. Raises ValueError for bad arguments.
    """
    from ._comm import Cancelled, import_mpi, wait
    MPI = import_mpi()
    array = np.asarray(array)
    if array.dtype.kind != "f":
        raise ValueError("compressed_mean averages floating-point arrays, not %s" % array.dtype)
    rank, size = comm.Get_rank(), comm.Get_size()
    members = list(range(size)) if among is None else sorted(set(int(r) for r in among))
    if not members or members[0] < 0 or members[-1] >= size:
        raise ValueError("compressed_mean among=%r: give ranks of the communicator (0..%d)"
                         % (among, size - 1))
    if feedback is not None and feedback.residual.size != array.size:
        raise ValueError("ErrorFeedback of %d elements for an array of %d"
                         % (feedback.residual.size, array.size))
    n = array.size
    message_size = codec.encoded_size(n)
    flat = array.reshape(-1)
    sending = rank in members
    data, mine, refused_here = flat, np.empty(0, np.uint8), None
    if sending:
        data, mine, refused_here = own_message(flat, codec, feedback)
    counts = [message_size if r in members else 0 for r in range(size)]
    displacements = [0] * size
    for r in range(1, size):
        displacements[r] = displacements[r - 1] + counts[r - 1]
    gathered = np.empty(message_size * len(members), np.uint8).reshape(len(members), message_size)
    # Non-blocking, completed by polling with sleeps (`_comm.wait`): MPI's blocking call
    # busy-polls for the whole transfer, a core taken from the node's workers for as long as a
    # slow link needs (at 10 Mbit/s, a float32 message of 1.5 MB: 1.2 s a round).
    if not wait(comm.Iallgatherv([mine, len(mine), MPI.BYTE],
                                 [gathered, (counts, displacements), MPI.BYTE]), cancel=cancel):
        raise Cancelled("compressed_mean: cancelled before the other ranks' messages came")
    mean = mean_of_messages(gathered, members, rank, size, codec, array, data, feedback,
                            refused_here, out)
    return mean, (message_size * (size - 1) if sending else 0)
