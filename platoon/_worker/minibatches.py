"""A worker's side of the minibatch channel: its requests, credit and acknowledgements.

The controller's side, and the channel's rules (requests, epochs, windows, what is re-sent
when), are `platoon._controller.minibatches`'s.
"""

import time

import zmq

from .. import protocol
from ..errors import MinibatchTimeout, ProtocolError


class MinibatchClient:
    """A worker's side of the channel: its requests, credit and acknowledgements.

    The worker's window is 1 + prefetch minibatches (DEFAULT_PREFETCH when None) and
    `window_bytes` of them: the controller sends while the worker's unacknowledged
    minibatches are within both (and always one, whatever its size). The worker asks
    again, acknowledging every minibatch received so far, once a quarter of the window
    (in either unit) has arrived since it last did, or once it has waited ACK_AFTER_MS for
    a minibatch: one request per several minibatches while they stream, and a worker
    waiting in `recv_mb` has acknowledged all it finished (so `flush_mb` completes). A
    request gives the window beyond those received, not an increment, so repeating
    it is harmless: a worker still waiting after ASK_AGAIN_S asks again, in case its
    request or minibatches were lost with a reset connection. Counts are of the current
    epoch: a message from the controller opening a new one (on a new connection) starts
    them again from 0.

    Holds no reference to the Worker, so a finalizer can say goodbye (`leave`)
    when the worker is closed or its process exits; `failed()` says then whether the
    worker failed (the Worker passes whether an exception is ending its script).
    """

    ACK_AFTER_MS = 1  # a worker waiting this long for a minibatch acknowledges what it has
    ASK_AGAIN_S = 0.5  # a worker waiting this long for a minibatch repeats its request
    # With prefetch None the window's cap is 1000 messages, ZeroMQ's default high-water mark,
    # as deep as raw PUSH/PULL: small minibatches are then bounded by window_bytes (16 MiB:
    # about 1000 of 16 KiB), so a sender runs that far ahead of a descheduled worker.
    DEFAULT_PREFETCH = 999
    ACKS_PER_WINDOW = 4  # requests per window's worth of minibatches, while they stream

    def __init__(self, sock, worker_id, token, prefetch, controller_alive, set_rcvtimeo,
                 address=None, window_bytes=protocol.DEFAULT_MB_WINDOW_BYTES,
                 failed=lambda: False):
        self.sock = sock
        self._set_rcvtimeo = set_rcvtimeo  # (sock, ms): the worker's, which recv_within knows
        self._waits_briefly = False  # is sock's receive timeout ACK_AFTER_MS?
        self.address = address  # the controller's data endpoint, for messages
        self.worker_id = worker_id
        self.token = token
        self.prefetch = self.DEFAULT_PREFETCH if prefetch is None else prefetch
        self.window = 1 + self.prefetch
        self.window_bytes = window_bytes
        # Ask again after this many messages, or bytes, received: early enough that the
        # rest of the window covers the time the request takes to bring more.
        self.ack_every = -(-self.window // self.ACKS_PER_WINDOW)
        self.ack_every_bytes = (-(-window_bytes // self.ACKS_PER_WINDOW) if window_bytes
                                else float("inf"))
        self.epoch = 0  # opened by the controller on this connection (0: none yet)
        self.received = 0  # its minibatch messages received: the controller numbers them alike
        self.acked = 0  # how many of them the controller was told are finished
        self.bytes_since_ack = 0  # of those received since
        self.asked = False  # has a request stated the window (since a refusal)?
        self.failed = failed  # did the worker fail? (asked when it leaves)
        self._controller_alive = controller_alive

    def ask(self, again=False):
        """Acknowledge every minibatch received so far and keep the window asked for
        (when either changed, or `again`)."""
        if again or not self.asked or self.received > self.acked:
            self.sock.send(protocol.encode_mb_request(
                self.worker_id, self.token, self.received, self.window,
                window_bytes=self.window_bytes, epoch=self.epoch), zmq.NOBLOCK)
            self.acked = self.received
            self.bytes_since_ack = 0
            self.asked = True

    def receive(self, recv_within, deadline, timeout_s):
        """Ask for (when due) and receive one minibatch (see `Worker.recv_mb`); its arrays.

        `recv_within(sock, deadline, copy)` waits for a frame until `deadline`
        (monotonic) and returns None then. Raises MinibatchTimeout, ProtocolError.
        """
        while True:
            frames = self._next_message(recv_within, deadline, timeout_s)
            try:
                arrays = protocol.decode_minibatch(frames)
            except ProtocolError:
                epoch = protocol.mb_epoch(frames)
                if epoch is not None:  # a new connection: count its minibatches from 0
                    self.epoch, self.received, self.acked = epoch, 0, 0
                    self.bytes_since_ack, self.asked = 0, False  # and say so soon
                    continue
                refusal = protocol.mb_refusal(frames)
                if refusal is not None:
                    self.asked = False
                    raise ProtocolError("the controller at %s refused worker %s's minibatch "
                                        "request: %s" % (self.address, self.worker_id, refusal)
                                        ) from None
                self.received_one(frames)  # a malformed one still counts: the controller sent it
                raise
            self.received_one(frames)
            return arrays

    def _next_message(self, recv_within, deadline, timeout_s):
        """Ask for minibatches (when due) and receive the next message; its frames."""
        sock = self.sock
        if not self.asked or self.received - self.acked >= self.ack_every \
                or self.bytes_since_ack >= self.ack_every_bytes:
            self._ask_or_raise()  # due by count: the next ones are most likely here already
        # Take one if here or within ACK_AFTER_MS (streaming, the next is microseconds away),
        # in one blocking receive with that timeout: a worker ahead of its controller waits
        # often, and a receive that raises zmq.Again followed by a poll costs it several µs
        # each time (see docs/performance.md). The timeout stays set while minibatches
        # stream, requests included: it changes only around a longer wait.
        if not self._waits_briefly:
            self._set_rcvtimeo(sock, self.ACK_AFTER_MS)
            self._waits_briefly = True
        try:
            first = sock.recv(0, copy=False)
        except zmq.Again:  # about to wait longer: acknowledge what it finished first
            self._ask_or_raise()
            self._waits_briefly = False  # recv_within sets its own receive timeouts
            first = self._recv_asking_again(recv_within, deadline)
            if first is None:
                raise MinibatchTimeout("no minibatch from %s within %.3g s"
                                       % (self.address, timeout_s)) from None
        if not first.more:  # the rest of a message is there once its first frame is
            return (first,)
        frames = [first]
        while frames[-1].more:
            frames.append(sock.recv(copy=False))
        return frames

    def _ask_or_raise(self):
        try:
            self.ask()
        except zmq.Again:
            raise MinibatchTimeout("cannot ask %s for a minibatch: the request queue is "
                                   "full" % self.address) from None

    def _recv_asking_again(self, recv_within, deadline):
        """`recv_within` until `deadline`, repeating the request every ASK_AGAIN_S."""
        while True:
            step = time.monotonic() + self.ASK_AGAIN_S
            frame = recv_within(self.sock, step if deadline is None else min(step, deadline),
                                copy=False)
            if frame is not None or (deadline is not None and time.monotonic() >= deadline):
                return frame
            try:
                self.ask(again=True)
            except zmq.Again:  # the request queue is full: one is on its way anyway
                pass

    def received_one(self, frames):
        self.received += 1
        self.bytes_since_ack += sum(map(len, frames))

    def leave(self, failed=None):
        """Tell the controller this worker takes no more minibatches: those on their way
        here go to others, and so does the last one received if the worker failed
        (`failed`; None: ask the `failed` given at construction)."""
        failed = self.failed() if failed is None else failed
        if self.sock.closed or not self._controller_alive():
            return
        done = self.received - (1 if failed and self.received else 0)
        try:
            self.sock.send(protocol.encode_mb_request(self.worker_id, self.token, done, 0,
                                                      bye=True, epoch=self.epoch), zmq.NOBLOCK)
            self.sock.linger = 1000  # let it leave before the socket closes
        except zmq.ZMQError:
            pass
