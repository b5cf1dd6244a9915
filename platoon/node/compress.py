"""Compressed means across nodes: codecs, error feedback, and an all-gather mean that every rank
computes bit for bit alike.

A codec turns a float array of n elements into a message of a size fixed by n alone
(`encoded_size`), and back:

- ``float32``: the values as float32, 4 bytes each (lossless for float32 arrays).
- ``int8``: blocks of `BLOCK` (256) elements, each sent as one float32 scale (its largest
  magnitude / 127) and one signed byte per element, ``round(x / scale)``: n + 4 ceil(n/256)
  bytes, 3.94x smaller than float32; an element is off by at most scale/2.
- ``int4``: the same with levels -7..7 (scale = largest magnitude / 7), two per byte:
  ceil(n/2) + 4 ceil(n/256) bytes, 7.76x smaller; off by at most scale/2.
- ``raw`` (not a command-line choice): the array's own dtype, bit for bit.

Scales are float32, not float16: what the nodes send are differences, which late in training
are far below float16's smallest normal number (6e-5) and which may be large early on;
float32 covers both, for 1.6% (int8) or 3.1% (int4) of the message. Blocks of 256 keep an
outlier's coarse scale to its own 256 elements. Blocks whose largest magnitude is below
`TINY` (1e-36) are sent as zeros. Every codec refuses non-finite values (`NonFiniteValues`),
lossless ones too: averaged, one NaN or Inf would reach every rank's mean (and would spoil a
quantiser's whole block's scale).

A mean over nodes all-gathers every rank's message (`own_message`) and has each rank decode
them all and add them up in rank order (`mean_of_messages`), so the mean is the same bits on
every rank (an all-reduce may round differently on different ranks): over MPI
(`platoon.mpi.compress.compressed_mean`) and over an elastic quorum's gloo group
(`platoon.elastic.dataplane`) alike. numpy only.
"""

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import NonFiniteValues

BLOCK = 256  # elements per scale (int8, int4)
CHUNK = 1 << 20  # elements per finiteness check (a bounded scratch array)
TINY = 1e-36  # a block whose largest magnitude is smaller is sent as zeros (no subnormal scales)

__all__ = ["make_codec", "CODECS", "Codec", "RawCodec", "ErrorFeedback", "own_message",
           "with_residual", "mean_of_messages", "BLOCK"]


class Codec:
    """Encodes a float array of n elements into `encoded_size(n)` bytes, and back."""

    name = ""
    lead = np.dtype("<f4")  # a message's first element (a scale, or a value): NaN in a refusal

    def encoded_size(self, n: int) -> int:
        """Bytes of the message for an array of `n` elements (no header: fixed by n)."""
        raise NotImplementedError

    def encode(self, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The message for `array` (any shape, flattened; a floating dtype), as a uint8 array of
        `encoded_size(array.size)` bytes (written into `out` if given). Raises
        NonFiniteValues (a quantising codec) or ValueError."""
        raise NotImplementedError

    def decode(self, buf: Any, out: np.ndarray) -> np.ndarray:
        """Write the values of message `buf` into the float array `out` (its size is n);
        returns `out`."""
        raise NotImplementedError

    def refusal(self, n: int) -> np.ndarray:
        """The message a rank sends in place of an array this codec refuses (one holding NaN
        or Inf): every byte 0xFF, so its first element (`lead`) is NaN, which no message
        `encode` makes holds."""
        return np.full(self.encoded_size(n), 0xFF, np.uint8)

    def refused(self, message: np.ndarray) -> bool:
        """Whether `message` is a `refusal`."""
        size = self.lead.itemsize
        return message.size >= size and bool(np.isnan(message[:size].view(self.lead)[0]))

    def __repr__(self) -> str:
        return "make_codec(%r)" % self.name


def _flat_float(array: Any) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind != "f":
        raise ValueError("a codec encodes floating-point arrays, not %s" % array.dtype)
    flat: np.ndarray = array.reshape(-1)
    return flat


def _nonfinite(flat: np.ndarray, what: str) -> NonFiniteValues:
    """The error for `flat` (the input), which cannot be sent as `what`."""
    bad = np.flatnonzero(~np.isfinite(flat))
    where = ("%d non-finite value(s), the first %r at flat index %d"
             % (bad.size, float(flat[bad[0]]), bad[0]) if bad.size
             else "values beyond float32's range")
    return NonFiniteValues("cannot %s an array holding %s: training diverged?" % (what, where))


def _check_finite(sent: np.ndarray, flat: np.ndarray, what: str) -> None:
    """Raise `_nonfinite` unless every value of `sent` (the values as they go out) is
    finite; checked in chunks, so the scratch stays small whatever the size."""
    for start in range(0, sent.size, CHUNK):
        if not np.isfinite(sent[start:start + CHUNK]).all():
            raise _nonfinite(flat, what)


def _message(out: Optional[np.ndarray], size: int) -> np.ndarray:
    if out is None:
        return np.empty(size, np.uint8)
    if out.dtype != np.uint8 or out.size != size:
        raise ValueError("a message buffer must be %d uint8 bytes, got %d %s"
                         % (size, out.size, out.dtype))
    return out.reshape(-1)


def _target(out: np.ndarray) -> np.ndarray:
    """`out` flattened without a copy (decoded values are written through it)."""
    if not (isinstance(out, np.ndarray) and out.dtype.kind == "f" and out.flags.c_contiguous
            and out.flags.writeable):
        raise ValueError("decode needs a writeable, C-contiguous float array to write into")
    return out.reshape(-1)


def _received(buf: Any, size: int) -> np.ndarray:
    data = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1)
    if data.dtype != np.uint8:
        data = data.view(np.uint8)
    if data.size != size:
        raise ValueError("a message of %d bytes, expected %d" % (data.size, size))
    return data


class Float32Codec(Codec):
    """The values as float32 (little-endian), 4 bytes each."""

    name = "float32"

    def encoded_size(self, n: int) -> int:
        return 4 * n

    def encode(self, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        flat = _flat_float(array)
        msg = _message(out, 4 * flat.size)
        with np.errstate(over="ignore"):  # float64 beyond float32's range: refused next
            msg.view("<f4")[...] = flat
        _check_finite(msg.view("<f4"), flat, "send as float32")
        return msg

    def decode(self, buf: Any, out: np.ndarray) -> np.ndarray:
        _target(out)[...] = _received(buf, 4 * out.size).view("<f4")
        return out


class RawCodec(Codec):
    """The array's own dtype, bit for bit: `dtype`'s itemsize bytes per element."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = self.lead = np.dtype(dtype).newbyteorder("<")
        self.name = "raw"

    def encoded_size(self, n: int) -> int:
        return int(self.dtype.itemsize) * n

    def encode(self, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        flat = _flat_float(array)
        msg = _message(out, self.encoded_size(flat.size))
        msg.view(self.dtype)[...] = flat
        _check_finite(msg.view(self.dtype), flat, "send")
        return msg

    def decode(self, buf: Any, out: np.ndarray) -> np.ndarray:
        _target(out)[...] = _received(buf, self.encoded_size(out.size)).view(self.dtype)
        return out

    def __repr__(self) -> str:
        return "RawCodec(%s)" % self.dtype


class _BlockQuantizer(Codec):
    """Symmetric quantisation to integer levels -LEVELS..LEVELS, one float32 scale (largest
    magnitude / LEVELS) per block of `block` elements. Message: the scales, then the levels."""

    LEVELS = 0

    def __init__(self, block: int = BLOCK) -> None:
        if not (isinstance(block, int) and block >= 2 and block % 2 == 0):
            raise ValueError("a codec's block must be an even integer >= 2, got %r" % (block,))
        self.block = block

    def _payload_size(self, n: int) -> int:
        raise NotImplementedError

    def encoded_size(self, n: int) -> int:
        return 4 * math.ceil(n / self.block) + self._payload_size(n)

    def _blocks(self, flat: np.ndarray) -> np.ndarray:
        """`flat` as float32 blocks (nblocks, block), zero-padded."""
        nblocks = math.ceil(flat.size / self.block)
        with np.errstate(over="ignore"):  # float64 beyond float32's range: refused next
            if flat.size == nblocks * self.block:
                return flat.astype(np.float32, copy=False).reshape(nblocks, self.block)
            blocks = np.zeros((nblocks, self.block), np.float32)
            blocks.reshape(-1)[:flat.size] = flat
        return blocks

    def _levels(self, array: np.ndarray) -> Tuple[np.ndarray, np.ndarray, int]:
        """(scales (nblocks,) float32, levels (nblocks, block) float32, n)."""
        flat = _flat_float(array)
        blocks = self._blocks(flat)
        absmax = np.abs(blocks).max(axis=1) if blocks.size else np.zeros(0, np.float32)
        if not np.isfinite(absmax).all():
            raise _nonfinite(flat, "%s-compress" % self.name)
        absmax[absmax < TINY] = 0
        scales = (absmax / np.float32(self.LEVELS)).astype(np.float32)
        safe = np.where(scales > 0, scales, np.float32(1))
        levels = blocks / safe[:, None]
        np.rint(levels, out=levels)
        np.clip(levels, -self.LEVELS, self.LEVELS, out=levels)
        levels[scales == 0] = 0
        return scales, levels, flat.size

    def _split(self, buf: Any, n: int) -> Tuple[np.ndarray, np.ndarray, int]:
        data = _received(buf, self.encoded_size(n))
        nblocks = math.ceil(n / self.block)
        return data[:4 * nblocks].view("<f4"), data[4 * nblocks:], nblocks

    def _write(self, scales: np.ndarray, levels: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = levels * scales, blockwise, in float32 (levels: (nblocks, block) float32)."""
        levels *= scales[:, None]
        _target(out)[...] = levels.reshape(-1)[:out.size]
        return out


class Int8Codec(_BlockQuantizer):
    """int8 levels -127..127, one byte each."""

    name = "int8"
    LEVELS = 127

    def _payload_size(self, n: int) -> int:
        return n

    def encode(self, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        scales, levels, n = self._levels(array)
        msg = _message(out, self.encoded_size(n))
        msg[:4 * scales.size].view("<f4")[...] = scales
        msg[4 * scales.size:].view(np.int8)[...] = levels.reshape(-1)[:n]
        return msg

    def decode(self, buf: Any, out: np.ndarray) -> np.ndarray:
        n = out.size
        scales, payload, nblocks = self._split(buf, n)
        levels = np.zeros((nblocks, self.block), np.float32)
        levels.reshape(-1)[:n] = payload.view(np.int8)
        return self._write(scales, levels, out)


class Int4Codec(_BlockQuantizer):
    """4-bit levels -7..7, stored as level + 8, two per byte (the even element in the low
    nibble)."""

    name = "int4"
    LEVELS = 7

    def _payload_size(self, n: int) -> int:
        return (n + 1) // 2

    def encode(self, array: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        scales, levels, n = self._levels(array)
        msg = _message(out, self.encoded_size(n))
        msg[:4 * scales.size].view("<f4")[...] = scales
        # (a block is even: the padded levels cover 2 ceil(n/2); the pad element is level 0)
        nibbles = (levels.reshape(-1)[:2 * ((n + 1) // 2)] + 8).astype(np.uint8)
        np.bitwise_or(nibbles[0::2], nibbles[1::2] << 4, out=msg[4 * scales.size:])
        return msg

    def decode(self, buf: Any, out: np.ndarray) -> np.ndarray:
        n = out.size
        scales, payload, nblocks = self._split(buf, n)
        levels = np.zeros((nblocks, self.block), np.float32)
        flat = levels.reshape(-1)
        low = (payload & 15).astype(np.float32) - 8
        high = (payload >> 4).astype(np.float32) - 8
        flat[0:2 * payload.size:2] = low
        flat[1:2 * payload.size:2] = high
        return self._write(scales, levels, out)


# Each codec's class by name (`make_codec` makes them; the quantisers take a block size).
CODECS: Dict[str, Callable[..., Codec]] = {"float32": Float32Codec, "int8": Int8Codec,
                                           "int4": Int4Codec}


def make_codec(name: str, block: int = BLOCK) -> Codec:
    """The codec called `name`: "float32", "int8" or "int4" (`block`: elements per scale, for
    int8 and int4). Raises ValueError for another name."""
    if name not in CODECS:
        raise ValueError("no codec %r: choose one of %s" % (name, ", ".join(CODECS)))
    return CODECS[name](block) if name != "float32" else Float32Codec()


class ErrorFeedback:
    """What compression dropped from this rank's messages so far, added to its next one.

    `ErrorFeedback(size, dtype=np.float32)`: one residual of `size` elements (that of the
    array it serves; one per array, held once per node). After each mean over nodes, the
    running sum of what the rank's decoded messages carried equals the running sum of its
    inputs minus `residual`, which is at most one message's quantisation error (scale/2 per
    element): the error does not grow with the rounds. Use it for increments (DiLoCo's outer
    gradients; the centre tie's moves of a centre since the last round), not for states sent
    as differences from a shared reference (the reference already lacks what was dropped:
    feedback would send it twice).
    """

    def __init__(self, size: int, dtype: Any = np.float32) -> None:
        if not (isinstance(size, (int, np.integer)) and size >= 0):
            raise ValueError("ErrorFeedback size must be an integer >= 0, got %r" % (size,))
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError("ErrorFeedback dtype must be floating-point, got %s" % dtype)
        self.residual = np.zeros(int(size), dtype)

    def reset(self) -> None:
        """Forget what was dropped (when the messages start again from a new reference)."""
        self.residual[...] = 0


def _accumulator_dtype(dtype: Any) -> np.dtype:
    return np.result_type(dtype, np.float32)


def with_residual(flat: np.ndarray, feedback: Optional[ErrorFeedback]) -> np.ndarray:
    """What one rank sends of `flat`: plus what its earlier messages dropped (`flat` itself
    without feedback)."""
    if feedback is None:
        return flat
    data = flat.astype(np.result_type(flat.dtype, feedback.residual.dtype))
    data += feedback.residual
    return data


def own_message(flat: np.ndarray, codec: Codec, feedback: Optional[ErrorFeedback]
                ) -> Tuple[np.ndarray, np.ndarray, Optional[NonFiniteValues]]:
    """(what is sent: `flat` plus the residual, its message, None) for one rank's part of a
    mean over nodes; (data, the codec's refusal, the NonFiniteValues) when that holds NaN
    or Inf, so that every rank raises and none is left waiting."""
    data = with_residual(flat, feedback)
    try:
        return data, codec.encode(data), None
    except NonFiniteValues as exc:
        return data, codec.refusal(flat.size), exc


def mean_of_messages(gathered: np.ndarray, members: Sequence[int], rank: int, size: int,
                     codec: Codec, array: np.ndarray, data: np.ndarray,
                     feedback: Optional[ErrorFeedback],
                     refused_here: Optional[NonFiniteValues] = None,
                     out: Optional[np.ndarray] = None) -> np.ndarray:
    """The mean of the all-gathered messages (`gathered`: one row per rank of `members`, in
    rank order), decoded and added up in that order in float32 (float64 for a float64
    `array`): the same bits on every rank. This rank's residual becomes what its own message
    (made from `data`) lost. Raises NonFiniteValues when any message is a refusal."""
    refusing = [r for r, message in zip(members, gathered) if codec.refused(message)]
    if refusing:
        raise NonFiniteValues("compressed_mean: rank(s) %s of %d hold NaN or Inf, which would "
                              "reach every rank's mean (%s); nothing was averaged"
                              % (", ".join(map(str, refusing)), size, codec.name),
                              refusing) from refused_here
    n = array.size
    acc_dtype = _accumulator_dtype(array.dtype)
    total = np.empty(n, acc_dtype)
    scratch = np.empty(n, acc_dtype) if len(members) > 1 else total
    for index, member in enumerate(members):
        decoded = codec.decode(gathered[index], total if index == 0 else scratch)
        if index > 0:
            total += decoded
        if member == rank and feedback is not None:  # what its own message lost
            np.subtract(data, decoded, out=feedback.residual, casting="same_kind")
    if len(members) > 1:
        total /= len(members)
    mean = out if out is not None else np.empty(array.shape, array.dtype)
    mean[...] = total.reshape(array.shape)
    return mean
