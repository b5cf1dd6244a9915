"""CURVE authentication for jobs whose sockets are reachable from other machines.

The launcher (``--curve``) writes one key set per job to a file only its user
can read and hands its path to every process (PLATOON_KEYS_FILE). The
controller's sockets then accept only peers holding the job's client key:
anyone else can neither register, nor send requests, nor pull minibatches.
"""

import ipaddress
import json
import os
import stat

from .errors import PlatoonError

KEY_NAMES = ("server_public", "server_secret", "client_public", "client_secret")


def is_loopback(host):
    """True when `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def generate_keys(path):
    """Write a new key set to `path` (created 0600, never overwritten); returns the path."""
    import zmq  # (its users only: an elastic node reads its secret before it loads pyzmq)
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    keys = dict(zip(KEY_NAMES, (k.decode() for k in (server_public, server_secret,
                                                     client_public, client_secret))))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keys, f)
    return path


def read_private_file(path: str, what: str = "keys",
                      source: str = "the keys your launcher made") -> bytes:
    """The bytes of `path`, a file of secrets (`what` names it in errors, `source` where a
    good one comes from); raises PlatoonError if it is unreadable, a link, another user's, or
    others can read it."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:  # never via a link
            info = os.fstat(f.fileno())
            data = f.read()
    except OSError as exc:
        raise PlatoonError("cannot read the job's %s from %s (%s)" % (what, path, exc)) from None
    if info.st_uid != os.getuid():
        raise PlatoonError("%s file %s belongs to uid %d, not to you (uid %d): use %s"
                           % (what, path, info.st_uid, os.getuid(), source))
    mode = info.st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PlatoonError("%s file %s is readable by other users; run chmod 600 on it"
                           % (what, path))
    return data


def load_keys(path):
    """The key set in `path`; raises PlatoonError if it is unreadable, a link, another user's,
    or others can read it."""
    text = read_private_file(path)
    try:
        keys = json.loads(text)
    except ValueError as exc:
        raise PlatoonError("cannot read the job's keys from %s (%s)" % (path, exc)) from None
    if not isinstance(keys, dict) or any(not isinstance(keys.get(k), str) for k in KEY_NAMES):
        raise PlatoonError("keys file %s lacks one of %s" % (path, ", ".join(KEY_NAMES)))
    return {k: keys[k].encode() for k in KEY_NAMES}


def make_server(sock, keys):
    sock.curve_secretkey = keys["server_secret"]
    sock.curve_publickey = keys["server_public"]
    sock.curve_server = True


def make_client(sock, keys):
    sock.curve_serverkey = keys["server_public"]
    sock.curve_publickey = keys["client_public"]
    sock.curve_secretkey = keys["client_secret"]


class _OnlyClientKey:
    def __init__(self, client_public):
        self.client_public = client_public

    def callback(self, domain, key):
        return key == self.client_public


def start_authenticator(context, keys):
    """Admit only the job's client key on `context`'s CURVE servers; returns the
    authenticator (call its `stop()` before terminating the context)."""
    from zmq.auth.thread import ThreadAuthenticator  # loads asyncio: servers only, not workers
    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve_callback(domain="*",
                                  credentials_provider=_OnlyClientKey(keys["client_public"]))
    return auth
