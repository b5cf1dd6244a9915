"""The outer round's data plane: a torch.distributed gloo group made afresh for each quorum.

Each node hosts a TCPStore server from its start (`StoreServer`) and gives its address to the
lighthouse; a quorum's group meets at its rank 0's store, under the prefix of the quorum's id
and nonce (`store_prefix`; torchft prefixes by id), so groups of old quorums never mix with
the new one's. Every wait is
finite: a member that dies or stops answering makes the round raise QuorumBroken within
`timeout_s`, and the caller waits for the next quorum (`LighthouseClient.wait_for_quorum`)
and builds a new group. Needs torch (``pip install platoon-dp[elastic]``); the messages are
those of `platoon.mpi.compress` (float32, int8, int4, error feedback), averaged in rank order
so that every member gets the same bits.
"""

import datetime
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import PlatoonError, QuorumBroken
from ..node.compress import Codec, ErrorFeedback, mean_of_messages, own_message
from .quorum import Quorum


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise PlatoonError("the elastic data plane needs torch (gloo): pip install "
                           "'platoon-dp[elastic]'") from None
    return torch, dist


def _split(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class StoreServer:
    """This node's TCPStore server (`port` 0: a free one); `address` ("HOST:PORT", at `host`)
    is what the node gives the lighthouse. Closed with the node (a context manager).

    torch's TCPStore listens on every interface, whatever `host` is, and neither it nor gloo
    authenticates anyone (the tie signs its round headers): the data plane must run on a
    trusted network (docs/multi-node.md, "What the secret protects")."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        _, dist = _torch()
        try:
            self._store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
        except (RuntimeError, OSError) as exc:
            raise PlatoonError("cannot host the data plane's store on %s:%d (%s): choose "
                               "another port" % (host, port, exc)) from None
        self.address = "%s:%d" % (host, self._store.port)

    def close(self) -> None:
        self._store = None  # the server stops with its last reference

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def store_prefix(quorum: Quorum) -> str:
    """Where `quorum`'s group meets in its rank 0's store: under its id and its random nonce
    (from the lighthouse, signed): unguessable by a process without the job's secret, and
    distinct for two quorums of one id."""
    return "platoon/quorum/%d/%s/" % (quorum.id, quorum.nonce)


class QuorumGroup:
    """This node's gloo group for `quorum` (it must hold `name`), reached through the store
    at the quorum's rank 0; every collective waits at most `timeout_s`. Raises QuorumBroken
    when the group cannot be formed in time."""

    def __init__(self, quorum: Quorum, name: str, timeout_s: float = 30.0):
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0 seconds, got %r" % (timeout_s,))
        self.quorum, self.name, self.timeout_s = quorum, name, timeout_s
        self.rank, self.size = quorum.rank_of(name), quorum.size
        _, dist = _torch()
        timeout = datetime.timedelta(seconds=timeout_s)
        store_host, store_port = _split(quorum.store_address)
        own_host, _ = _split(quorum.addresses[self.rank])
        try:
            store = dist.TCPStore(store_host, store_port, is_master=False, timeout=timeout)
            prefixed = dist.PrefixStore(store_prefix(quorum), store)
            # gloo's options are private in torch's Python API (torchft sets them alike): the
            # device binds the interface this node gave the lighthouse, not the hostname's
            options = dist.ProcessGroupGloo._Options()  # noqa: SLF001
            options._timeout = timeout  # noqa: SLF001
            options._devices = [  # noqa: SLF001
                dist.ProcessGroupGloo.create_device(hostname=own_host)]
            self._group = dist.ProcessGroupGloo(prefixed, self.rank, self.size, options)
        except (RuntimeError, OSError, ValueError) as exc:
            raise self._broken("forming the group", exc) from exc
        self._store = store

    def _broken(self, doing: str, exc: BaseException) -> QuorumBroken:
        return QuorumBroken(
            "node %s (rank %d of quorum %d: %s): %s failed within %.3g s (%s: %s); nothing "
            "was averaged: wait for the next quorum and build its group"
            % (self.name, self.rank, self.quorum.id, ", ".join(self.quorum.members), doing,
               self.timeout_s, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))

    def all_gather_bytes(self, message: np.ndarray) -> np.ndarray:
        """Every member's uint8 `message` (all of one size), one row per rank in rank order."""
        torch, _ = _torch()
        mine = torch.from_numpy(np.array(message, np.uint8).reshape(-1))  # writable, its own
        rows = torch.empty((self.size, mine.numel()), dtype=torch.uint8)
        try:
            work = self._group.allgather([list(rows.unbind(0))], [mine])
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, OSError) as exc:
            raise self._broken("the all-gather", exc) from exc
        return rows.numpy()

    def broadcast_bytes(self, message: np.ndarray, root: int) -> np.ndarray:
        """`root`'s uint8 `message` on every member (each passes a buffer of its size)."""
        torch, _ = _torch()
        buf = torch.from_numpy(np.array(message, np.uint8).reshape(-1))
        try:
            work = self._group.broadcast(buf, root)
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, OSError) as exc:
            raise self._broken("the broadcast from rank %d" % root, exc) from exc
        return buf.numpy()

    def compressed_mean(self, array: np.ndarray, codec: Codec,
                        feedback: Optional[ErrorFeedback] = None,
                        out: Optional[np.ndarray] = None,
                        among: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, int]:
        """The mean over the quorum of the members' `array`s, each sent as `codec`'s message
        of ``array + feedback.residual`` (as `platoon.mpi.compress.compressed_mean`, whose
        arithmetic it shares: the same bits on every member); returns (mean, bytes this node
        sent, its message once for each other member). Raises QuorumBroken when a member
        fails the round, NonFiniteValues when any member's array holds NaN or Inf.
        `among`: the ranks whose arrays make the mean (default all); the others' messages
        are not read (their array: any of the right size) and they count no bytes sent."""
        array = np.asarray(array)
        if array.dtype.kind != "f":
            raise ValueError("compressed_mean averages floating-point arrays, not %s"
                             % array.dtype)
        if feedback is not None and feedback.residual.size != array.size:
            raise ValueError("ErrorFeedback of %d elements for an array of %d"
                             % (feedback.residual.size, array.size))
        # The residual changes only once every message is in: a broken round drops nothing.
        members = list(range(self.size)) if among is None else sorted(set(among))
        sending = self.rank in members
        data, message, refused_here = own_message(array.reshape(-1), codec,
                                                  feedback if sending else None)
        gathered = self.all_gather_bytes(message)[members]
        mean = mean_of_messages(gathered, members, self.rank, self.size, codec,
                                array, data, feedback if sending else None,
                                refused_here if sending else None, out)
        return mean, message.size * (self.size - 1) if sending else 0

    def close(self) -> None:
        group, self._group = getattr(self, "_group", None), None
        if group is not None:
            try:
                group.shutdown()
            except (RuntimeError, AttributeError):
                pass  # a group whose peers are gone may refuse an orderly shutdown
        self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
