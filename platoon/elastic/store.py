"""The data plane's rendezvous store: where a quorum's gloo group meets, open to the job only.

Each node hosts one (`StoreServer`) from its start and gives its address to the lighthouse;
a quorum's members meet at its rank 0's, each through a `StoreClient`, and gloo writes there
each member's addresses. A connection is served only once both ends have shown they hold the
job's secret (a challenge each way, HMAC-SHA256, `secret.sign_store_hello`): a process
without it can neither list nor read nor write a key, so it cannot learn a quorum's keys or
give a member a wrong address, and a member cannot be given addresses by a process on its
rank 0's port that is not the job's store. What the store holds is capped (`StoreLimits`):
past its keys or bytes it forgets its oldest entries (those of past quorums' groups), and it
serves a bounded number of connections, fewer still from one source that has not shown the
secret. No torch here: `platoon.elastic.dataplane` makes a `StoreClient` a torch.distributed
store for gloo.

The wire, after the handshake: a frame is a 4-byte big-endian length then its bytes; a request
is an op byte and fields (each a 4-byte length then its bytes), a reply a status byte and
fields. Nothing is encrypted: a process on the path between two nodes can read and alter what
they send (as it can gloo's messages).
"""

import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .._os.logthrottle import ThrottledLog
from ..errors import PlatoonError
from .secret import sign_store_hello, verify

log = logging.getLogger(__name__)

HELLO = b"platoon-store/1\0"  # a client's first bytes, then its challenge
CHALLENGE_BYTES = 16
MAC_BYTES = 32
MAX_KEY_BYTES = 1024
_OK, _TIMEOUT, _ERROR = b"K", b"T", b"E"
_SET, _GET, _WAIT, _CHECK, _DELETE, _COUNT = b"S", b"G", b"W", b"C", b"D", b"N"
_LENGTH = struct.Struct(">I")
_SECONDS = struct.Struct(">d")


class StoreError(PlatoonError, ConnectionError):
    """The data plane's store refused a request, or could not be reached or trusted."""


class KeysNotSet(StoreError):
    """A `get` or `wait` of the data plane's store ended before its keys were set."""


@dataclass(frozen=True)
class StoreLimits:
    """What a node's store holds and serves: at most `max_keys` entries and `max_bytes` of
    keys and values (past either, it forgets its oldest entries), values of at most
    `max_value_bytes` (a larger one is refused); at most `max_connections` connections at
    once, of which at most `handshakes_per_source` from one address before they show the
    job's secret, each within `handshake_timeout_s`; a connection silent `idle_timeout_s`
    between requests is closed (its client opens another when it needs one)."""

    max_keys: int = 4096
    max_bytes: int = 64 << 20
    max_value_bytes: int = 4 << 20
    max_connections: int = 1024
    handshakes_per_source: int = 8
    handshake_timeout_s: float = 5.0
    idle_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if min(self.max_keys, self.max_bytes, self.max_value_bytes, self.max_connections,
               self.handshakes_per_source) < 1 or not (self.handshake_timeout_s > 0
                                                       and self.idle_timeout_s > 0):
            raise ValueError("StoreLimits need counts >= 1 and timeouts > 0, got %r" % (self,))


def _split(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _read_exactly(conn: socket.socket, n: int, deadline: Optional[float] = None
                  ) -> Optional[bytes]:
    """`n` bytes from `conn`, or None when it closes first (a timeout raises: the socket's
    for each read, or the monotonic `deadline` for all of them)."""
    parts, left = [], n
    while left:
        if deadline is not None:
            conn.settimeout(max(deadline - time.monotonic(), 1e-3))
        part = conn.recv(min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _send_frame(conn: socket.socket, head: bytes, fields: Sequence[bytes] = ()) -> None:
    body = head + b"".join(_LENGTH.pack(len(f)) + f for f in fields)
    conn.sendall(_LENGTH.pack(len(body)) + body)


def _parse(body: bytes) -> Tuple[bytes, List[bytes]]:
    """(its first byte, its fields) of a frame's `body`; ValueError when malformed."""
    if not body:
        raise ValueError("an empty frame")
    fields, at = [], 1
    while at < len(body):
        if at + 4 > len(body):
            raise ValueError("a truncated field length")
        (n,) = _LENGTH.unpack_from(body, at)
        at += 4
        if at + n > len(body):
            raise ValueError("a field of %d bytes past the frame's end" % n)
        fields.append(body[at:at + n])
        at += n
    return body[:1], fields


class StoreServer:
    """This node's store, listening at `host` only (`port` 0: a free one), served in threads
    to holders of `secret` within `limits` (default `StoreLimits()`); `address`
    ("HOST:PORT") is what the node gives the lighthouse. Closed with the node (a context
    manager). Raises PlatoonError when it cannot listen there."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, secret: bytes,
                 limits: Optional[StoreLimits] = None) -> None:
        if not isinstance(secret, bytes) or not secret:
            raise ValueError("StoreServer needs the job's secret (bytes, load_secret())")
        self._secret = secret
        self.limits = limits if limits is not None else StoreLimits()
        self._data: Dict[str, bytes] = {}  # in the order written: the oldest go first
        self._held = 0  # bytes of keys and values in _data
        self._cond = threading.Condition()
        self._connections: Set[socket.socket] = set()
        self._handshaking: Dict[str, int] = {}  # source host -> connections not yet trusted
        self._closed = False
        self._warnings = ThrottledLog(log)
        self._warnings_lock = threading.Lock()  # (ThrottledLog is not thread-safe)
        try:
            family, kind, proto, _, where = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM)[0]
            self._listener = socket.socket(family, kind, proto)
            try:
                self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._listener.bind(where)
                self._listener.listen(512)
            except OSError:
                self._listener.close()
                raise
        except OSError as exc:
            raise PlatoonError("cannot host the data plane's store on %s:%d (%s): choose "
                               "another port, or a --host that is an address of this host"
                               % (host, port, exc)) from None
        self.address = "%s:%d" % (host, self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, name="platoon-store",
                                          daemon=True)
        self._acceptor.start()

    def held(self) -> Tuple[int, int]:
        """(entries, bytes of keys and values) the store holds now."""
        with self._cond:
            return len(self._data), self._held

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            source = peer[0]
            with self._cond:
                refused = self._closed or len(self._connections) >= self.limits.max_connections \
                    or self._handshaking.get(source, 0) >= self.limits.handshakes_per_source
                if not refused:
                    self._connections.add(conn)
                    self._handshaking[source] = self._handshaking.get(source, 0) + 1
            if refused:
                conn.close()
                self._warn("busy %s" % source, "data plane store %s: a connection from %s "
                           "refused (%d connections at most, %d from one source before they "
                           "show the job's secret)", self.address, source,
                           self.limits.max_connections, self.limits.handshakes_per_source)
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, source), daemon=True,
                                 name="platoon-store-%s" % source).start()
            except RuntimeError as exc:  # no thread to be had: this connection goes
                self._forget(conn, source)
                self._warn("threads", "data plane store %s: a connection from %s dropped (%s)",
                           self.address, source, exc)

    def _warn(self, kind: str, msg: str, *args: object) -> None:
        with self._warnings_lock:
            self._warnings.warning(kind, msg, *args)

    def _forget(self, conn: socket.socket, source: Optional[str]) -> None:
        """`conn` is closed and no longer counted (nor against `source`, given while it has
        not shown the secret)."""
        with self._cond:
            self._connections.discard(conn)
            if source is not None:
                self._handshaking[source] -= 1
                if not self._handshaking[source]:
                    del self._handshaking[source]
        conn.close()

    def _serve(self, conn: socket.socket, source: str) -> None:
        trusted = False
        try:
            trusted = self._handshake(conn, source)
            if trusted:
                with self._cond:
                    self._handshaking[source] -= 1
                    if not self._handshaking[source]:
                        del self._handshaking[source]
                conn.settimeout(self.limits.idle_timeout_s)
                while self._answer(conn):
                    pass
        except (OSError, ValueError):
            pass  # the client went, was silent too long, or the store closes
        finally:
            self._forget(conn, None if trusted else source)

    def _handshake(self, conn: socket.socket, source: str) -> bool:
        """Whether the client at `conn` shows it holds the secret (having shown it ours), all
        within the handshake's timeout."""
        deadline = time.monotonic() + self.limits.handshake_timeout_s
        hello = b""
        while len(hello) < len(HELLO) + CHALLENGE_BYTES:
            conn.settimeout(max(deadline - time.monotonic(), 1e-3))
            part = conn.recv(len(HELLO) + CHALLENGE_BYTES - len(hello))
            hello += part
            if not part or not (hello.startswith(HELLO) or HELLO.startswith(hello)):
                return False  # a port scan, a probe of reachability, another protocol
        theirs, ours = hello[len(HELLO):], os.urandom(CHALLENGE_BYTES)
        conn.sendall(ours + sign_store_hello(self._secret, "server", theirs, ours))
        proof = _read_exactly(conn, MAC_BYTES, deadline)
        if proof is None or not verify(sign_store_hello(self._secret, "client", theirs, ours),
                                       proof):
            self._warn("refused %s" % source, "data plane store %s: refused a client at %s "
                       "that does not hold the job's secret", self.address, source)
            return False
        conn.sendall(_OK)
        return True

    def _answer(self, conn: socket.socket) -> bool:
        """Read one request from `conn` and answer it; False when the client has gone."""
        head = _read_exactly(conn, 4)
        if head is None:
            return False
        (n,) = _LENGTH.unpack(head)
        if n > self.limits.max_value_bytes + MAX_KEY_BYTES + 64:
            while n:  # read and dropped (only a client with the secret gets here)
                part = conn.recv(min(n, 1 << 20))
                if not part:
                    return False
                n -= len(part)
            _send_frame(conn, _ERROR, [b"a request of %d bytes: over the store's cap of %d "
                                       b"bytes a value" % (len(head) + n,
                                                           self.limits.max_value_bytes)])
            return True
        body = _read_exactly(conn, n)
        if body is None:
            return False
        try:
            op, fields = _parse(body)
            status, out = self._do(op, fields)
        except (ValueError, UnicodeDecodeError, struct.error) as exc:
            status, out = _ERROR, [("a malformed request: %s" % exc).encode()]
        _send_frame(conn, status, out)
        return True

    def _do(self, op: bytes, fields: List[bytes]) -> Tuple[bytes, List[bytes]]:
        if op == _SET and len(fields) == 2:
            return self._set(fields[0].decode(), fields[1])
        if op in (_GET, _WAIT) and len(fields) >= 2:
            (timeout_s,) = _SECONDS.unpack(fields[0])
            keys = [k.decode() for k in fields[1:]]
            found = self._wait_for(keys, timeout_s)
            if not found:
                return _TIMEOUT, []
            with self._cond:
                value = self._data.get(keys[0])
            if op == _WAIT:
                return _OK, []
            return (_OK, [value]) if value is not None else (_TIMEOUT, [])
        if op == _CHECK:
            with self._cond:
                return _OK, [b"1" if all(k.decode() in self._data for k in fields) else b"0"]
        if op == _DELETE and len(fields) == 1:
            with self._cond:
                value = self._data.pop(fields[0].decode(), None)
                if value is not None:
                    self._held -= len(fields[0]) + len(value)
            return _OK, [b"1" if value is not None else b"0"]
        if op == _COUNT:
            with self._cond:
                return _OK, [b"%d" % len(self._data)]
        raise ValueError("op %r with %d field(s)" % (op, len(fields)))

    def _set(self, key: str, value: bytes) -> Tuple[bytes, List[bytes]]:
        size = len(key.encode()) + len(value)
        if len(key.encode()) > MAX_KEY_BYTES or len(value) > self.limits.max_value_bytes \
                or size > self.limits.max_bytes:
            return _ERROR, [b"a key of %d bytes with a value of %d: over the store's cap (keys "
                            b"of %d bytes, values of %d)" % (
                                len(key.encode()), len(value), MAX_KEY_BYTES,
                                self.limits.max_value_bytes)]
        with self._cond:
            old = self._data.pop(key, None)
            if old is not None:
                self._held -= len(key.encode()) + len(old)
            self._data[key] = value
            self._held += size
            forgotten = 0
            while len(self._data) > self.limits.max_keys or self._held > self.limits.max_bytes:
                oldest = next(iter(self._data))
                self._held -= len(oldest.encode()) + len(self._data.pop(oldest))
                forgotten += 1
            self._cond.notify_all()
        if forgotten:
            log.debug("data plane store %s: forgot its %d oldest entries (it holds at most %d, "
                      "%d bytes)", self.address, forgotten, self.limits.max_keys,
                      self.limits.max_bytes)
        return _OK, []

    def _wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        """Whether every one of `keys` is held within `timeout_s` (at most idle_timeout_s)."""
        deadline = time.monotonic() + min(max(timeout_s, 0.0), self.limits.idle_timeout_s)
        with self._cond:
            while not all(k in self._data for k in keys):
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections)
            self._cond.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self._listener.close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes its thread's recv()
            except OSError:
                pass
        self._acceptor.join(5.0)

    def __enter__(self) -> "StoreServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreClient:
    """A connection to the store at `address` ("HOST:PORT"), which must show it holds
    `secret` (as this client does); a request waits at most `timeout_s` (a `get` or `wait`:
    for its keys). Raises StoreError when the store cannot be reached in time, does not hold
    the secret, refuses this client or a request. Opened on the first request, again after
    `close()`."""

    def __init__(self, address: str, secret: bytes, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0 seconds, got %r" % (timeout_s,))
        self.address, self.timeout_s = address, timeout_s
        self._secret = secret
        self._conn: Optional[socket.socket] = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        try:
            conn = socket.create_connection(_split(self.address), timeout=self.timeout_s)
        except OSError as exc:
            raise StoreError("cannot reach the data plane's store at %s within %.3g s (%s)"
                             % (self.address, self.timeout_s, exc)) from None
        try:
            ours = os.urandom(CHALLENGE_BYTES)
            conn.sendall(HELLO + ours)
            answer = _read_exactly(conn, CHALLENGE_BYTES + MAC_BYTES)
            if answer is None or not verify(sign_store_hello(
                    self._secret, "server", ours, answer[:CHALLENGE_BYTES]),
                    answer[CHALLENGE_BYTES:]):
                raise StoreError(
                    "the process at %s does not show this node's secret: it is not the job's "
                    "data plane store (another process on a member's port?), or the nodes "
                    "were given different secret files" % self.address)
            conn.sendall(sign_store_hello(self._secret, "client", ours,
                                          answer[:CHALLENGE_BYTES]))
            if _read_exactly(conn, 1) != _OK:
                raise StoreError("the data plane's store at %s refused this node (it closes?)"
                                 % self.address)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, OSError) and not isinstance(exc, StoreError):
                raise StoreError("the data plane's store at %s did not complete its handshake "
                                 "within %.3g s (%s)" % (self.address, self.timeout_s, exc)
                                 ) from None
            raise
        return conn

    def _request(self, op: bytes, fields: Sequence[bytes], wait_s: float = 0.0
                 ) -> Tuple[bytes, List[bytes]]:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            conn = self._conn
            try:
                conn.settimeout(self.timeout_s + wait_s)
                _send_frame(conn, op, fields)
                head = _read_exactly(conn, 4)
                body = None if head is None else _read_exactly(conn, _LENGTH.unpack(head)[0])
                if body is None:
                    raise ConnectionError("it closed the connection")
                status, out = _parse(body)
            except (OSError, ValueError) as exc:
                self._drop()
                raise StoreError("the data plane's store at %s failed a request (%s)"
                                 % (self.address, exc)) from None
        if status == _ERROR:
            raise StoreError("the data plane's store at %s refused a request: %s"
                             % (self.address, b"".join(out).decode(errors="replace")))
        return status, out

    def set(self, key: str, value: bytes) -> None:
        self._request(_SET, [key.encode(), bytes(value)])

    def get(self, key: str, timeout_s: Optional[float] = None) -> bytes:
        """`key`'s value, once it is set (within `timeout_s`, default the client's; else
        KeysNotSet)."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        status, out = self._request(_GET, [_SECONDS.pack(wait_s), key.encode()], wait_s)
        if status != _OK:
            raise KeysNotSet("the data plane's store at %s: key %r not set within %.3g s"
                             % (self.address, key, wait_s))
        return out[0]

    def wait(self, keys: Sequence[str], timeout_s: Optional[float] = None) -> None:
        """Return once every one of `keys` is set; KeysNotSet after `timeout_s`."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        status, _ = self._request(_WAIT, [_SECONDS.pack(wait_s)]
                                  + [k.encode() for k in keys], wait_s)
        if status != _OK:
            raise KeysNotSet("the data plane's store at %s: keys %s not set within %.3g s"
                             % (self.address, ", ".join(keys), wait_s))

    def check(self, keys: Sequence[str]) -> bool:
        return self._request(_CHECK, [k.encode() for k in keys])[1] == [b"1"]

    def delete_key(self, key: str) -> bool:
        return self._request(_DELETE, [key.encode()])[1] == [b"1"]

    def num_keys(self) -> int:
        return int(self._request(_COUNT, [])[1][0])

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> "StoreClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
