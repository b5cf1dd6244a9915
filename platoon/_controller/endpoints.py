"""The controller's listening sockets: where they bind (tcp host and port, or ipc paths in
a private directory) and who may connect (CURVE keys; on this machine, only this user)."""

import logging
import os
import resource
import shutil
import tempfile
import threading
import weakref
from typing import List, Optional, Tuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import security
from .._os.logthrottle import ThrottledLog
from .._resources import Resources
from ..errors import PlatoonError, PortInUse
from . import peers
from .config import check_port

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


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open descriptors to its hard limit, so that
    connections (each takes one) do not starve the job's own files; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):  # (RLIM_INFINITY above the kernel's nr_open)
            pass
    return soft


class StrangerGuard:
    """Hangs up, as ZeroMQ accepts them, TCP connections to a listening socket whose other
    end is a socket of another user on this machine (root's are admitted).

    ZeroMQ accepts connections before any handshake and gives each a descriptor: without
    this, another local user holding idle connections exhausts the controller's descriptors
    (no worker can register, checkpoints fail). Such a peer could never register anyway
    (`registry.check_peer` needs its /proc). One thread per watched socket reads its
    ZeroMQ monitor; each check is one sock_diag lookup on a netlink socket the thread opened
    beforehand, so a controller out of descriptors still drops them. Peers on other machines
    are not judged here: CURVE keys keep them out (`security`)."""

    def __init__(self, res: Resources):
        self._res = res
        self._admitted = {os.getuid(), 0}
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._log = ThrottledLog(log)
        res.stoppers.append(self.close)

    def watch(self, sock: zmq.Socket, name: str) -> None:
        """Check each connection `sock` (bound for `name`) accepts from now on."""
        diag = peers.open_diag()  # (this thread's own: one netlink socket, one question at once)
        if diag is None:
            return  # no sock_diag: peers cannot be told apart (the limit is raised still)
        address = "inproc://platoon-accepted-%s-%x" % (name, id(sock))
        sock.monitor(address, zmq.EVENT_ACCEPTED)
        monitor = self._res.socket(zmq.PAIR)
        monitor.connect(address)
        thread = threading.Thread(target=self._run, args=(monitor, diag, name), daemon=True,
                                  name="platoon-guard-%s" % name)
        self._threads.append(thread)
        thread.start()

    def _run(self, monitor: zmq.Socket, diag, name: str) -> None:
        with diag:
            while not self._stop.is_set():
                if monitor.poll(100):
                    event = recv_monitor_message(monitor)
                    if event["event"] == zmq.EVENT_ACCEPTED:
                        self._check(event["value"], diag, name)

    def _check(self, fd: int, diag, name: str) -> None:
        end = peers.other_end(fd, diag)
        if end is None or end[1] in self._admitted:
            return
        peers.hang_up(fd)
        self._log.warning("stranger", "dropped a connection to the %s socket from uid %d "
                          "(another user on this machine): only uid %d's processes may "
                          "join this job", name, end[1], os.getuid())

    def close(self) -> None:
        """Stop the threads (each closes its netlink socket). Idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._threads = []
        self._log.flush()


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
        self._ipc_cleanup: Optional[weakref.finalize] = None
        self._keys = security.load_keys(keys_file) if keys_file else None
        self._guard: Optional[StrangerGuard] = None
        if transport == "tcp":  # (an ipc socket's 0700 directory keeps other users out)
            raise_descriptor_limit()
            self._guard = StrangerGuard(res)
        if self._keys is not None:
            res.authenticator = security.start_authenticator(res.context, self._keys)
        elif not security.is_loopback(host):
            log.warning("controller binds %s without authentication: anyone who can reach this "
                        "machine can join the job; use keys (platoon-launcher --curve)", host)

    def listen(self, port: Optional[int], name: str,
               options: dict) -> Tuple[zmq.Socket, Optional[int], str]:
        """A ROUTER with socket `options` ({zmq option: value}), bound for `name` ("control",
        "data"): (socket, port or None, endpoint). Raises ValueError for a port out of
        range, PortInUse or PlatoonError if it cannot bind."""
        port = check_port(port, name)
        sock = self._res.socket(zmq.ROUTER)
        if self._keys is not None:
            security.make_server(sock, self._keys)
        for option, value in options.items():
            sock.setsockopt(option, value)
        if self._guard is not None:
            self._guard.watch(sock, name)
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
