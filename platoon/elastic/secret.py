"""The job's secret and the signatures that prove a message came from one of its nodes.

Every node and the lighthouse read one secret (at least 16 characters) from a file only its user
can read, named by ``--secret-file`` or PLATOON_ELASTIC_SECRET_FILE (the same checks as
``--curve``'s keys file: no link, the user's own, mode 0600). Each request carries an
HMAC-SHA256 over its body, and the body carries the challenge the lighthouse sent in its last
reply on that connection, so a captured request cannot be replayed; each reply is signed
over its body and the request's signature, so a reply cannot be forged or replayed either.
On the data plane, each member signs its round header over the quorum's id and nonce and its
rank (`sign_header`), so a process without the secret cannot pass for a member, and each
connection to a node's store starts with a challenge each way (`sign_store_hello`), so only
the job's nodes reach its keys.
"""

import hashlib
import hmac
from typing import Optional

from .._os.environment import JobEnvironment
from .._os.jobsecret import generate_secret  # noqa: F401 (made where the launcher reaches it)
from ..errors import PlatoonError
from ..security import read_private_file

SECRET_ENV = "PLATOON_ELASTIC_SECRET_FILE"  # JobEnvironment.elastic_secret_file
MIN_SECRET_CHARS = 16  # of the file's text (--new-secret writes 64 hex digits: 32 bytes)
_REQUEST = b"platoon-elastic/1 request\0"
_REPLY = b"platoon-elastic/1 reply\0"
_HEADER = b"platoon-elastic/1 header\0"
_STORE = b"platoon-elastic/1 store "
_MOVE = b"platoon-elastic/1 move\0"


def load_secret(path: Optional[str] = None) -> bytes:
    """The job's secret, from `path` or else the file named by PLATOON_ELASTIC_SECRET_FILE.
    Raises PlatoonError when neither is given, or the file is unsafe or too short."""
    path = path or JobEnvironment.read("elastic_secret_file").elastic_secret_file
    if not path:
        raise PlatoonError("an elastic job needs its secret: give --secret-file PATH or set %s "
                           "(make one with python -m platoon.elastic.lighthouse --new-secret "
                           "PATH and copy it to every node)" % SECRET_ENV)
    secret = read_private_file(path, "secret", source="a copy of the job's secret of your "
                               "own (chmod 600), or make one with python -m "
                               "platoon.elastic.lighthouse --new-secret PATH").strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise PlatoonError("secret file %s holds %d characters; use at least %d, random (python "
                           "-m platoon.elastic.lighthouse --new-secret PATH writes 64 random "
                           "hex digits)" % (path, len(secret), MIN_SECRET_CHARS))
    return secret


class Signer:
    """The signatures of a lighthouse request (`request`: HMAC-SHA256 of the secret over a
    request tag and its body) and of its reply (`reply`: over a reply tag, the request's
    signature and the reply's body), under one secret, its HMAC keys set up once rather than
    per message (the lighthouse signs and checks two a heartbeat)."""

    def __init__(self, secret: bytes) -> None:
        self._request = hmac.new(secret, _REQUEST, hashlib.sha256)
        self._reply = hmac.new(secret, _REPLY, hashlib.sha256)

    def request(self, body: bytes) -> bytes:
        mac = self._request.copy()
        mac.update(body)
        return mac.digest()

    def reply(self, request_mac: bytes, body: bytes) -> bytes:
        mac = self._reply.copy()
        mac.update(request_mac)
        mac.update(body)
        return mac.digest()


def sign_header(secret: bytes, quorum_id: int, nonce: str, rank: int, header: bytes) -> bytes:
    """The signature of rank `rank`'s round `header` in quorum `quorum_id` (nonce `nonce`)."""
    return hmac.new(secret, _HEADER + b"%d\0%s\0%d\0" % (quorum_id, nonce.encode(), rank)
                    + header, hashlib.sha256).digest()


def sign_move(secret: bytes, quorum_id: int, nonce: str, seq: int, sender: int, receiver: int,
              message: bytes) -> bytes:
    """The signature of rank `sender`'s `message` to rank `receiver` (-1: to every member) in
    the `seq`-th mean of quorum `quorum_id`'s group (nonce `nonce`): a message altered on its
    way, replayed from another mean or another quorum, or sent by a process without the secret
    fails its check."""
    return hmac.new(secret, _MOVE + b"%d\0%s\0%d\0%d\0%d\0" % (
        quorum_id, nonce.encode(), seq, sender, receiver) + message, hashlib.sha256).digest()


def sign_store_hello(secret: bytes, side: str, client_challenge: bytes,
                     server_challenge: bytes) -> bytes:
    """The proof that `side` ("server" or "client") of a connection to a node's store holds
    the job's secret, over both ends' random challenges (a side's proof never passes for the
    other's)."""
    return hmac.new(secret, _STORE + side.encode() + b"\0" + client_challenge
                    + server_challenge, hashlib.sha256).digest()


def verify(expected: bytes, mac: bytes) -> bool:
    """Whether `mac` is `expected` (compared in constant time)."""
    return hmac.compare_digest(expected, mac)
