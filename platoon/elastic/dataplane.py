"""The outer round's data plane: a torch.distributed gloo group made afresh for each quorum.

Each node hosts a store from its start (`platoon.elastic.store.StoreServer`, which serves the
job's nodes only) and gives its address to the lighthouse; a quorum's group meets at its rank
0's store, under the prefix of the quorum's id and nonce (`store_prefix`; torchft prefixes by
id), so groups of old quorums never mix with the new one's. Every wait is finite: a member
that dies or stops answering makes the round raise QuorumBroken within `timeout_s`, and the
caller waits for the next quorum (`LighthouseClient.wait_for_quorum`) and builds a new group.
Needs torch (``pip install platoon-dp[elastic]``); the messages are those of
`platoon.node.compress` (float32, int8, int4, error feedback), averaged in rank order so that
every member gets the same bits. A round's mean is a reduce-scatter then an all-gather
(`QuorumGroup.compressed_mean`): each member sends about 2 m coded bytes for a message of m,
whatever the quorum's size.
"""

import datetime
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
from numpy.typing import DTypeLike

from ..errors import NonFiniteValues, PlatoonError, QuorumBroken
from ..node.compress import (
    BLOCK,
    Codec,
    ErrorFeedback,
    mean_of_messages,
    own_message,
    with_residual,
)
from .quorum import Quorum
from .secret import sign_move, verify
from .store import KeysNotSet, StoreClient, StoreServer  # noqa: F401 (StoreServer: here too)

# Below this many elements per member a mean goes as one all-gather of whole messages (the
# reduce-scatter's chunks would be smaller than a codec's block).
MIN_CHUNK = BLOCK
MAC_BYTES = 32  # each message of a mean is signed (`secret.sign_move`)
ALL = -1  # a message's receiver when it goes to every member
ABANDON_POLL_S = 0.25  # a group waiting for its members to meet asks this often to go on
T = TypeVar("T")


def chunk_bounds(n: int, parts: int, align: int = BLOCK) -> List[int]:
    """`parts` + 1 offsets cutting n elements into `parts` contiguous chunks of about equal
    size, each boundary a multiple of `align` (the last chunk takes the remainder)."""
    blocks = -(-n // align)
    return [min(n, align * (blocks * k // parts)) for k in range(parts)] + [n]


def load_torch() -> Tuple[ModuleType, ModuleType]:
    """(torch, torch.distributed), imported (seconds, the first time); PlatoonError without
    torch."""
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


def _patiently(call: Callable[[float], T], timeout_s: float,
               abandon: Optional[Callable[[], Optional[str]]]) -> T:
    """`call(wait_s)` (a store's get or wait) within `timeout_s` in all; when `abandon` is
    given, in waits of ABANDON_POLL_S, asking it between two whether to give up (its reason;
    KeysNotSet saying it), as a group forming does."""
    if abandon is None:
        return call(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return call(max(0.001, min(left, ABANDON_POLL_S)))
        except KeysNotSet:
            if left <= ABANDON_POLL_S:
                raise
        why = abandon()
        if why:
            raise KeysNotSet("gave the group up: %s" % why)


def _rendezvous_store(client: StoreClient,  # (Any: torch is not followed, setup.cfg)
                      abandon: Optional[Callable[[], Optional[str]]] = None) -> Any:
    """`client` as a torch.distributed store, for gloo's rendezvous (it sets, waits for and
    gets its members' addresses; nothing else is served); `abandon`: see `_patiently`."""
    _, dist = load_torch()

    class Rendezvous(dist.Store):  # type: ignore[name-defined]  # (torch is not followed)
        def __init__(self) -> None:
            super().__init__()
            self.timeout_s = client.timeout_s

        def set_timeout(self, timeout: datetime.timedelta) -> None:
            self.timeout_s = timeout.total_seconds()

        def set(self, key: str, value: Union[str, bytes]) -> None:
            client.set(key, value.encode() if isinstance(value, str) else bytes(value))

        def get(self, key: str) -> bytes:
            return _patiently(lambda wait_s: client.get(key, wait_s), self.timeout_s, abandon)

        def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
            _patiently(lambda wait_s: client.wait(keys, wait_s),
                       self.timeout_s if timeout is None else timeout.total_seconds(), abandon)

        def check(self, keys: List[str]) -> bool:
            return client.check(keys)

        def delete_key(self, key: str) -> bool:
            return client.delete_key(key)

        def num_keys(self) -> int:
            return client.num_keys()

    return Rendezvous()


def unreachable_members(quorum: Quorum, name: str, timeout_s: float = 1.0) -> List[str]:
    """The members of `quorum` other than `name` whose data-plane address (their store)
    refuses or does not answer a TCP connection within `timeout_s`: asked when a group failed
    to form, to tell a member the others cannot reach (its --host an address only it sees, a
    firewall) from one that was slow."""
    def refused(address: str) -> bool:
        try:
            socket.create_connection(_split(address), timeout=timeout_s).close()
            return False
        except OSError:
            return True

    others = [(m, a) for m, a in zip(quorum.members, quorum.addresses) if m != name]
    if not others:
        return []
    with ThreadPoolExecutor(min(16, len(others))) as pool:
        found = list(pool.map(lambda other: refused(other[1]), others))
    return [m for (m, _), bad in zip(others, found) if bad]


def store_prefix(quorum: Quorum) -> str:
    """Where `quorum`'s group meets in its rank 0's store: under its id and its random nonce
    (from the lighthouse, signed): distinct for two quorums of one id (the store serves the
    job's nodes only: the prefix is no secret)."""
    return "platoon/quorum/%d/%s/" % (quorum.id, quorum.nonce)


class QuorumGroup:
    """This node's gloo group for `quorum` (it must hold `name`), reached through the store
    at the quorum's rank 0, which must hold the job's `secret` as this node does; every
    collective waits at most `timeout_s`. Raises QuorumBroken when the group cannot be
    formed in time (or the store there is not the job's), or once `abandon()`, asked every
    ABANDON_POLL_S while it waits for its members to meet, gives a reason to stop waiting
    (a newer quorum, a member gone)."""

    def __init__(self, quorum: Quorum, name: str, timeout_s: float = 30.0, *, secret: bytes,
                 abandon: Optional[Callable[[], Optional[str]]] = None):
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0 seconds, got %r" % (timeout_s,))
        self.quorum, self.name, self.timeout_s = quorum, name, timeout_s
        self.rank, self.size = quorum.rank_of(name), quorum.size
        self._secret = secret
        self._seq = 0  # the means this group made (each member counts alike)
        self._residuals: Dict[Tuple[str, int, str], np.ndarray] = {}  # `_owner_residual`
        _, dist = load_torch()
        timeout = datetime.timedelta(seconds=timeout_s)
        own_host, _ = _split(quorum.addresses[self.rank])
        client = StoreClient(quorum.store_address, secret, timeout_s)
        try:
            store = _rendezvous_store(client, abandon)
            prefixed = dist.PrefixStore(store_prefix(quorum), store)
            # gloo's options are private in torch's Python API (torchft sets them alike): the
            # device binds the interface this node gave the lighthouse, not the hostname's
            options = dist.ProcessGroupGloo._Options()  # noqa: SLF001
            options._timeout = timeout  # noqa: SLF001
            options._devices = [  # noqa: SLF001
                dist.ProcessGroupGloo.create_device(hostname=own_host)]
            # (Any: torch.distributed's gloo objects, torch is not followed)
            self._group: Any = dist.ProcessGroupGloo(prefixed, self.rank, self.size, options)
        except (RuntimeError, OSError, ValueError, MemoryError) as exc:
            # (gloo raises std::bad_alloc on an address it cannot parse)
            raise self._broken("forming the group", exc) from exc
        finally:
            client.close()  # gloo has its members' addresses (a later use opens it again)
        self._store: Any = store  # the Rendezvous (a torch.distributed.Store)

    def _broken(self, doing: str, exc: BaseException) -> QuorumBroken:
        return QuorumBroken(
            "node %s (rank %d of quorum %d: %s): %s failed within %.3g s (%s: %s); nothing "
            "was averaged: wait for the next quorum and build its group"
            % (self.name, self.rank, self.quorum.id, ", ".join(self.quorum.members), doing,
               self.timeout_s, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))

    def _signed(self, seq: int, receiver: int, message: np.ndarray) -> np.ndarray:
        """`message` (uint8) with this member's signature of it for `receiver` appended."""
        mac = sign_move(self._secret, self.quorum.id, self.quorum.nonce, seq, self.rank,
                        receiver, np.ascontiguousarray(message).tobytes())
        return np.concatenate([message, np.frombuffer(mac, np.uint8)])

    def _checked(self, seq: int, sender: int, receiver: int, signed: np.ndarray,
                 doing: str) -> np.ndarray:
        """`signed`'s message, once its signature shows `sender` sent it, unaltered, to
        `receiver` in mean `seq`; QuorumBroken before anything is applied when not."""
        message = signed[:-MAC_BYTES]
        expected = sign_move(self._secret, self.quorum.id, self.quorum.nonce, seq, sender,
                             receiver, np.ascontiguousarray(message).tobytes())
        if not verify(expected, signed[-MAC_BYTES:].tobytes()):
            raise QuorumBroken(
                "node %s (rank %d of quorum %d: %s): the message of rank %d (%s) in %s is not "
                "signed with the job's secret (altered on its way, or not the job's process?); "
                "nothing was averaged: the round is dropped"
                % (self.name, self.rank, self.quorum.id, ", ".join(self.quorum.members), sender,
                   self.quorum.members[sender], doing))
        return message

    def all_gather_bytes(self, message: np.ndarray) -> np.ndarray:
        """Every member's uint8 `message` (all of one size), one row per rank in rank order."""
        torch, _ = load_torch()
        mine = torch.from_numpy(np.array(message, np.uint8).reshape(-1))  # writable, its own
        rows = torch.empty((self.size, mine.numel()), dtype=torch.uint8)
        self._run("the all-gather", lambda: self._group.allgather([list(rows.unbind(0))], [mine]))
        gathered: np.ndarray = rows.numpy()
        return gathered

    def broadcast_bytes(self, message: np.ndarray, root: int) -> np.ndarray:
        """`root`'s uint8 `message` on every member (each passes a buffer of its size)."""
        torch, _ = load_torch()
        buf = torch.from_numpy(np.array(message, np.uint8).reshape(-1))
        self._run("the broadcast from rank %d" % root, lambda: self._group.broadcast(buf, root))
        received: np.ndarray = buf.numpy()
        return received

    def compressed_mean(self, array: np.ndarray, codec: Codec,
                        feedback: Optional[ErrorFeedback] = None,
                        out: Optional[np.ndarray] = None,
                        among: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, int]:
        """The mean over the quorum of the members' `array`s, each sent as `codec`'s messages
        of ``array + feedback.residual`` (as `platoon.mpi.compress.compressed_mean`, whose
        arithmetic it shares: the same bits on every member); returns (mean, bytes this node
        sent). Raises QuorumBroken when a member fails the round, NonFiniteValues when any
        member's array holds NaN or Inf. `among`: the ranks whose arrays make the mean
        (default all); the others' messages are not read (their array: any of the right
        size). The residual changes only once every message is in: a broken round drops
        nothing.

        A reduce-scatter then an all-gather: the array is cut into one chunk per member
        (`chunk_bounds`); each member sends every other member its coded chunk of it, each
        adds up the messages of its chunk in rank order and sends the mean chunk, coded again
        (with an error feedback of its own for this quorum), to every member; every member
        decodes the same messages. Every message is signed with the job's secret for its
        receiver and this mean (`secret.sign_move`): one altered on its way, replayed, or sent
        by a process without the secret breaks the round (QuorumBroken) before anything is
        applied. About 2 m bytes sent per member for a message of m,
        whatever the quorum's size (an all-gather of whole messages: (size - 1) m). Arrays
        too small to cut (fewer than `MIN_CHUNK` elements per member) go as one all-gather."""
        array = np.asarray(array)
        if array.dtype.kind != "f":
            raise ValueError("compressed_mean averages floating-point arrays, not %s"
                             % array.dtype)
        if feedback is not None and feedback.residual.size != array.size:
            raise ValueError("ErrorFeedback of %d elements for an array of %d"
                             % (feedback.residual.size, array.size))
        members = list(range(self.size)) if among is None else sorted(set(among))
        sending = self.rank in members
        seq, self._seq = self._seq, self._seq + 1  # each member counts its means alike
        if self.size == 1 or array.size < MIN_CHUNK * self.size:
            return self._gathered_mean(array, codec, feedback if sending else None, out,
                                       members, seq)
        torch, dist = load_torch()
        flat = array.reshape(-1)
        data = with_residual(flat, feedback if sending else None)
        bounds = chunk_bounds(flat.size, self.size)
        sizes = [codec.encoded_size(bounds[k + 1] - bounds[k]) for k in range(self.size)]
        # 1. each member's chunk k to member k (a refusal in every chunk for NaN or Inf)
        outgoing = np.zeros(sum(sizes), np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        refused_here = None
        if sending:
            for k in range(self.size):
                part = outgoing[offsets[k]:offsets[k + 1]]
                try:
                    codec.encode(data[bounds[k]:bounds[k + 1]], out=part)
                except NonFiniteValues as exc:
                    refused_here = exc
                    break
            if refused_here is not None:
                for k in range(self.size):
                    outgoing[offsets[k]:offsets[k + 1]] = codec.refusal(
                        bounds[k + 1] - bounds[k])
        mine = self.rank
        signed_out = np.concatenate([self._signed(seq, k, outgoing[offsets[k]:offsets[k + 1]])
                                     for k in range(self.size)])
        incoming = torch.empty(self.size * (sizes[mine] + MAC_BYTES), dtype=torch.uint8)
        self._run("the reduce-scatter", lambda: self._group.alltoall_base(
            incoming, torch.from_numpy(signed_out), [sizes[mine] + MAC_BYTES] * self.size,
            [size + MAC_BYTES for size in sizes], dist.AllToAllOptions()))
        signed_in = incoming.numpy().reshape(self.size, sizes[mine] + MAC_BYTES)
        for r in range(self.size):
            self._checked(seq, r, mine, signed_in[r], "the reduce-scatter")
        received = signed_in[:, :-MAC_BYTES]  # (a view: every row's signature checked)
        n_mine = bounds[mine + 1] - bounds[mine]
        acc_dtype = np.result_type(array.dtype, np.float32)
        refusing = [r for r in members if codec.refused(received[r])]
        total = np.zeros(n_mine, acc_dtype)
        if not refusing:
            scratch = np.empty(n_mine, acc_dtype)
            for index, r in enumerate(members):
                decoded = codec.decode(received[r], total if index == 0 else scratch)
                if index > 0:
                    total += decoded
            total /= len(members)
        # 2. each member's mean chunk (with whom it found refusing) to every member
        owner_residual = self._owner_residual(codec, array.size, acc_dtype, n_mine)
        widest = max(sizes)
        flags = np.zeros(self.size, np.uint8)
        flags[refusing] = 1
        message = np.zeros(self.size + widest, np.uint8)
        message[:self.size] = flags
        if not refusing:
            total += owner_residual
            codec.encode(total, out=message[self.size:self.size + sizes[mine]])
        signed_rows = self.all_gather_bytes(self._signed(seq, ALL, message))
        rows = [self._checked(seq, r, ALL, row, "the all-gather")
                for r, row in enumerate(signed_rows)]
        everyone_refusing = sorted({int(r) for row in rows
                                    for r in np.flatnonzero(row[:self.size])})
        if everyone_refusing:
            raise NonFiniteValues(
                "compressed_mean: rank(s) %s of %d hold NaN or Inf, which would reach every "
                "rank's mean (%s); nothing was averaged"
                % (", ".join(map(str, everyone_refusing)), self.size, codec.name),
                everyone_refusing) from refused_here
        mean = out if out is not None else np.empty(array.shape, array.dtype)
        flat_mean = np.empty(flat.size, acc_dtype)
        for k, row in enumerate(rows):
            codec.decode(row[self.size:self.size + sizes[k]], flat_mean[bounds[k]:bounds[k + 1]])
        # every message is in: the residuals move (what this member's messages lost)
        owner_residual[...] = total - flat_mean[bounds[mine]:bounds[mine + 1]]
        if sending and feedback is not None:
            for k in range(self.size):
                sent = np.empty(bounds[k + 1] - bounds[k], acc_dtype)
                codec.decode(outgoing[offsets[k]:offsets[k + 1]], sent)
                np.subtract(data[bounds[k]:bounds[k + 1]], sent,
                            out=feedback.residual[bounds[k]:bounds[k + 1]], casting="same_kind")
        mean.reshape(-1)[...] = flat_mean
        spread = sum(sizes) - sizes[mine] + MAC_BYTES * (self.size - 1) if sending else 0
        return mean, spread + (self.size + widest + MAC_BYTES) * (self.size - 1)

    def _owner_residual(self, codec: Codec, n: int, dtype: DTypeLike, n_mine: int
                        ) -> np.ndarray:
        """What coding this member's mean chunks of arrays of `n` elements lost so far (added
        to the next one): this quorum's own, as its chunks are (zeros for a lossless codec's,
        which never change)."""
        key = (codec.name, n, np.dtype(dtype).str)
        if key not in self._residuals:
            self._residuals[key] = np.zeros(n_mine, dtype)
        return self._residuals[key]

    def _gathered_mean(self, array: np.ndarray, codec: Codec,
                       feedback: Optional[ErrorFeedback], out: Optional[np.ndarray],
                       members: Sequence[int], seq: int) -> Tuple[np.ndarray, int]:
        """`compressed_mean` as one all-gather of every member's whole message (signed)."""
        sending = self.rank in members
        data, message, refused_here = own_message(array.reshape(-1), codec, feedback)
        signed_rows = self.all_gather_bytes(self._signed(seq, ALL, message))
        gathered = np.stack([self._checked(seq, r, ALL, signed_rows[r], "the all-gather")
                             for r in members])
        mean = mean_of_messages(gathered, members, self.rank, self.size, codec,
                                array, data, feedback, refused_here if sending else None, out)
        return mean, (message.size + MAC_BYTES) * (self.size - 1) if sending else 0

    def _run(self, doing: str, start: Callable[[], Any]) -> None:  # (Any: gloo's Work)
        """Start a collective (`start()` returns its work) and wait for it, at most
        `timeout_s`; QuorumBroken, saying what was `doing`, when either fails."""
        try:
            start().wait(datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, OSError) as exc:
            raise self._broken(doing, exc) from exc

    def close(self) -> None:
        group, self._group = getattr(self, "_group", None), None
        if group is not None:
            try:
                group.shutdown()
            except (RuntimeError, AttributeError):
                pass  # a group whose peers are gone may refuse an orderly shutdown
        self._store = None

    def __enter__(self) -> "QuorumGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
