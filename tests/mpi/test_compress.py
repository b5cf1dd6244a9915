"""platoon.node.compress: the codecs' round trips and byte counts, error feedback, refusal of
non-finite values (pure numpy); platoon.mpi.compress.compressed_mean on a one-rank
communicator. Two ranks: tests/mpi/test_mpi.py."""

import math

import numpy as np
import pytest

from platoon.errors import NonFiniteValues, PlatoonError
from platoon.mpi.compress import compressed_mean
from platoon.node.compress import BLOCK, ErrorFeedback, RawCodec, make_codec

try:
    from mpi4py import MPI
except ImportError:  # (or no MPI library)
    MPI = None
needs_mpi = pytest.mark.skipif(MPI is None, reason="mpi4py cannot be imported: pip install -e "
                               "'.[mpi]'")

SIZES = [0, 1, 2, 255, 256, 257, 1000, 3 * BLOCK + 17]


def _values(n, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n) * np.exp(rng.normal(scale=3, size=n))  # magnitudes over decades
    return x.astype(dtype)


def _block_scales(x, levels, block=BLOCK):
    padded = np.zeros(math.ceil(x.size / block) * block, np.float32)
    padded[:x.size] = x
    scales = np.abs(padded.reshape(-1, block)).max(axis=1).astype(np.float32) / np.float32(levels)
    return np.repeat(scales, block)[:x.size]


@pytest.mark.parametrize("n", SIZES)
def test_exact_byte_counts(n):
    blocks = math.ceil(n / BLOCK)
    expected = {"float32": 4 * n, "int8": n + 4 * blocks, "int4": (n + 1) // 2 + 4 * blocks}
    for name, size in expected.items():
        codec = make_codec(name)
        assert codec.encoded_size(n) == size
        message = codec.encode(_values(n))
        assert message.dtype == np.uint8 and message.nbytes == size, name
    if n >= 1000:  # the compression factors the docs quote
        assert 3.9 < expected["float32"] / expected["int8"] < 4
        assert 7.7 < expected["float32"] / expected["int4"] < 8


@pytest.mark.parametrize("name,levels", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantised_round_trip_is_within_half_a_scale(name, levels, n, dtype):
    codec = make_codec(name)
    x = _values(n, seed=n, dtype=dtype)
    out = np.full(n, np.nan, dtype)
    codec.decode(codec.encode(x), out)
    scale = _block_scales(x, levels)
    error = np.abs(out.astype(np.float64) - x.astype(np.float64))
    # scale/2, plus float32 rounding of x / scale and of level * scale (a few ulps of x)
    assert (error <= scale / 2 * (1 + 1e-5) + np.abs(x) * 1e-6).all(), \
        float((error / np.maximum(scale, 1e-30)).max())
    if n:
        assert np.abs(out).max() <= np.abs(x).max() * (1 + 1e-6)  # clipped at the block's max


def test_quantised_codecs_keep_zeros_signs_and_block_maxima():
    x = np.zeros(2 * BLOCK, np.float32)
    x[3], x[BLOCK + 5], x[BLOCK + 6] = -2.5, 1e-3, -1e-3  # the second block's scale is tiny
    for name in ("int8", "int4"):
        codec = make_codec(name)
        out = codec.decode(codec.encode(x), np.empty_like(x))
        assert out[3] == -2.5 and out[BLOCK + 5] == np.float32(1e-3), name
        assert out[BLOCK + 6] == -out[BLOCK + 5] and np.count_nonzero(out) == 3, name


def test_float32_and_raw_codecs_are_lossless():
    x = _values(1000, dtype=np.float32)
    codec = make_codec("float32")
    assert codec.decode(codec.encode(x), np.empty_like(x)).tobytes() == x.tobytes()
    y = _values(1000, dtype=np.float64)
    raw = RawCodec(np.float64)
    assert raw.decode(raw.encode(y), np.empty_like(y)).tobytes() == y.tobytes()


def test_tiny_blocks_are_sent_as_zeros():
    x = np.full(BLOCK, 1e-38, np.float32)  # subnormal scales would lose the error bound
    for name in ("int8", "int4"):
        codec = make_codec(name)
        assert not codec.decode(codec.encode(x), np.empty_like(x)).any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["int8", "int4", "float32", "raw"])
def test_every_codec_refuses_non_finite_values_clearly(name, bad):
    """Lossless codecs too: averaged, one node's NaN would reach every node."""
    codec = RawCodec(np.float64) if name == "raw" else make_codec(name)
    x = np.ones(1000, np.float64 if name == "raw" else np.float32)
    x[600] = bad
    with pytest.raises(NonFiniteValues, match="1 non-finite value.*index 600") as info:
        codec.encode(x)
    assert isinstance(info.value, PlatoonError) and isinstance(info.value, ValueError)
    if name != "raw":
        with pytest.raises(NonFiniteValues, match="beyond float32's range"):
            codec.encode(np.array([1.0, 1e300]))
    refusal = codec.refusal(x.size)
    assert codec.refused(refusal) and refusal.size == codec.encoded_size(x.size)
    assert not codec.refused(codec.encode(np.ones(1000)))


def test_bad_names_and_arrays_are_refused():
    with pytest.raises(ValueError, match="no codec 'int2': choose one of float32, int8, int4"):
        make_codec("int2")
    with pytest.raises(ValueError, match="floating-point"):
        make_codec("int8").encode(np.arange(10))
    with pytest.raises(ValueError, match="a message of 3 bytes, expected 14"):
        make_codec("int8").decode(b"abc", np.empty(10, np.float32))
    with pytest.raises(ValueError, match="C-contiguous float array"):
        make_codec("int8").decode(make_codec("int8").encode(np.ones(10)), np.empty(20)[::2])
    with pytest.raises(ValueError, match="integer >= 0"):
        ErrorFeedback(-1)


@needs_mpi
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_error_feedback_keeps_the_running_sum_within_one_quantisation_error(name):
    """However many rounds: sum of what was received = sum of the inputs - residual, and the
    residual stays within one message's error (scale/2 per element of the last message)."""
    rng = np.random.default_rng(1)
    n = 1000
    codec, feedback = make_codec(name), ErrorFeedback(n)
    sent, received = np.zeros(n), np.zeros(n)
    drift = rng.normal(size=n).astype(np.float32) * 1e-3  # a bias a plain quantiser would lose
    for _ in range(300):
        x = drift + rng.normal(scale=0.01, size=n).astype(np.float32)
        message_input = x + feedback.residual
        mean, sent_bytes = compressed_mean(MPI.COMM_SELF, x, codec, feedback)
        assert sent_bytes == 0  # one rank: nothing leaves it
        sent += x
        received += mean
        scale = _block_scales(message_input, 127 if name == "int8" else 7)
        gap = np.abs(sent - received)
        assert (gap <= scale / 2 * (1 + 1e-4) + 1e-6).all(), float(gap.max())
        assert np.allclose(sent - received, feedback.residual, atol=1e-5)
    without = np.zeros(n)  # the same inputs without feedback drift apart
    for _ in range(300):
        x = drift
        mean, _ = compressed_mean(MPI.COMM_SELF, x, codec, None)
        without += mean - x
    assert np.abs(without).max() > 10 * np.abs(sent - received).max()


@needs_mpi
def test_compressed_mean_refuses_non_finite_values_and_leaves_the_residual():
    feedback = ErrorFeedback(4)
    feedback.residual[...] = 0.25
    x = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    with pytest.raises(NonFiniteValues, match=r"rank\(s\) 0 of 1 hold NaN or Inf") as info:
        compressed_mean(MPI.COMM_SELF, x, make_codec("int8"), feedback)
    assert isinstance(info.value.__cause__, NonFiniteValues)  # this rank's own detail
    assert (feedback.residual == 0.25).all()
    for codec in (make_codec("float32"), RawCodec(np.float32)):  # lossless: refused as well
        with pytest.raises(NonFiniteValues, match=r"rank\(s\) 0 of 1 hold NaN or Inf") as info:
            compressed_mean(MPI.COMM_SELF, x, codec, None)
        assert info.value.ranks == [0]


def test_the_tie_and_the_launcher_offer_the_codecs():
    from platoon.launch.cli import TIE_CODECS
    from platoon.node.compress import CODECS
    from platoon.node.tie import CentreTie
    assert tuple(CODECS) == TIE_CODECS == ("float32", "int8", "int4")
    assert CentreTie(0.1, compress="int4").compress == "int4"
    with pytest.raises(ValueError, match="compress must be one of float32, int8, int4, got 'fp8'"):
        CentreTie(0.1, compress="fp8")
