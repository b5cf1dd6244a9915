"""The lighthouse's messages: signed JSON bodies, two frames each (body, signature).

Requests (node to lighthouse): ``{"op": "heartbeat" | "leave", "node": NAME, "address":
"HOST:PORT", "highest_seen": ID, "challenge": HEX, "broken": ID, "incarnation": HEX,
"unreachable": [NAME, ...], "gone": [NAME, ...], "gone_of": ID, "status": STATUS}``
("broken": a quorum whose group broke with no newer quorum coming, 0 for none;
"incarnation": the node process's random id; "unreachable": members of the current quorum
whose data plane the node could not reach when their group failed to form; "gone": members
of quorum "gone_of" whose data plane stopped answering when a round of its group broke, or
while it formed (perhaps dead: the lighthouse counts one out once it is silent too);
"status": what the node says of itself (`node_status`: its state, at the end its final
result), at most `MAX_STATUS` bytes as JSON, sent when it changed; all six optional); op
"status" carries a status only (a node's last word, after it left).

Replies: ``{"challenge": HEX, "quorum": QUORUM | null, "done": bool, "error": TEXT | null,
"taken": bool, "excluded": TEXT | null, "pace_s": S | null}`` ("excluded": why the lighthouse
keeps this node out of the quorums; "pace_s": the lighthouse's pace, `pace_of`: heartbeat no
more often than every S seconds, or at the node's own interval when longer; null or missing,
as in an older lighthouse's replies: at the node's own interval; a node older than the field
ignores it); "done" is false when the request's challenge was stale (a new connection, a
restarted lighthouse): the node sends it again with the reply's challenge (that reply carries
no quorum, nor one whose "taken" is true: another live process holds the node's name, nor one
whose request's "highest_seen" is at or above the quorum's id: the node has it). A reply
refusing a bad signature is not signed (its sender cannot know the key the request used) and
can only refuse.

Sizes: a request's frames are at most `MAX_BODY` bytes, a reply's at most `MAX_REPLY`; each
socket is set so (ZeroMQ's ``maxmsgsize``) and drops the connection of a peer that sends a
larger frame before reading it.
"""

import json
import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union, cast

from .._os.statusfile import shortened
from .secret import Signer, verify

OPS = ("heartbeat", "leave", "status")
MAX_BODY = 4096  # bytes of a request's frame
MAX_REPLY = 16 << 20  # bytes of a reply's frame (a quorum of 10,000 members is about 0.5 MB)
MAX_STATUS = 2048  # bytes of a node's status as JSON (what the lighthouse keeps of a node)
STATUS_KEYS = ("state", "rounds", "kept_own_centre", "final_result", "error")

Message = Dict[str, Any]  # a request or reply, as JSON decodes it
Key = Union[bytes, Signer]  # the job's secret, or a Signer made of it (keys set up once)
_decode = json.JSONDecoder().decode
# A reply's body: its quorum (JSON), challenge (hex), done, taken (JSON booleans), excluded,
# pace (JSON)
_REPLY = '{"quorum": %s, "challenge": "%s", "done": %s, "error": null, "taken": %s, ' \
    '"excluded": %s, "pace_s": %s}'


def _signer(key: Key) -> Signer:
    return key if isinstance(key, Signer) else Signer(key)


def request(key: Key, op: str, node: str, address: str, highest_seen: int,
            challenge: str, broken: int = 0, incarnation: str = "",
            unreachable: Sequence[str] = (), status: Optional[Message] = None,
            gone: Sequence[str] = (), gone_of: int = 0) -> Tuple[bytes, bytes]:
    """The frames (body, signature) of a request; `status` (`node_status`'s) is left out
    when None, `gone` (and `gone_of`, its quorum's id) when empty."""
    fields = {"op": op, "node": node, "address": address, "highest_seen": highest_seen,
              "challenge": challenge, "broken": broken, "incarnation": incarnation,
              "unreachable": list(unreachable)}
    if gone:
        fields["gone"], fields["gone_of"] = list(gone), gone_of
    if status is not None:
        fields["status"] = status
    body = json.dumps(fields).encode()
    return body, _signer(key).request(body)


def read_request(key: Key, body: bytes, mac: bytes) -> Tuple[Optional[Message], str]:
    """(the request, "") when `body` is well formed and signed with `key`, else
    (None, why it is refused). A status over MAX_STATUS bytes is malformed."""
    if len(body) > MAX_BODY:
        return None, "request of %d bytes, over the limit of %d" % (len(body), MAX_BODY)
    if not verify(_signer(key).request(body), mac):
        return None, ("signature does not match the lighthouse's secret: give this node the "
                      "job's secret file (--secret-file or PLATOON_ELASTIC_SECRET_FILE)")
    try:
        data = _decode(body.decode())
        ok = (data["op"] in OPS and isinstance(data["node"], str) and data["node"]
              and isinstance(data["address"], str) and isinstance(data["highest_seen"], int)
              and isinstance(data["challenge"], str)
              and isinstance(data.setdefault("broken", 0), int)
              and isinstance(data.setdefault("incarnation", ""), str)
              and isinstance(data.setdefault("unreachable", []), list)
              and all(isinstance(n, str) for n in data["unreachable"])
              and isinstance(data.setdefault("gone", []), list)
              and all(isinstance(n, str) for n in data["gone"])
              and isinstance(data.setdefault("gone_of", 0), int))
        status = data.get("status")
        if ok and (status is not None or data["op"] == "status"):
            ok = isinstance(status, dict) and len(json.dumps(status)) <= MAX_STATUS
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    return (data, "") if ok else (None, "malformed request")


def node_status(status: Message) -> Message:
    """What a node tells the lighthouse of its `status` (its status file's, `NodeStatus`):
    its state, rounds, whether it kept its own centre, its error (cut) and final result,
    within MAX_STATUS bytes as JSON (the final result's last metrics left out as needed,
    counted in its "metrics_dropped"; past that, its state only)."""
    told = {key: status[key] for key in STATUS_KEYS if key in status}
    if isinstance(told.get("error"), str):
        told["error"] = shortened(told["error"])
    final = told.get("final_result")
    if isinstance(final, dict) and isinstance(final.get("metrics"), dict):
        final = told["final_result"] = dict(final, metrics=dict(final["metrics"]))
        while final["metrics"] and len(json.dumps(told)) > MAX_STATUS:
            final["metrics"].popitem()
            final["metrics_dropped"] = final.get("metrics_dropped", 0) + 1
    if len(json.dumps(told)) > MAX_STATUS:
        told = {"state": shortened(str(told.get("state")))}
    return told


def reply(key: Key, request_mac: bytes, challenge: str, quorum: Optional[Message],
          done: bool, taken: bool = False, excluded: Optional[str] = None,
          quorum_json: Optional[str] = None, pace_s: Optional[float] = None
          ) -> Tuple[bytes, bytes]:
    """The frames (body, signature) of a reply; `quorum_json`, when given, is `quorum`
    already encoded (``json.dumps``: the lighthouse encodes a quorum once, not per reply).
    `challenge`: hex digits. `pace_s`: the lighthouse's pace (None: none asked)."""
    if not (done and not taken):
        quorum, quorum_json = None, None
    if quorum_json is None:
        quorum_json = "null" if quorum is None else json.dumps(quorum)
    body = (_REPLY % (quorum_json, challenge, "true" if done else "false",
                      "true" if taken else "false",
                      "null" if excluded is None else json.dumps(excluded),
                      "null" if pace_s is None else "%.6g" % pace_s)).encode()
    return body, _signer(key).reply(request_mac, body)


def pace_of(answer: Message) -> Optional[float]:
    """The pace a signed reply asks for ("pace_s", seconds), or None when it asks none (an
    older lighthouse's reply, a refusal) or its value is not a finite number >= 0."""
    pace = answer.get("pace_s")
    if isinstance(pace, (int, float)) and not isinstance(pace, bool) and math.isfinite(pace) \
            and pace >= 0:
        return float(pace)
    return None


def refusal(why: str) -> Tuple[bytes, bytes]:
    return json.dumps({"challenge": "", "quorum": None, "done": False,
                       "error": why}).encode(), b""


def read_reply(key: Key, request_mac: bytes, body: bytes, mac: bytes) -> Message:
    """The reply; a refusal when unsigned or when its signature fails (then "error" says
    which)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {"challenge": "", "quorum": None, "done": False, "error": "malformed reply"}
    if not verify(_signer(key).reply(request_mac, body), mac):
        why = data.get("error") if isinstance(data, dict) else None
        return {"challenge": "", "quorum": None, "done": False,
                "error": why or "its reply's signature does not match this node's secret"}
    return cast(Message, data)  # (signed: the lighthouse's, a JSON object)
