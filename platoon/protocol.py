"""Control and data messages: encode, decode, validate. No sockets here.

A control request is one UTF-8 JSON object
``{"worker_id": int | null, "req": str | object, "req_info": <any JSON>, "seq": int}``
(``req`` is a name, or any other JSON value but null and "", as the original
Platoon sent; ``seq`` is optional; when present the reply echoes it so a client
can drop late replies to requests it gave up on). A reply is
``{"seq": int | null, "ok": true, "result": <any JSON>}`` or
``{"seq": int | null, "ok": false, "error": {"type", "message", "traceback"}}``.

A minibatch is one JSON header ``[{"dtype": str, "shape": [int, ...], "order":
"C" | "F"}, ...]`` and each array's bytes. Small ones (and any sent with copy)
travel packed in one frame: ``b"PMB\\x01"``, the header's length (uint32, little
endian), the header, then each array, every part starting at a multiple of 8
bytes (zero padding). Larger ones are a multipart message: the header frame, then
one frame per array. A worker asks for minibatches with one binary frame: ``b"PMR\\x03"``,
bye (1 byte), 3 zero bytes, its worker id (int64), the epoch it counts in (uint64; 0
before the first), how many minibatches of that epoch it has finished (uint64:
acknowledging them all), how many beyond those it wants sent (its window, uint32: a
repeated request asks for nothing new), how many bytes of minibatches it lets be
unacknowledged (uint64; 0: no byte bound; at least one minibatch is sent whatever its
size), little endian, then its registration token (ASCII); with bye it leaves the
channel. The controller's first message on each connection a worker asks on opens an
epoch: one frame, ``b"PME\\x01"`` and the epoch (uint64, little endian, never 0); the
minibatches after it are that epoch's, counted from 1. A connection whose request
is refused is answered once with one frame ``{"error": str}``; its later frames are dropped.
"""

import json
import math
import struct
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

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
# The job's one final result (Worker.final_evaluation): "trained" {} -> {"evaluate": bool};
# "final-result" {"metrics": {...}} -> {"stored": bool}
TRAINED = "platoon-trained"
FINAL_RESULT = "platoon-final-result"
# Collectives and shared state (platoon.collectives)
ALLREDUCE_SETUP = "platoon-allreduce-setup"
ALLREDUCE = "platoon-allreduce"
ALLREDUCE_CANCEL = "platoon-allreduce-cancel"
INIT_STATE = "platoon-init-state"

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_MB_WINDOW_BYTES = 16 << 20  # a worker's unacknowledged minibatches, by default

# One compact encoder, made once: json.dumps builds a new one per call when given options.
# A frame as it arrives or leaves: bytes, a memoryview or a zmq.Frame (anything holding the buffer
# protocol; zmq is not imported here).
Frame = Any
# A parameter layout on the wire: [{"dtype": "<f4", "shape": [3, 4]}, ...]
Layout = List[Dict[str, Any]]
# (dtype, shape, order, nbytes) of an array of a minibatch header; order is "C" or "F"
_Spec = Tuple[np.dtype, Tuple[int, ...], str, int]
_HeaderKey = Tuple[_Spec, ...]
_T = TypeVar("_T")

_json_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=True)
try:  # and its C core, made once too: JSONEncoder.encode builds one per call (1.5 us)
    _c_encode = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _json_encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",",
        False, False, True)
except (AttributeError, TypeError):  # no C accelerator: the plain encoder
    _c_encode = None


def _encode_json(value: Any) -> str:
    """Compact JSON text of `value`, as `_json_encoder.encode` gives; raises TypeError or
    ValueError for what JSON cannot hold."""
    if _c_encode is not None:
        try:
            return "".join(_c_encode(value, 0))
        except RecursionError:  # a cycle (this core does not look for them) or deep nesting
            pass
    return _json_encoder.encode(value)  # says which: ValueError or RecursionError


class Request:
    """A decoded, validated control request."""

    __slots__ = ("worker_id", "req", "req_info", "seq")

    def __init__(self, worker_id: Optional[int], req: Any, req_info: Any = None,
                 seq: Optional[int] = None) -> None:
        self.worker_id = worker_id
        self.req = req
        self.req_info = req_info
        self.seq = seq

    @property
    def is_reserved(self) -> bool:
        return isinstance(self.req, str) and self.req.startswith(RESERVED_PREFIX)


def encode_request(worker_id: Optional[int], req: Any, req_info: Any = None,
                   seq: Optional[int] = None) -> bytes:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# json's C scanner: json.loads without its wrappers (two regex matches, type checks).
_scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(payload: Frame, what: str) -> Any:
    try:
        text = (payload if type(payload) is bytes else bytes(payload)).decode("utf-8")
        try:
            value, end = _scan_json(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):
            pass
        return json.loads(text)  # whitespace around it, or not JSON: json's own verdict
    except UnicodeDecodeError:
        raise ProtocolError("%s is not UTF-8 text" % what) from None
    except RecursionError:
        raise ProtocolError("%s is JSON nested too deeply" % what) from None
    except ValueError as exc:
        raise ProtocolError("%s is not valid JSON (%s)" % (what, exc)) from None


def decode_request(payload: Frame, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Request:
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


def peek_seq(payload: Frame) -> Optional[int]:
    """Best-effort `seq` of a request that failed validation, so its error reply can be matched."""
    try:
        seq = json.loads(bytes(payload).decode("utf-8")).get("seq")
    except Exception:  # any garbage: there is simply no seq to echo
        return None
    return seq if _is_int(seq) else None


def encode_reply(seq: Optional[int], result: Any) -> bytes:
    """Serialise a successful reply; raises TypeError/ValueError if `result` is not JSON."""
    return _encode_json({"seq": seq, "ok": True, "result": result}).encode()


def encode_error(seq: Optional[int], exc_type: str, message: str, traceback: str = "") -> bytes:
    """Serialise an error reply."""
    return json.dumps({"seq": seq, "ok": False, "error": {
        "type": exc_type, "message": message, "traceback": traceback}},
        separators=(",", ":")).encode()


def decode_reply(payload: Frame) -> Tuple[Optional[int], Any]:
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

def layout_of(arrays: Sequence[np.ndarray]) -> Layout:
    """``[{"dtype": str, "shape": [int]}]`` describing a list of numpy arrays."""
    return [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]


def validate_layout(layout: Any) -> Layout:
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


def check_names(names: Any, count: int) -> List[str]:
    """`names` of `count` parameters as a list: distinct non-empty strings, one each.
    Raises TypeError or ValueError saying what is wrong."""
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)):
        raise TypeError("parameter names must be a list of strings, got %r" % (names,))
    if len(names) != count:
        raise ValueError("parameter names: one for each of the %d parameters is needed, "
                         "got %d" % (count, len(names)))
    seen = set()
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError("parameter names: name %d is %r, not a non-empty string"
                            % (i, name))
        if name in seen:
            raise ValueError("parameter names: %r is given twice; each parameter needs its "
                             "own name" % name)
        seen.add(name)
    return list(names)


def describe_name_mismatch(mine: Optional[Sequence[str]],
                           centre: Optional[Sequence[str]]) -> Optional[str]:
    """Say how names `mine` differ from the centre's (`centre`), or return None if they
    match, either side has none, or they differ in number (the layouts then differ too)."""
    if mine is None or centre is None or len(mine) != len(centre):
        return None
    for i, (a, b) in enumerate(zip(mine, centre)):
        if a != b:
            return "parameter %d is named %r here but %r in the job's centre" % (i, a, b)
    return None


def describe_mismatch(mine: Layout, centre: Layout) -> Optional[str]:
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


# dtype strings already parsed: minibatch headers repeat the same few
_DTYPES: Dict[str, np.dtype] = {}


def parse_dtype(text: Any, where: str) -> np.dtype:
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
_encoded_headers: Dict[Any, Tuple[bytes, bytes, List[bytes]]] = {}
_parsed_headers: Dict[bytes, Any] = {}
_parsed_packed: Dict[bytes, Any] = {}
# (type, dtype, shape, strides) of each array of a C-contiguous minibatch -> its header,
# packed prefix, paddings and size: what encode_minibatch checked once for that layout
_contiguous_layouts: Dict[Any, Tuple[bytes, bytes, List[bytes], int]] = {}
# the same key -> packed_slots' answer
_packed_slots: Dict[Any, Tuple[bytes, int, List[Tuple[int, int]]]] = {}


def _cached(cache: Dict[Any, _T], key: Any, make: Callable[[], _T]) -> _T:
    value = cache.get(key)
    if value is None:
        value = make()
        if len(cache) >= _HEADER_CACHE_SIZE:
            cache.clear()
        cache[key] = value
    return value


PACK_MAX_BYTES = 1 << 16  # smaller minibatches travel packed in one frame (see encode_minibatch)
_PACKED = b"PMB\x01"  # a packed minibatch frame starts with this (a JSON header starts with "[")
_PACKED_PREFIX = struct.Struct("<4sI")  # _PACKED, the JSON header's length
_ALIGN = 8  # packed arrays start at multiples of 8 bytes: aligned for every plain numeric dtype
_PADDING = [bytes(n) for n in range(_ALIGN)]


def _padding(nbytes: int) -> int:
    return -nbytes % _ALIGN


def _encode_header(key: _HeaderKey) -> Tuple[bytes, bytes, List[bytes]]:
    """(JSON header, prefix of a packed frame, padding after each array) for a header key."""
    header = _encode_json([{"dtype": dtype.str, "shape": list(shape), "order": order}
                           for dtype, shape, order, _ in key]).encode()
    prefix = _PACKED_PREFIX.pack(_PACKED, len(header)) + header
    prefix += _PADDING[_padding(len(prefix))]
    return header, prefix, [_PADDING[_padding(nbytes)] for _, _, _, nbytes in key]


def encode_minibatch(arrays: Sequence[Any], pack: Optional[bool] = None
                     ) -> List[Union[bytes, memoryview]]:
    """Frames for a minibatch (see the module docstring).

    Packed into one frame (a copy) when `pack` is true, or when None and the arrays
    total at most PACK_MAX_BYTES: one frame costs less to send and receive than
    several. Otherwise a JSON header frame, then each array's bytes as its own frame
    (a view: no copy when the array is contiguous). Raises ProtocolError for an array
    that is not plain numeric.
    """
    if type(arrays) is not list and type(arrays) is not tuple:
        arrays = list(arrays)
    try:  # minibatches repeat their layout: C-contiguous arrays seen before skip the checks
        layout = _contiguous_layouts.get(
            tuple([(type(a), a.dtype, a.shape, a.strides) for a in arrays]))
    except AttributeError:  # not arrays: converted below
        layout = None
    if layout is None:
        return _encode_minibatch_checked(arrays, pack)
    header, prefix, pads, total = layout
    return _frames(arrays, header, prefix, pads, total, pack)


def packed_slots(arrays: Sequence[Any]) -> Optional[Tuple[bytes, int, List[Tuple[int, int]]]]:
    """Where `encode_minibatch` would pack `arrays`: (its frame's prefix, the frame's size,
    the (start, stop) of each array's bytes in it), when they are C-contiguous arrays of a
    layout it has encoded before and small enough to pack; else None. The prefix at 0 and
    each array's bytes at its slot, zeros elsewhere, make the frame it makes."""
    try:
        key = tuple([(type(a), a.dtype, a.shape, a.strides) for a in arrays])
    except AttributeError:  # not arrays
        return None
    slots = _packed_slots.get(key)
    if slots is None:
        layout = _contiguous_layouts.get(key)
        if layout is None or layout[3] > PACK_MAX_BYTES:
            return None
        _, prefix, pads, _ = layout
        spans, start = [], len(prefix)
        for a, pad in zip(arrays, pads):
            spans.append((start, start + a.nbytes))
            start += a.nbytes + len(pad)
        slots = _cached(_packed_slots, key, lambda: (prefix, start, spans))
    return slots


def _frames(arrays: Sequence[np.ndarray], header: bytes, prefix: bytes, pads: List[bytes],
            total: int, pack: Optional[bool]) -> List[Union[bytes, memoryview]]:
    """The frames of C-contiguous `arrays` under their encoded header: one packed frame
    (when `pack`, or None and the total is small), else the header and a view of each."""
    if pack or (pack is None and total <= PACK_MAX_BYTES):
        parts: List[Any] = [prefix]
        for a, pad in zip(arrays, pads):
            parts += (a, pad)  # bytes.join reads a C-contiguous array's buffer directly
        return [b"".join(parts)]
    frames: List[Union[bytes, memoryview]] = [header]
    frames += [memoryview(a.reshape(-1)).cast("B") if a.size else b""  # type: ignore[arg-type]
               for a in arrays]  # numpy's stubs do not say that an ndarray is a Buffer
    return frames


def _encode_minibatch_checked(arrays: Sequence[Any], pack: Optional[bool]
                              ) -> List[Union[bytes, memoryview]]:
    """`encode_minibatch` for arrays of a layout not seen yet (or not all C-contiguous)."""
    entries: List[_Spec] = []
    data: List[np.ndarray] = []
    total, contiguous = 0, True
    for i, a in enumerate(arrays):
        if type(a) is not np.ndarray:
            a, contiguous = np.asarray(a), False
        dtype = a.dtype
        if dtype.kind not in "biufc" or dtype.fields is not None:
            raise ProtocolError("minibatch array %d has dtype %s; only plain numeric arrays can "
                                "be sent" % (i, a.dtype))
        flags = a.flags
        if flags.c_contiguous:
            order = "C"
        elif flags.f_contiguous:
            order, a, contiguous = "F", a.T, False  # its transpose is C-contiguous: same bytes
        else:
            order, a, contiguous = "C", np.ascontiguousarray(a), False
        nbytes = a.nbytes
        entries.append((dtype, a.shape if order == "C" else a.shape[::-1], order, nbytes))
        data.append(a)
        total += nbytes
    key = tuple(entries)
    header, prefix, pads = _cached(_encoded_headers, key, lambda: _encode_header(key))
    if contiguous:  # the next minibatch of this layout takes the short way
        _cached(_contiguous_layouts, tuple((type(a), a.dtype, a.shape, a.strides) for a in data),
                lambda: (header, prefix, pads, total))
    return _frames(data, header, prefix, pads, total, pack)


def _parse_minibatch_header(payload: Frame) -> List[_Spec]:
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


def _parse_packed_prefix(header_bytes: bytes) -> Tuple[List[Any], int, Optional[List[Any]]]:
    """[(dtype, shape, order, offset, nbytes)] and the frame's length, for a packed frame
    whose JSON header is `header_bytes`, and the ndarray() arguments (shape, dtype, offset,
    None, order) of each array (None if one is empty); raises ProtocolError."""
    offset = _PACKED_PREFIX.size + len(header_bytes)
    offset += _padding(offset)
    specs = []
    for dtype, shape, order, nbytes in _parse_minibatch_header(header_bytes):
        specs.append((dtype, shape, order, offset, nbytes))
        offset += nbytes + _padding(nbytes)
    views = (None if any(not nbytes for *_, nbytes in specs)
             else [(shape, dtype, start, None, order) for dtype, shape, order, start, _ in specs])
    return specs, offset, views


def _array(i: int, buf: memoryview, dtype: np.dtype, shape: Tuple[int, ...], order: str,
           offset: int, nbytes: int) -> np.ndarray:
    layout = cast(Literal["C", "F"], order)  # checked when the header was parsed
    """A read-only array over `buf`'s bytes at `offset`."""
    array: np.ndarray
    if not nbytes:
        flat = np.empty(0, dtype)
        try:
            array = flat.reshape(shape, order=layout)
        except (ValueError, OverflowError) as exc:  # an empty array with a huge dimension
            raise ProtocolError("minibatch array %d: numpy cannot make shape %s: %s"
                                % (i, shape, exc)) from None
    else:
        try:
            array = np.ndarray(shape, dtype, buf, offset, order=layout)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ProtocolError("minibatch array %d: numpy cannot make shape %s of %s: %s"
                                % (i, shape, dtype.name, exc)) from None
    array.flags.writeable = False  # over a read-only view already, but for empty ones
    return array


def decode_minibatch(frames: Sequence[Frame]) -> List[np.ndarray]:
    """Arrays from minibatch frames, as read-only views of the frames' buffers.

    Raises ProtocolError naming the first inconsistency.
    """
    if len(frames) == 1:  # packed, with a header seen before: the short way
        buf = memoryview(frames[0]).toreadonly()  # arrays over it are read-only too
        size = buf.nbytes
        if size >= _PACKED_PREFIX.size and buf.itemsize == 1:
            magic, length = _PACKED_PREFIX.unpack_from(buf)
            end = _PACKED_PREFIX.size + length
            if magic == _PACKED and end <= size:
                known = _parsed_packed.get(bytes(buf[_PACKED_PREFIX.size:end]))
                if known is not None and known[1] == size and known[2] is not None:
                    ndarray = np.ndarray
                    try:
                        return [ndarray(shape, dtype, buf, offset, strides, order)
                                for shape, dtype, offset, strides, order in known[2]]
                    except (ValueError, TypeError, OverflowError):
                        pass  # numpy refuses the layout: the long way says why
    elif frames:  # a header, then a frame per array, with a header seen before: the short way
        first = frames[0]
        specs = _parsed_headers.get(first.bytes if hasattr(first, "bytes") else bytes(first))
        if specs is not None and len(specs) == len(frames) - 1:
            arrays = []
            ndarray = np.ndarray
            for (dtype, shape, order, nbytes), frame in zip(specs, frames[1:]):
                buf = memoryview(frame).toreadonly()
                if not nbytes or buf.nbytes != nbytes or buf.itemsize != 1:
                    break  # empty, or not what the header says: the long way
                try:
                    arrays.append(ndarray(shape, dtype, buf, 0, None, order))
                except (ValueError, TypeError, OverflowError):
                    break  # numpy refuses the layout: the long way says why
            else:
                return arrays
    return _decode_minibatch_checked(frames)


def _decode_minibatch_checked(frames: Sequence[Frame]) -> List[np.ndarray]:
    """`decode_minibatch` the long way, checking everything."""
    if not frames:
        raise ProtocolError("empty minibatch message")
    first = frames[0]
    buf = memoryview(first).toreadonly()
    if buf.nbytes >= 8 and buf[:4] == _PACKED:  # one frame: the header and the arrays
        if len(frames) != 1:
            raise ProtocolError("a packed minibatch is one frame, but %d arrived" % len(frames))
        _, length = _PACKED_PREFIX.unpack_from(buf)
        end = _PACKED_PREFIX.size + length
        if end > len(buf):
            raise ProtocolError("packed minibatch header of %d bytes is longer than its frame "
                                "(%d bytes)" % (length, len(buf)))
        header_bytes = bytes(buf[_PACKED_PREFIX.size:end])
        specs, expected, _ = _cached(_parsed_packed, header_bytes,
                                     lambda: _parse_packed_prefix(header_bytes))
        if len(buf) != expected:
            raise ProtocolError("packed minibatch of %d bytes, but its header describes %d"
                                % (len(buf), expected))
        return [_array(i, buf, *spec) for i, spec in enumerate(specs)]
    payload = first.bytes if hasattr(first, "bytes") else bytes(first)
    specs = _cached(_parsed_headers, payload, lambda: _parse_minibatch_header(payload))
    if len(specs) != len(frames) - 1:
        raise ProtocolError("minibatch header describes %d arrays but %d data frames arrived"
                            % (len(specs), len(frames) - 1))
    arrays = []
    for i, ((dtype, shape, order, expected), frame) in enumerate(zip(specs, frames[1:])):
        buf = memoryview(frame).toreadonly()
        if buf.nbytes != expected:
            raise ProtocolError("minibatch array %d: %d bytes arrived but dtype %s and shape %s "
                                "need %d" % (i, buf.nbytes, dtype.name, shape, expected))
        arrays.append(_array(i, buf, dtype, shape, order, 0, expected))
    return arrays


# magic, bye, worker id, epoch, done, credit, window bytes; then the token
_MB_REQUEST = struct.Struct("<4s?xxxqQQIQ")
_MB_REQUEST_MAGIC = b"PMR\x03"
_MAX_TOKEN_BYTES = 256
_MAX_CREDIT = 1 << 20


def encode_mb_request(worker_id: int, token: str, done: int, credit: int, bye: bool = False,
                      window_bytes: int = 0, epoch: int = 0) -> bytes:
    """A worker's request frame on the data channel (see the module docstring): `done`
    minibatches of `epoch` finished, `credit` more wanted."""
    return _MB_REQUEST.pack(_MB_REQUEST_MAGIC, bye, worker_id, epoch, done, credit,
                            window_bytes) + token.encode()


def decode_mb_request(payload: bytes) -> Tuple[int, str, int, int, bool, int, int]:
    """``(worker_id, token, done, credit, bye, window_bytes, epoch)`` from a request frame;
    raises ProtocolError."""
    size = _MB_REQUEST.size
    if not size <= len(payload) <= size + _MAX_TOKEN_BYTES \
            or payload[:4] != _MB_REQUEST_MAGIC or payload[4] > 1:
        raise ProtocolError("a minibatch request is a binary frame of %d to %d bytes starting "
                            "with %r, got %d bytes; platoon.Worker.recv_mb sends them"
                            % (size, size + _MAX_TOKEN_BYTES, _MB_REQUEST_MAGIC, len(payload)))
    _, bye, wid, epoch, done, credit, window_bytes = _MB_REQUEST.unpack_from(payload)
    if credit > _MAX_CREDIT:
        raise ProtocolError("minibatch request asks for %d minibatches; at most %d at once"
                            % (credit, _MAX_CREDIT))
    try:
        token = payload[size:].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("minibatch request token is not ASCII") from None
    return wid, token, done, credit, bye, window_bytes, epoch


_MB_EPOCH = struct.Struct("<4sQ")
_MB_EPOCH_MAGIC = b"PME\x01"


def encode_mb_epoch(epoch: int) -> bytes:
    """The controller's first message on a worker's connection: it opens `epoch` (>= 1)."""
    return _MB_EPOCH.pack(_MB_EPOCH_MAGIC, epoch)


def mb_epoch(frames: Sequence[Frame]) -> Optional[int]:
    """The epoch a message opens (see `encode_mb_epoch`), or None for anything else."""
    if len(frames) != 1 or len(frames[0]) != _MB_EPOCH.size:
        return None
    magic, epoch = _MB_EPOCH.unpack_from(frames[0])
    return epoch if magic == _MB_EPOCH_MAGIC and epoch else None


def encode_mb_refusal(message: str) -> bytes:
    """The controller's answer to a minibatch request it refuses."""
    return _encode_json({"error": message}).encode()


def mb_refusal(frames: Sequence[Frame]) -> Optional[str]:
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
