"""The controller's listening sockets: where they bind (tcp host and port, or ipc paths in
a private directory) and who may connect (CURVE keys)."""

import logging
import os
import shutil
import tempfile
import weakref
from typing import Optional, Tuple

import zmq

from .. import security
from .._resources import Resources
from ..errors import PlatoonError, PortInUse

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


def bind_tcp(sock, host: str, port: Optional[int]) -> int:
    """Bind `sock` on tcp://host:port (port 0 or None: a free one); return the port."""
    try:
        if not port:
            return sock.bind_to_random_port("tcp://%s" % host)
        sock.bind("tcp://%s:%d" % (host, port))
        return port
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EADDRINUSE:
            raise PortInUse("cannot listen on tcp://%s:%s: address already in use (another "
                            "controller?); choose another port, or pass 0 for a free one"
                            % (host, port)) from None
        raise PlatoonError("cannot listen on tcp://%s:%s: %s" % (host, port, exc)) from None


class Endpoints:
    """Makes server sockets in `res` on `transport` ("tcp" on `host`, or "ipc"), secured
    with the CURVE keys in `keys_file` if given. `close` removes the ipc directory."""

    def __init__(self, res: Resources, transport: str, host: str, job_id: str,
                 keys_file: Optional[str]):
        if transport not in ("tcp", "ipc"):
            raise ValueError("transport must be 'tcp' or 'ipc', got %r" % (transport,))
        self._res = res
        self.transport = transport
        self.host = host
        self._job_id = job_id
        self._ipc_dir: Optional[str] = None
        self._ipc_cleanup = None
        self._keys = security.load_keys(keys_file) if keys_file else None
        if self._keys is not None:
            res.authenticator = security.start_authenticator(res.context, self._keys)
        elif not security.is_loopback(host):
            log.warning("controller binds %s without authentication: anyone who can reach this "
                        "machine can join the job; use keys (platoon-launcher --curve)", host)

    def listen(self, port: Optional[int], name: str,
               options: dict) -> Tuple[zmq.Socket, Optional[int], str]:
        """A ROUTER with socket `options` ({zmq option: value}), bound for `name` ("control",
        "data"): (socket, port or None, endpoint). Raises PortInUse or PlatoonError if it
        cannot bind."""
        sock = self._res.socket(zmq.ROUTER)
        if self._keys is not None:
            security.make_server(sock, self._keys)
        for option, value in options.items():
            sock.setsockopt(option, value)
        try:
            port, address = self._bind(sock, port, name)
        except (PlatoonError, ValueError):
            sock.close()
            raise
        return sock, port, address

    def _bind(self, sock, port, name):
        if self.transport == "tcp":
            port = bind_tcp(sock, self.host, port)
            return port, "tcp://%s:%d" % (self.host, port)
        if port:
            raise ValueError("with transport='ipc' the controller picks its socket paths: pass "
                             "port 0, and give workers controller.%s_address" % name)
        if self._ipc_dir is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="platoon-%s-" % self._job_id)  # mode 0700
            self._ipc_cleanup = weakref.finalize(self, shutil.rmtree, self._ipc_dir, True)
        address = "ipc://%s" % os.path.join(self._ipc_dir, name)
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            raise PlatoonError("cannot listen on %s: %s" % (address, exc)) from None
        return None, address

    def close(self) -> None:
        """Remove the ipc socket directory, if any. Idempotent."""
        if self._ipc_cleanup is not None:
            self._ipc_cleanup()
