"""Control and data messages: encode, decode, validate. No sockets here.

A control request is one UTF-8 JSON object
``{"worker_id": int | null, "req": str | object, "req_info": <any JSON>, "seq": int}``
(``req`` is a name, or any other JSON value but null and "", as the original
Platoon sent; ``seq`` is optional; when present the reply echoes it so a client
can drop late replies to requests it gave up on). A reply is
``{"seq": int | null, "ok": true, "result": <any JSON>}`` or
``{"seq": int | null, "ok": false, "error": {"type", "message", "traceback"}}``.

A minibatch is a multipart message: one JSON header frame
``[{"dtype": str, "shape": [int, ...], "order": "C" | "F"}, ...]`` followed by
one raw frame per array. A worker asks for minibatches with one frame
``{"worker_id": int, "token": str, "done": int, "credit": int, "bye": bool}``: its
registration token, how many minibatches it has finished (acknowledging them),
how many more it asks for, and, with bye, that it leaves the channel. A refused
request is answered with one frame ``{"error": str}``.
"""

import json
import math
import warnings

import numpy as np

from .errors import ProtocolError, RemoteError

RESERVED_PREFIX = "platoon-"
REGISTER = "platoon-register"
INIT_PARAMS = "platoon-init-params"
PARAMS_READY = "platoon-params-ready"
BARRIER = "platoon-barrier"
BARRIER_CANCEL = "platoon-barrier-cancel"
DONE = "platoon-done"
REPORT = "platoon-report"
STOP = "platoon-stop"  # {"request": bool, "reason": str | null}: ask for, or read, the stop
# Collectives and shared state (platoon.collectives)
ALLREDUCE_SETUP = "platoon-allreduce-setup"
ALLREDUCE = "platoon-allreduce"
ALLREDUCE_CANCEL = "platoon-allreduce-cancel"
INIT_STATE = "platoon-init-state"

DEFAULT_MAX_REQUEST_BYTES = 1 << 20

# One compact encoder, made once: json.dumps builds a new one per call when given options.
_encode_json = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode


class Request:
    """A decoded, validated control request."""

    __slots__ = ("worker_id", "req", "req_info", "seq")

    def __init__(self, worker_id, req, req_info=None, seq=None):
        self.worker_id = worker_id
        self.req = req
        self.req_info = req_info
        self.seq = seq

    @property
    def is_reserved(self):
        return isinstance(self.req, str) and self.req.startswith(RESERVED_PREFIX)


def encode_request(worker_id, req, req_info=None, seq=None):
    """Serialise a control request; raises ProtocolError if `req` or `req_info` is not
    JSON-serialisable, or `req` is None or empty."""
    if req is None or req == "":
        raise ProtocolError("a request must be a non-empty string (or another JSON value), "
                            "got %r" % (req,))
    try:
        return _encode_json(
            {"worker_id": worker_id, "req": req, "req_info": req_info, "seq": seq}).encode()
    except (TypeError, ValueError) as exc:
        raise ProtocolError(
            "request %.60r or its req_info is not JSON-serialisable (%s); send only dicts, lists, "
            "strings, numbers, booleans and None (convert numpy scalars with float()/int())"
            % (req, exc)) from None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _loads(payload, what):
    try:
        return json.loads(bytes(payload).decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError("%s is not UTF-8 text" % what) from None
    except RecursionError:
        raise ProtocolError("%s is JSON nested too deeply" % what) from None
    except ValueError as exc:
        raise ProtocolError("%s is not valid JSON (%s)" % (what, exc)) from None


def decode_request(payload, max_bytes=DEFAULT_MAX_REQUEST_BYTES):
    """Parse and validate one request frame; raises ProtocolError saying what is wrong."""
    if len(payload) > max_bytes:
        raise ProtocolError(
            "request of %d bytes exceeds the controller's limit of %d bytes; send large data "
            "through shared parameters or the minibatch channel" % (len(payload), max_bytes))
    msg = _loads(payload, "request")
    if not isinstance(msg, dict):
        raise ProtocolError("request must be a JSON object, got %s" % type(msg).__name__)
    seq = msg.get("seq")
    if seq is not None and not _is_int(seq):
        raise ProtocolError("request field 'seq' must be an integer or null")
    req = msg.get("req")
    if req is None or req == "":
        raise ProtocolError("request field 'req' must be a non-empty string (or another JSON "
                            "value)")
    worker_id = msg.get("worker_id")
    if worker_id is not None and not _is_int(worker_id):
        raise ProtocolError("request field 'worker_id' must be an integer or null")
    return Request(worker_id, req, msg.get("req_info"), seq)


def peek_seq(payload):
    """Best-effort `seq` of a request that failed validation, so its error reply can be matched."""
    try:
        seq = json.loads(bytes(payload).decode("utf-8")).get("seq")
    except Exception:  # any garbage: there is simply no seq to echo
        return None
    return seq if _is_int(seq) else None


def encode_reply(seq, result):
    """Serialise a successful reply; raises TypeError/ValueError if `result` is not JSON."""
    return _encode_json({"seq": seq, "ok": True, "result": result}).encode()


def encode_error(seq, exc_type, message, traceback=""):
    """Serialise an error reply."""
    return json.dumps({"seq": seq, "ok": False, "error": {
        "type": exc_type, "message": message, "traceback": traceback}},
        separators=(",", ":")).encode()


def decode_reply(payload):
    """``(seq, result)``, where result is a RemoteError for an error reply.

    Raises ProtocolError for garbage.
    """
    msg = _loads(payload, "reply")
    if not isinstance(msg, dict) or "ok" not in msg:
        raise ProtocolError("reply is not a platoon reply object")
    seq = msg.get("seq")
    if msg["ok"]:
        return seq, msg.get("result")
    err = msg.get("error") or {}
    return seq, RemoteError(str(err.get("message", "unknown error")),
                            str(err.get("type", "")), str(err.get("traceback", "")))


# --- parameter layouts -------------------------------------------------------

def layout_of(arrays):
    """``[{"dtype": str, "shape": [int]}]`` describing a list of numpy arrays."""
    return [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]


def validate_layout(layout):
    """Check a layout received over the wire; returns it normalised or raises ProtocolError."""
    if not isinstance(layout, list) or not layout:
        raise ProtocolError("parameter layout must be a non-empty list")
    clean = []
    for i, entry in enumerate(layout):
        if not isinstance(entry, dict):
            raise ProtocolError("parameter %d: layout entry must be an object" % i)
        dtype = parse_dtype(entry.get("dtype"), "parameter %d" % i)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
            raise ProtocolError("parameter %d: shape must be a list of non-negative integers" % i)
        clean.append({"dtype": dtype.str, "shape": shape})
    return clean


def describe_mismatch(mine, centre):
    """Say how layout `mine` differs from `centre`, or return None if they match."""
    if len(mine) != len(centre):
        return ("this worker registers %d parameters but the job's centre holds %d"
                % (len(mine), len(centre)))
    for i, (a, b) in enumerate(zip(mine, centre)):
        if a["dtype"] != b["dtype"] or list(a["shape"]) != list(b["shape"]):
            return ("parameter %d is %s of shape %s here but %s of shape %s in the job's centre"
                    % (i, np.dtype(a["dtype"]).name, tuple(a["shape"]),
                       np.dtype(b["dtype"]).name, tuple(b["shape"])))
    return None


_DTYPES = {}  # dtype strings already parsed: minibatch headers repeat the same few


def parse_dtype(text, where):
    """A plain numeric numpy dtype from its string form; raises ProtocolError otherwise."""
    dtype = _DTYPES.get(text) if isinstance(text, str) else None
    if dtype is not None:
        return dtype
    if not isinstance(text, str) or len(text) > 16 or not text.isascii():
        raise ProtocolError("%s: dtype must be a short ASCII string such as '<f4'" % where)
    try:
        with warnings.catch_warnings():  # deprecated aliases ('a') warn once, then are cached
            warnings.simplefilter("ignore", DeprecationWarning)
            dtype = np.dtype(text)
    except Exception:  # numpy raises TypeError, ValueError, SyntaxError... for odd strings
        raise ProtocolError("%s: unknown dtype %r" % (where, text)) from None
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError("%s: dtype %r is not a plain numeric type" % (where, text))
    _DTYPES[text] = dtype
    return dtype


# --- minibatches -------------------------------------------------------------

_MAX_DIMS = 32  # numpy's limit (64 in numpy 2) is beyond any minibatch; a header may not exceed it
_MAX_ARRAY_BYTES = 1 << 62  # beyond it numpy's size arithmetic overflows
_HEADER_CACHE_SIZE = 64  # minibatch headers repeat: parse or encode each distinct one once
_encoded_headers = {}
_parsed_headers = {}


def _cached(cache, key, make):
    value = cache.get(key)
    if value is None:
        value = make()
        if len(cache) >= _HEADER_CACHE_SIZE:
            cache.clear()
        cache[key] = value
    return value


def encode_minibatch(arrays):
    """Frames for a minibatch: a JSON header, then each array's bytes (no copy if contiguous)."""
    specs, frames = [], []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        if a.dtype.kind not in "biufc" or a.dtype.fields is not None:
            raise ProtocolError("minibatch array %d has dtype %s; only plain numeric arrays can "
                                "be sent" % (i, a.dtype))
        if a.flags.c_contiguous:
            order, data = "C", a
        elif a.flags.f_contiguous:
            order, data = "F", a.T
        else:
            order, data = "C", np.ascontiguousarray(a)
        specs.append((a.dtype.str, a.shape, order))
        frames.append(memoryview(data.reshape(-1)).cast("B") if data.size else b"")
    specs = tuple(specs)
    header = _cached(_encoded_headers, specs, lambda: _encode_json(
        [{"dtype": d, "shape": list(shape), "order": o} for d, shape, o in specs]).encode())
    return [header] + frames


def _parse_minibatch_header(payload):
    """[(dtype, shape, order, nbytes)] from a header frame; raises ProtocolError."""
    header = _loads(payload, "minibatch header")
    if not isinstance(header, list):
        raise ProtocolError("minibatch header must be a JSON list")
    specs = []
    for i, spec in enumerate(header):
        if not isinstance(spec, dict):
            raise ProtocolError("minibatch array %d: header entry must be an object" % i)
        dtype = parse_dtype(spec.get("dtype"), "minibatch array %d" % i)
        shape = spec.get("shape")
        if not isinstance(shape, list) or len(shape) > _MAX_DIMS \
                or not all(_is_int(n) and 0 <= n < _MAX_ARRAY_BYTES for n in shape):
            raise ProtocolError("minibatch array %d: shape must be a list of at most %d "
                                "non-negative integers" % (i, _MAX_DIMS))
        order = spec.get("order", "C")
        if not isinstance(order, str) or order not in ("C", "F"):
            raise ProtocolError("minibatch array %d: order must be 'C' or 'F'" % i)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > _MAX_ARRAY_BYTES:
            raise ProtocolError("minibatch array %d: shape %s of %s would need %d bytes"
                                % (i, shape, dtype.name, nbytes))
        specs.append((dtype, tuple(shape), order, nbytes))
    return specs


def decode_minibatch(frames):
    """Arrays from minibatch frames, as read-only views of the frames' buffers.

    Raises ProtocolError naming the first inconsistency.
    """
    if not frames:
        raise ProtocolError("empty minibatch message")
    first = frames[0]
    payload = first.bytes if hasattr(first, "bytes") else bytes(first)
    specs = _cached(_parsed_headers, payload, lambda: _parse_minibatch_header(payload))
    if len(specs) != len(frames) - 1:
        raise ProtocolError("minibatch header describes %d arrays but %d data frames arrived"
                            % (len(specs), len(frames) - 1))
    arrays = []
    for i, ((dtype, shape, order, expected), frame) in enumerate(zip(specs, frames[1:])):
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if len(buf) != expected:
            raise ProtocolError("minibatch array %d: %d bytes arrived but dtype %s and shape %s "
                                "need %d" % (i, len(buf), dtype.name, shape, expected))
        flat = np.frombuffer(buf, dtype=dtype) if expected else np.empty(0, dtype)
        try:
            array = flat.reshape(shape, order=order)
        except (ValueError, OverflowError) as exc:  # an empty array with a huge dimension
            raise ProtocolError("minibatch array %d: numpy cannot make shape %s: %s"
                                % (i, shape, exc)) from None
        array.flags.writeable = False  # a view of a received (writable) message: read-only
        arrays.append(array)
    return arrays


def encode_mb_request(worker_id, token, done, credit, bye=False):
    """A worker's request frame on the data channel (see the module docstring)."""
    return _encode_json({"worker_id": worker_id, "token": token, "done": done,
                         "credit": credit, "bye": bye}).encode()


def decode_mb_request(payload):
    """``(worker_id, token, done, credit, bye)`` from a request frame; raises ProtocolError."""
    msg = _loads(payload, "minibatch request")
    if not isinstance(msg, dict):
        raise ProtocolError("minibatch request must be a JSON object")
    wid, token, done, credit = (msg.get(k) for k in ("worker_id", "token", "done", "credit"))
    bye = msg.get("bye", False)
    if not (_is_int(wid) and isinstance(token, str) and _is_int(done) and done >= 0
            and _is_int(credit) and 0 <= credit <= 1 << 20 and isinstance(bye, bool)):
        raise ProtocolError("minibatch request needs worker_id, token, done >= 0, credit "
                            "(0 to 2**20) and bye (a boolean); platoon.Worker.recv_mb sends them")
    return wid, token, done, credit, bye


def encode_mb_refusal(message):
    """The controller's answer to a minibatch request it refuses."""
    return _encode_json({"error": message}).encode()


def mb_refusal(frames):
    """The message of a refusal (see `encode_mb_refusal`), or None for anything else."""
    if len(frames) != 1:
        return None
    payload = frames[0].bytes if hasattr(frames[0], "bytes") else bytes(frames[0])
    if not payload.startswith(b'{"error":'):
        return None
    try:
        return str(json.loads(payload.decode("utf-8"))["error"])
    except (ValueError, KeyError, TypeError):
        return None
