"""The controller's side of the minibatch channel: request-driven delivery.

The data socket is a ROUTER. A worker's DEALER asks for minibatches with a request
frame (see `platoon.protocol`) carrying its registration token, how many it has
finished (acknowledging them), how many more beyond those it wants on their way and
how many bytes of minibatches it lets be unacknowledged (its window, in messages and
in bytes; asking again is harmless, so a waiting worker repeats its request). A
minibatch goes only to a registered, live worker with credit whose unacknowledged
bytes are under its window (or that holds none: one goes whatever its size), in the
order the requests came; a peer without a valid token gets one error frame, and what it sends
afterwards is dropped unread, at a bounded cost per frame, so a flood cannot hold up
the workers' requests. Minibatches sent to a worker and not yet acknowledged are
kept, by worker rather than by connection: when the worker fails they are re-sent to
the next workers that ask; when it closes, those it prefetched but never took are;
when its connection is reset, those it had not received by its first request on
the new one are. A worker's requests read after its control goodbye still acknowledge
(they give no credit), and its data goodbye after them still counts.
Acknowledgements count by connection: the first message on each connection a worker
asks on opens a new epoch, numbered across the channel; a request
names the epoch it counts in and acknowledges only that epoch's minibatches (those of
an ended epoch are re-sent), so a count made before a reset, or one including
minibatches still arriving from the old connection, never acknowledges a minibatch
the worker has not received. (ZeroMQ keeps one receive queue per connected endpoint:
whatever the old connection brought comes before the new epoch's first message.)
What a minibatch costs the sender: one up to `protocol.PACK_MAX_BYTES` is packed into one
frame, the copy that lets the caller reuse its arrays (one frame costs less than a frame
per array); by default it is packed straight into a ZeroMQ message (`PackedBuffers`),
which ZeroMQ sends by reference, so that copy is the only one, and which is refilled once
its minibatch is acknowledged, memory already mapped. A larger one is a header
and a frame per array; by default (copy=True) each array is copied once, into a ZeroMQ
message (`zmq.Frame`) that is kept and re-sent by reference, as pyzmq's own copying send
copies each frame once. Python-owned memory is handed to ZeroMQ without a copy only with
copy=False: pyzmq's garbage-collector thread then wakes for every such frame to release
it, and takes the GIL from the sending thread to do so.
Everything here runs in the thread calling `send_mb` / `flush_mb`, in the process that
made the channel; the serve thread only reports workers that left, through a deque and
a wake-up pipe.
"""

import collections
import hmac
import logging
import os
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple, cast

import zmq

from .. import protocol
from .._os.logthrottle import ThrottledLog
from ..errors import MinibatchTimeout, ProtocolError, StopRequested, UsedAfterFork

log = logging.getLogger(__name__)


class _Peer:
    """A worker's connection to the data socket."""

    __slots__ = ("worker_id", "token", "identity", "epoch", "credit", "window_bytes", "sent",
                 "unacked", "unacked_bytes", "queued", "gone")

    def __init__(self, worker_id, token):
        self.worker_id = worker_id
        self.token = token
        self.identity = None  # of its current connection
        self.epoch = 0  # that connection's: requests counting in another acknowledge nothing
        self.credit = 0  # minibatches asked for and not yet sent
        self.window_bytes = 0  # bytes it lets be unacknowledged (0: no byte bound)
        self.sent = 0  # minibatches sent in this epoch, which numbers them: the worker too
        # (number, frames, nbytes) sent, not acknowledged
        self.unacked: Deque[Tuple[int, List[Any], int]] = collections.deque()
        self.unacked_bytes = 0  # their total size
        self.queued = False  # in the channel's `ready` deque
        self.gone = False


class _Packed(zmq.Frame):
    """A packed minibatch's frame from `PackedBuffers`: a ZeroMQ message of ZeroMQ's own
    memory, filled in place and sent by reference (`key`: its prefix, which names its
    layout; `reusable`: sent once, on one connection, so its acknowledgement means ZeroMQ
    has written all its bytes and will read none again)."""

    __slots__ = ("key", "reusable")
    key: bytes
    reusable: bool
    # object's, not pyzmq's, which looks for a socket option first (3 us an assignment)
    __setattr__ = object.__setattr__  # type: ignore[assignment]


class PackedBuffers:
    """Frames of packed minibatches, each reused once its minibatch was acknowledged.

    A frame is a ZeroMQ message (`_Packed`) that send_mb fills and ZeroMQ sends by
    reference: the packing is the only copy (pyzmq's copying send would allocate a message
    and copy the frame again, and ZeroMQ's I/O thread would free it: counted, 1.5 us of the
    sending thread's 11.5 per 16 KiB minibatch). The channel keeps every minibatch
    until acknowledged, and workers acknowledge many at once: new frames for each were
    allocated in memory that the allocator had just returned to the system with the last
    acknowledged batch of them, and mapped in again page by page (counted: about 0.8 page
    faults per 16 KiB minibatch in the sending thread). Frames given back are kept by
    layout, up to KEEP_BYTES in all.
    """

    KEEP_BYTES = 32 << 20  # a 16 MiB window of a worker or two, to be refilled

    def __init__(self):
        self._free: Dict[bytes, List[_Packed]] = {}  # by prefix (which names the layout)
        self._kept = 0  # bytes in _free

    def pack(self, arrays):
        """[a frame] holding `arrays` packed as `protocol.encode_minibatch` packs them, or
        None where it would not pack them or has not seen their layout yet."""
        slots = protocol.packed_slots(arrays)
        if slots is None:
            return None
        prefix, size, spans = slots
        free = self._free.get(prefix)
        if free:
            frame = free.pop()
            self._kept -= size
        else:  # zeros (the padding), in a message of ZeroMQ's: copy=True whatever the size
            frame = _Packed(bytes(size), copy=True)
            frame.key = prefix
            memoryview(frame)[:len(prefix)] = prefix  # type: ignore[arg-type]
        frame.reusable = True
        # (pyzmq's stubs do not say that a Frame is a buffer)
        view = memoryview(frame)  # type: ignore[arg-type]
        for a, (start, stop) in zip(arrays, spans):
            if stop > start:  # (an empty array's view cannot be cast)
                view[start:stop] = memoryview(a).cast("B")
        return [frame]

    def give_back(self, frame):
        """`frame` (from `pack`) is no longer needed: its minibatch was acknowledged. Kept
        for a refill only if it was sent once (see `_Packed`)."""
        size = len(frame)
        if frame.reusable and self._kept + size <= self.KEEP_BYTES:
            self._free.setdefault(frame.key, []).append(frame)
            self._kept += size


class MinibatchChannel:
    """Delivery state of the data socket `sock` (a bound ROUTER); see the module docstring.

    `workers` is the controller's `WorkerRegistry` (its `get(worker id)` gives a record
    with `token` and `has_left`), read to check requests; `hwm` (None: no cap) caps a
    worker's unacknowledged minibatches, below what its window allows.
    """

    # Unroutable sends raise instead of vanishing; the workers' windows (and hwm) bound
    # the queue; requests are small, so a peer sending more is dropped.
    SOCKET_OPTIONS = {zmq.ROUTER_MANDATORY: 1, zmq.SNDHWM: 0, zmq.MAXMSGSIZE: 4096}
    DRAIN_EVERY = 32  # sends at most between reads of the socket while workers have room
    DRAIN_AT_MOST = 64  # requests read at once: a flood must not keep the sender reading
    REFUSED_AT_MOST = 4096  # connections remembered as refused (their frames dropped unread)
    RETIRED_AT_MOST = 4096  # workers' replaced connections remembered (their requests ignored)

    def __init__(self, sock, hwm, workers, address, stopped=lambda: None):
        self._lock = threading.Lock()  # one sending thread at a time
        self.sock = sock
        self.hwm = hwm
        self.workers = workers
        self.address = address
        self.peers: Dict[int, _Peer] = {}  # worker id -> _Peer
        self.packed = PackedBuffers()  # send_mb's packed copies, reused once acknowledged
        self.refused = {}  # identities of connections refused once (insertion-ordered)
        self.retired = {}  # identities of workers' connections replaced or dropped (same)
        self.epochs = 0  # epochs opened so far: the last one's number
        # peers with credit, in the order they asked
        self.ready: Deque[_Peer] = collections.deque()
        # (frames, nbytes) to deliver again, first
        self.resend: Deque[Tuple[List[Any], int]] = collections.deque()
        # (token, failed) of workers that left: serve thread
        self.left: Deque[Tuple[str, bool]] = collections.deque()
        self.resent = 0  # minibatches re-sent so far
        self.delivered = 0  # minibatches sent by send_mb (re-sends not counted again)
        self._sends_undrained = 0  # sends since the socket was last read
        self.stopped = stopped  # a message once the job's stop was requested, else None
        self._warnings = ThrottledLog(log)
        self._pid = _process_id[0]  # its sockets work in this process only
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)

    # -- called from the serve thread --

    def worker_left(self, token, failed):
        """Worker with registration `token` is done (`failed`: it died or failed)."""
        self.left.append((token, failed))
        self.wake()

    def wake(self):
        """Make a sending thread waiting for a request look again (a stop was requested)."""
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    # -- called from the sending thread --

    def send_mb(self, arrays, timeout_s, copy):
        """Encode `arrays` and deliver them (see `Controller.send_mb`); the taker's id."""
        if _process_id[0] != self._pid:
            self._check_process("send_mb")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:  # (acknowledgements give packed frames back under it too)
            # a _Packed frame; or bytes (packed), or a header then memoryviews (cast to "B")
            # or, with copy, zmq.Frames
            frames: Optional[List[Any]] = self.packed.pack(arrays) if copy else None
            if frames is None:
                frames = cast(List[Any], protocol.encode_minibatch(arrays))
                if copy and len(frames) > 1:  # past PACK_MAX_BYTES: a header, then views
                    frames[1:] = [zmq.Frame(view, copy=True) for view in frames[1:]]
            nbytes = len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
            taker = self.deliver(frames, nbytes, deadline)
        if taker is None:
            raise MinibatchTimeout("no worker asked for a minibatch at %s within %.3g s; "
                                   "workers ask in recv_mb()" % (self.address, timeout_s))
        return taker

    def flush_mb(self, timeout_s):
        """Wait until every minibatch is acknowledged (see `Controller.flush_mb`)."""
        self._check_process("flush_mb")
        with self._lock:
            held = self.flush(_deadline(timeout_s))
        if held:
            raise MinibatchTimeout("%d minibatch(es) sent from %s not acknowledged within %.3g s "
                                   "(workers acknowledge one by calling recv_mb again or closing)"
                                   % (held, self.address, timeout_s))

    def deliver(self, frames, nbytes, deadline):
        """Send `frames` (`nbytes` in all) to the next worker with room for them; its id, or
        None at `deadline`."""
        # The common case, streaming: nothing to re-send, no worker leaving, requests read
        # recently, and the first worker in line has room. It gets the minibatch and goes to
        # the back of the line (rotating it: it stays queued, so no pop, check and append).
        ready = self.ready
        if ready and not self.resend and not self.left \
                and self._sends_undrained < self.DRAIN_EVERY - 1:
            if self.stopped() is not None:
                self._check_stopped()
            peer = ready[0]
            if self._has_room(peer) and self._send(peer, frames, nbytes):
                self._sends_undrained += 1
                if len(ready) > 1:
                    ready.rotate(-1)
                self.delivered += 1
                return peer.worker_id
        while True:
            self._check_stopped()
            # Reading the socket's state costs about as much as a send: while workers
            # with credit are queued, look for new requests only every DRAIN_EVERY sends
            # (a worker asks again long before its window of up to 256 runs out).
            self._sends_undrained += 1
            if not self.ready or self._sends_undrained >= self.DRAIN_EVERY or self.left:
                self._drain()
            if self.resend:
                self._send_resends()
            if not self.resend:
                peer = self._next_ready()
                if peer is not None:
                    if self._send(peer, frames, nbytes):
                        self.delivered += 1
                        return peer.worker_id
                    continue  # that peer is gone: the next one
            if not self._wait(deadline):
                return None

    def flush(self, deadline):
        """Serve requests until no minibatch is unacknowledged or waiting to be re-sent;
        returns how many still are at `deadline`."""
        while True:
            self._check_stopped()
            self._drain()
            self._send_resends()
            held = len(self.resend) + sum(len(p.unacked) for p in self.peers.values())
            if not held or not self._wait(deadline):
                return held

    def close(self):
        """Close the wake-up pipe (the socket belongs to the controller). Idempotent."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    # -- internals --

    def _check_process(self, caller):
        if _process_id[0] != self._pid:  # no system call a minibatch (see _process_id)
            raise UsedAfterFork(
                "Controller.%s() called in process %d, forked from the controller's process "
                "%d: ZeroMQ sockets do not work after fork(), so nothing would be delivered. "
                "Feed minibatches from a thread of the controller process (threading.Thread), "
                "not from a multiprocessing.Process" % (caller, _process_id[0], self._pid))

    def _check_stopped(self):
        stopped = self.stopped()
        if stopped is not None:
            raise StopRequested("no more minibatches are delivered from %s: %s"
                                % (self.address, stopped))

    def _wait(self, deadline):
        """Wait for a request or a worker leaving; False once `deadline` has passed."""
        if deadline is None:
            wait_ms = None
        else:
            wait_ms = int((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0:
                return False
        events = dict(self._poller.poll(wait_ms))
        if self._wake_r in events:
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
        return bool(events) or deadline is None or time.monotonic() < deadline

    def _drain(self):
        """Handle workers that left, then the requests waiting on the socket (at most
        DRAIN_AT_MOST: ZeroMQ takes them from each connection in turn, so a worker's
        request is among the first few however much a rogue peer sends)."""
        self._sends_undrained = 0
        while self.left:
            token, failed = self.left.popleft()
            for peer in list(self.peers.values()):
                if peer.token == token:
                    if failed:
                        self._drop(peer, "failed")
                    else:  # its farewell on this socket says what it took; nothing more
                        peer.credit = 0
        sock = self.sock
        for _ in range(self.DRAIN_AT_MOST):
            if not sock.getsockopt(_EVENTS) & _POLLIN:  # cheaper than a recv raising Again
                break
            self._request(sock.recv_multipart())

    def _request(self, frames):
        identity = frames[0]
        if identity in self.refused:  # answered once already: dropped unread
            return None
        try:
            if len(frames) != 2:
                raise ProtocolError("a minibatch request is one frame, got %d" % (len(frames) - 1))
            wid, token, done, credit, bye, window_bytes, epoch = \
                protocol.decode_mb_request(frames[1])
        except ProtocolError as exc:
            return self._refuse(identity, str(exc))
        record = self.workers.get(wid)
        if record is None or not hmac.compare_digest(record.token.encode(), token.encode()):
            return self._refuse(identity, "minibatch request refused: no registered worker %d "
                                "with that token; platoon.Worker registers on the control "
                                "socket first" % wid)
        peer = self.peers.get(wid)
        if bye:  # a worker leaving: what it has not taken goes to others
            if peer is not None:
                self._ack(peer, epoch, done)
                self._drop(peer, "left")
            return None
        if identity in self.retired:  # sent before its connection was replaced: it asks
            return None  # again on the new one, where all it has not acknowledged is re-sent
        if record.has_left:  # its control goodbye was handled before this request
            if peer is not None and peer.identity == identity:
                # Sent before it left (its data goodbye follows on this connection): the
                # acknowledgement counts, the credit does not. Refusing it would also drop
                # that goodbye unread and hold its minibatches until flush_mb timed out.
                peer.credit = 0
                self._ack(peer, epoch, done)
                return None
            return self._refuse(identity, "worker %d has left the job; it gets no more "
                                "minibatches" % wid)
        if peer is None or peer.identity != identity:
            peer = self._connected(peer, wid, record.token, identity, epoch, done)
            if peer is None:
                return None
        peer.window_bytes = window_bytes
        self._ack(peer, epoch, done)
        received = done if epoch == peer.epoch else 0  # of this epoch's, as far as it knows
        peer.credit = max(0, received + credit - peer.sent)
        self._queue(peer)
        return None

    def _connected(self, peer, wid, token, identity, epoch, done):
        """Worker `wid` (`peer`, or None if new) asks on connection `identity`: open an epoch
        on it. If `peer` had another connection, that one was reset: the minibatches sent
        on it that this request (counting `done` of `epoch`) does not acknowledge were lost
        with it (or are arriving still: delivery is at least once) and go to the next
        workers that ask. Returns the peer, or None if the new connection is gone already."""
        if peer is None:
            peer = self.peers[wid] = _Peer(wid, token)
        else:
            self._ack(peer, epoch, done)
            log.warning("worker %d's data connection was reset; re-sending the %d "
                        "minibatch(es) sent to it that it had not acknowledged", wid,
                        len(peer.unacked))
            self._take_back(peer)
            self._retire(peer.identity)
        self.epochs += 1
        peer.identity, peer.epoch, peer.sent = identity, self.epochs, 0
        try:
            self.sock.send_multipart([identity, protocol.encode_mb_epoch(peer.epoch)])
        except zmq.ZMQError:  # EHOSTUNREACH: disconnected already
            self._drop(peer, "disconnected")
            return None
        return peer

    def _retire(self, identity):
        """Remember `identity` as a worker's connection replaced or dropped (bounded)."""
        retired = self.retired
        if len(retired) >= self.RETIRED_AT_MOST:
            del retired[next(iter(retired))]  # the oldest
        retired[identity] = None

    def _refuse(self, identity, message):
        """Answer the connection `identity` once with `message`; its later frames are dropped."""
        refused = self.refused
        if len(refused) >= self.REFUSED_AT_MOST:
            del refused[next(iter(refused))]  # the oldest: bounded memory
        refused[identity] = None
        self._warnings.warning("minibatch-refusal", "data socket %s: %s", self.address, message)
        try:
            self.sock.send_multipart([identity, protocol.encode_mb_refusal(message)])
        except zmq.ZMQError:  # the peer is gone already
            pass

    def _ack(self, peer, epoch, done):
        """`peer` has finished the first `done` minibatches of `epoch`: forget those that
        are of its current epoch (an older epoch's were taken back when it ended)."""
        if epoch == peer.epoch:
            unacked = peer.unacked
            while unacked and unacked[0][0] <= done:
                _, frames, nbytes = unacked.popleft()
                peer.unacked_bytes -= nbytes
                if type(frames[0]) is _Packed:
                    self.packed.give_back(frames[0])
        self._queue(peer)

    def _has_room(self, peer):
        """Does `peer` take another minibatch: credit left, and under its window in bytes
        (or holding none) and under hwm."""
        if peer.gone or peer.credit <= 0:
            return False
        held = len(peer.unacked)
        if not held:
            return True
        if peer.window_bytes and peer.unacked_bytes >= peer.window_bytes:
            return False
        return self.hwm is None or held < self.hwm

    def _queue(self, peer):
        if not peer.queued and self._has_room(peer):
            peer.queued = True
            self.ready.append(peer)

    def _next_ready(self):
        while self.ready:
            peer = self.ready.popleft()
            peer.queued = False
            if self._has_room(peer):
                return peer
        return None

    def _send_resends(self):
        while self.resend:
            peer = self._next_ready()
            if peer is None:
                return
            frames, nbytes = self.resend.popleft()
            if self._send(peer, frames, nbytes):
                self.resent += 1
            else:
                self.resend.appendleft((frames, nbytes))

    def _send(self, peer, frames, nbytes):
        """Send to `peer`; False (and the peer dropped) if its connection is gone."""
        sock, send = self.sock, _socket_send
        try:
            send(sock, peer.identity, _SNDMORE, True)
        except zmq.ZMQError:  # EHOSTUNREACH: disconnected
            self._drop(peer, "disconnected")
            return False
        last = len(frames) - 1
        if last:
            for frame in frames[:last]:
                send(sock, frame, _SNDMORE, False)  # small frames are copied, large not
            send(sock, frames[last], 0, False)
        else:  # a _Packed frame goes by reference; bytes (a layout's first) are copied
            frame = frames[0]
            send(sock, frame, 0, type(frame) is not _Packed)
        peer.sent += 1
        peer.credit -= 1
        peer.unacked.append((peer.sent, frames, nbytes))
        peer.unacked_bytes += nbytes
        if not peer.queued:  # (send_mb's fast path keeps it queued and moves it itself)
            self._queue(peer)  # behind the others that asked
        return True

    def _drop(self, peer: "_Peer", why: str) -> None:
        """Forget `peer`; its unacknowledged minibatches are re-sent first."""
        peer.gone = True
        if self.peers.get(peer.worker_id) is peer:
            del self.peers[peer.worker_id]
        self._retire(peer.identity)
        if peer.unacked:
            log.warning("worker %d %s holding %d minibatch(es) (%d bytes) it had not finished; "
                        "re-sending them to the next workers that ask", peer.worker_id, why,
                        len(peer.unacked), peer.unacked_bytes)
            self._take_back(peer)

    def _take_back(self, peer):
        """Queue `peer`'s unacknowledged minibatches to be re-sent first, in their order.
        Their packed frames are never refilled: ZeroMQ may still be writing them to the
        connection they were first sent on."""
        for _, frames, _ in peer.unacked:
            if type(frames[0]) is _Packed:
                frames[0].reusable = False
        self.resend.extendleft(reversed([(frames, nbytes) for _, frames, nbytes
                                         in peer.unacked]))
        peer.unacked.clear()
        peer.unacked_bytes = 0


# Plain ints: flags are combined and passed on every send (enum arithmetic costs a microsecond)
_SNDMORE = int(zmq.SNDMORE)
# pyzmq's send itself (sock, data, flags, copy), without zmq.Socket's Python wrapper, which
# adds only the draft sockets' routing_id= and group= and passes the rest on by keyword:
# a few microseconds of a minibatch's two or three sends on this machine
_socket_send = zmq.backend.Socket.send
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


# This process's id, kept by a fork hook: os.getpid() is a system call (about 0.3-1 us
# here), which send_mb would pay on every minibatch.
_process_id = [os.getpid()]


def _forked():
    _process_id[0] = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _deadline(timeout_s):
    return None if timeout_s is None else time.monotonic() + timeout_s
