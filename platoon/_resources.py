"""What a controller or worker process must release: its ZeroMQ sockets and its centre."""

import zmq


class Resources:
    """Owns a ZeroMQ context, its sockets and a SharedCentre; `close` releases them all.

    Kept apart from the Controller/Worker so a `weakref.finalize` can release
    them without keeping that object alive. Sockets are held strongly here:
    a socket orphaned by the garbage collector would make `Context.term` hang.
    """

    def __init__(self):
        self.context = zmq.Context()
        self.sockets = []
        self.centre = None
        self.authenticator = None
        self.farewell = None  # (socket, function returning a last message or None)
        self.stoppers = []  # called first by `close`: stop threads that use the sockets

    def socket(self, kind):
        """A new socket with linger 0, closed by `close`."""
        sock = self.context.socket(kind)
        sock.linger = 0
        self.sockets.append(sock)
        return sock

    def close(self):
        """Unmap the centre (unlinking it if we own it) and close every socket.

        A `farewell` message is sent first, with a second to leave.
        """
        stoppers, self.stoppers = self.stoppers, []
        for stop in stoppers:
            stop()
        if self.farewell is not None:
            sock, message = self.farewell
            self.farewell = None
            payload = message()
            if payload is not None:
                try:
                    sock.send(payload, zmq.NOBLOCK)
                    sock.linger = 1000
                except zmq.ZMQError:
                    pass
        if self.centre is not None:
            self.centre.close()
            if self.centre.owner:
                self.centre.unlink()
            self.centre = None
        for sock in self.sockets:
            sock.close()
        self.sockets = []
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        self.context.term()
