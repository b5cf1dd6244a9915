"""The lighthouse's messages: signed JSON bodies, two frames each (body, signature).

Requests (node to lighthouse): ``{"op": "heartbeat" | "leave", "node": NAME,
"address": "HOST:PORT", "highest_seen": ID, "challenge": HEX, "broken": ID,
"incarnation": HEX, "unreachable": [NAME, ...]}`` ("broken": a quorum whose group broke
with no newer quorum coming, 0 for none; "incarnation": the node process's random id;
"unreachable": members of the current quorum whose data plane the node could not reach; all
three optional). Replies: ``{"challenge": HEX, "quorum": QUORUM | null, "done": bool, "error":
TEXT | null, "taken": bool, "excluded": TEXT | null}`` ("excluded": why the lighthouse keeps
this node out of the quorums); "done" is false when the request's challenge was stale (a new
connection, a restarted lighthouse): the node sends it again with the reply's challenge (that reply
carries no quorum, nor one whose "taken" is true: another live process holds the node's
name, nor one whose request's "highest_seen" is at or above the quorum's id: the node has it).
A reply refusing a bad signature is not signed (its sender cannot know the key the request
used) and can only refuse.

Sizes: a request's frames are at most `MAX_BODY` bytes, a reply's at most `MAX_REPLY`; each
socket is set so (ZeroMQ's ``maxmsgsize``) and drops the connection of a peer that sends a
larger frame before reading it.
"""

import json
from typing import Any, Dict, Optional, Sequence, Tuple, cast

from .secret import sign_reply, sign_request, verify

OPS = ("heartbeat", "leave")
MAX_BODY = 4096  # bytes of a request's frame
MAX_REPLY = 16 << 20  # bytes of a reply's frame (a quorum of 10,000 members is about 0.5 MB)

Message = Dict[str, Any]  # a request or reply, as JSON decodes it


def request(secret: bytes, op: str, node: str, address: str, highest_seen: int,
            challenge: str, broken: int = 0, incarnation: str = "",
            unreachable: Sequence[str] = ()) -> Tuple[bytes, bytes]:
    """The frames (body, signature) of a request."""
    body = json.dumps({"op": op, "node": node, "address": address,
                       "highest_seen": highest_seen, "challenge": challenge,
                       "broken": broken, "incarnation": incarnation,
                       "unreachable": list(unreachable)}).encode()
    return body, sign_request(secret, body)


def read_request(secret: bytes, body: bytes, mac: bytes) -> Tuple[Optional[Message], str]:
    """(the request, "") when `body` is well formed and signed with `secret`, else
    (None, why it is refused)."""
    if len(body) > MAX_BODY:
        return None, "request of %d bytes, over the limit of %d" % (len(body), MAX_BODY)
    if not verify(sign_request(secret, body), mac):
        return None, ("signature does not match the lighthouse's secret: give this node the "
                      "job's secret file (--secret-file or PLATOON_ELASTIC_SECRET_FILE)")
    try:
        data = json.loads(body)
        ok = (data["op"] in OPS and isinstance(data["node"], str) and data["node"]
              and isinstance(data["address"], str) and isinstance(data["highest_seen"], int)
              and isinstance(data["challenge"], str)
              and isinstance(data.setdefault("broken", 0), int)
              and isinstance(data.setdefault("incarnation", ""), str)
              and isinstance(data.setdefault("unreachable", []), list)
              and all(isinstance(n, str) for n in data["unreachable"]))
    except (ValueError, KeyError, TypeError):
        ok = False
    return (data, "") if ok else (None, "malformed request")


def reply(secret: bytes, request_mac: bytes, challenge: str, quorum: Optional[Message],
          done: bool, taken: bool = False, excluded: Optional[str] = None,
          quorum_json: Optional[str] = None) -> Tuple[bytes, bytes]:
    """The frames (body, signature) of a reply; `quorum_json`, when given, is `quorum`
    already encoded (``json.dumps``: the lighthouse encodes a quorum once, not per reply)."""
    rest = json.dumps({"challenge": challenge, "done": done, "error": None, "taken": taken,
                       "excluded": excluded})
    if not (done and not taken):
        quorum, quorum_json = None, None
    if quorum_json is None:
        quorum_json = json.dumps(quorum)
    body = ('{"quorum": %s, %s' % (quorum_json, rest[1:])).encode()
    return body, sign_reply(secret, request_mac, body)


def refusal(why: str) -> Tuple[bytes, bytes]:
    return json.dumps({"challenge": "", "quorum": None, "done": False,
                       "error": why}).encode(), b""


def read_reply(secret: bytes, request_mac: bytes, body: bytes, mac: bytes) -> Message:
    """The reply; a refusal when unsigned or when its signature fails (then "error" says
    which)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {"challenge": "", "quorum": None, "done": False, "error": "malformed reply"}
    if not verify(sign_reply(secret, request_mac, body), mac):
        why = data.get("error") if isinstance(data, dict) else None
        return {"challenge": "", "quorum": None, "done": False,
                "error": why or "its reply's signature does not match this node's secret"}
    return cast(Message, data)  # (signed: the lighthouse's, a JSON object)
