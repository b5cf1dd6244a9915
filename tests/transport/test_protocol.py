"""Encoding, decoding and validation of control and data messages (no sockets)."""

import json
import random

import numpy as np
import pytest

from platoon import ProtocolError, RemoteError, protocol

from helpers import garbled_minibatch


def test_request_round_trip():
    payload = protocol.encode_request(3, "next", {"n": 5}, seq=9)
    req = protocol.decode_request(payload)
    assert (req.worker_id, req.req, req.req_info, req.seq) == (3, "next", {"n": 5}, 9)
    assert not req.is_reserved
    assert protocol.decode_request(protocol.encode_request(None, "platoon-done")).is_reserved


@pytest.mark.parametrize("payload, message", [
    (b"\xff\xfe", "not UTF-8"),
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"worker_id": 0}', "'req' must be a non-empty string"),
    (b'{"req": null}', "'req' must be a non-empty string"),
    (b'{"req": ""}', "'req' must be a non-empty string"),
    (b'{"req": "x", "worker_id": "0"}', "'worker_id' must be an integer"),
    (b'{"req": "x", "worker_id": true}', "'worker_id' must be an integer"),
    (b'{"req": "x", "seq": 1.5}', "'seq' must be an integer"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_malformed_requests_say_what_is_wrong(payload, message):
    with pytest.raises(ProtocolError, match=message):
        protocol.decode_request(payload)


def test_oversized_request():
    with pytest.raises(ProtocolError, match="exceeds the controller's limit of 100 bytes"):
        protocol.decode_request(json.dumps({"req": "x" * 200}).encode(), max_bytes=100)


def test_unserialisable_request_info():
    with pytest.raises(ProtocolError, match="not JSON-serialisable"):
        protocol.encode_request(0, "done", {"loss": object()})


def test_peek_seq_of_garbage():
    assert protocol.peek_seq(b"\x00garbage") is None
    assert protocol.peek_seq(b'{"seq": 4, "req": 5}') == 4


def test_error_reply_becomes_remote_error():
    seq, err = protocol.decode_reply(protocol.encode_error(2, "KeyError", "boom", "Traceback..."))
    assert seq == 2 and isinstance(err, RemoteError)
    assert err.remote_type == "KeyError" and "boom" in str(err) and "Traceback..." in str(err)


def test_layout_mismatch_names_the_first_parameter():
    mine = protocol.layout_of([np.zeros(3), np.zeros((2, 2), np.float32)])
    centre = protocol.layout_of([np.zeros(3), np.zeros((2, 3), np.float32)])
    assert protocol.describe_mismatch(mine, mine) is None
    assert "parameter 1 is float32 of shape (2, 2) here but float32 of shape (2, 3)" in \
        protocol.describe_mismatch(mine, centre)
    assert "registers 1 parameters but the job's centre holds 2" in \
        protocol.describe_mismatch(mine[:1], centre)


@pytest.mark.parametrize("layout, message", [
    (None, "non-empty list"), ([], "non-empty list"), ([5], "must be an object"),
    ([{"dtype": "O", "shape": [1]}], "not a plain numeric"),
    ([{"dtype": "float32", "shape": [-1]}], "non-negative"),
    ([{"dtype": "nonsense", "shape": [1]}], "unknown dtype"),
])
def test_bad_layouts(layout, message):
    with pytest.raises(ProtocolError, match=message):
        protocol.validate_layout(layout)


def test_minibatch_round_trip_keeps_dtype_shape_and_order():
    arrays = [np.arange(12, dtype=np.int16).reshape(3, 4),
              np.asfortranarray(np.arange(6.0).reshape(2, 3)),
              np.arange(20.0)[::3],
              np.zeros((0, 4), np.float32),
              np.array(3.5)]
    got = protocol.decode_minibatch([bytes(f) for f in protocol.encode_minibatch(arrays)])
    for a, b in zip(arrays, got):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert got[1].flags.f_contiguous and not got[1].flags.c_contiguous


@pytest.mark.parametrize("frames, message", [
    ([], "empty"),
    ([b"{"], "not valid JSON"),
    ([b"{}"], "must be a JSON list"),
    ([b'[{"dtype": "<f4", "shape": [2]}]'], "describes 1 arrays but 0"),
    ([b'[{"dtype": "<f4", "shape": [2]}]', b"abc"], "3 bytes arrived"),
    ([b'[{"dtype": "|O", "shape": [1]}]', b"12345678"], "not a plain numeric"),
    ([b'[{"dtype": "<f4", "shape": [1], "order": "X"}]', b"1234"], "order"),
])
def test_malformed_minibatches(frames, message):
    with pytest.raises(ProtocolError, match=message):
        protocol.decode_minibatch(frames)


def test_fuzzed_minibatches_raise_only_protocol_errors():
    rng = random.Random(20240613)
    decoded = 0
    for _ in range(4000):
        frames = garbled_minibatch(rng)
        try:
            arrays = protocol.decode_minibatch(frames)
        except ProtocolError:
            continue
        decoded += 1
        for array in arrays:
            assert isinstance(array, np.ndarray) and not array.flags.writeable
    assert decoded > 50  # the fuzzer also produces well-formed messages


@pytest.mark.parametrize("pack", [None, False])
def test_received_minibatch_arrays_are_read_only(pack):
    arrays = [np.arange(6.0).reshape(2, 3), np.asfortranarray(np.ones((2, 2), np.int32))]
    if pack is False:  # large enough to travel as a header and one frame per array
        arrays.append(np.zeros(protocol.PACK_MAX_BYTES // 8 + 1))
    frames = [bytearray(f) for f in protocol.encode_minibatch(arrays)]  # writable buffers
    assert len(frames) == (1 if pack is None else 4)
    for _ in range(2):  # the first time, and with the header known
        for got in protocol.decode_minibatch(frames):
            assert not got.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                got[...] = 0


def test_small_minibatches_travel_packed_in_one_frame_large_ones_as_views():
    arrays = [np.arange(12, dtype=np.int16).reshape(3, 4), np.asfortranarray(np.ones((2, 3))),
              np.zeros((0, 4), np.float32), np.array(3.5), np.arange(5, dtype=">i4")]
    packed = protocol.encode_minibatch(arrays)
    assert len(packed) == 1 and isinstance(packed[0], bytes)
    big = [np.arange(protocol.PACK_MAX_BYTES // 8 + 1, dtype=np.float64), np.arange(3)]
    split = protocol.encode_minibatch(big)
    assert len(split) == 3 and np.shares_memory(np.frombuffer(split[1]), big[0])
    assert len(protocol.encode_minibatch(big, pack=True)) == 1
    for frames, original in ((packed, arrays), (split, big),
                             (protocol.encode_minibatch(big, pack=True), big)):
        got = protocol.decode_minibatch([bytearray(f) for f in frames])
        for a, b in zip(original, got):
            assert a.dtype == b.dtype and a.shape == b.shape and not b.flags.writeable
            np.testing.assert_array_equal(a, b)
            assert b.ctypes.data % 8 == 0 or b.size == 0 or len(frames) > 1  # 8-byte aligned
    assert got[1].dtype == np.int64
    assert protocol.decode_minibatch(packed)[1].flags.f_contiguous


def test_garbled_packed_minibatches_raise_only_protocol_errors():
    rng = random.Random(7)
    frame = protocol.encode_minibatch([np.arange(6.0).reshape(2, 3), np.arange(4)])[0]
    with pytest.raises(ProtocolError, match="packed minibatch of %d bytes, but its header "
                       "describes %d" % (len(frame) - 8, len(frame))):
        protocol.decode_minibatch([frame[:-8]])
    with pytest.raises(ProtocolError, match="packed minibatch is one frame"):
        protocol.decode_minibatch([frame, b""])
    with pytest.raises(ProtocolError, match="longer than its frame"):
        protocol.decode_minibatch([frame[:4] + b"\xff\xff\x00\x00" + frame[8:]])
    decoded = 0
    for _ in range(3000):
        garbled = bytearray(frame)
        for _ in range(rng.randrange(1, 4)):
            garbled[rng.randrange(4, len(garbled))] = rng.randrange(256)
        if rng.random() < 0.3:
            garbled = garbled[:rng.randrange(4, len(garbled))]
        try:
            arrays = protocol.decode_minibatch([bytes(garbled)])
        except ProtocolError:
            continue
        decoded += 1
        assert all(isinstance(a, np.ndarray) and not a.flags.writeable for a in arrays)
    assert decoded > 100  # flipped data bytes still decode: only the layout is checked


class _Tagged(np.ndarray):
    """An ndarray subclass: sent as its plain array."""


class _ArrayLike:
    """Not an ndarray, though it has the attributes of one: converted with __array__."""

    def __init__(self, array):
        self._array = array
        self.dtype, self.shape, self.strides = array.dtype, array.shape, array.strides

    def __array__(self, dtype=None, copy=None):
        return self._array


def _fortran_only(array):
    return array.flags.f_contiguous and not array.flags.c_contiguous


def test_layouts_seen_before_encode_and_decode_as_the_first_time():
    """The second minibatch of a layout takes the short way on both sides (a cache by
    type, dtype, shape and strides): it must give what the checked way gives, and arrays
    that differ only in memory order, strides, byte order or type must not be mistaken
    for it."""
    base = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    labels = np.arange(64)
    variants = [[base, labels], [base + 1, labels * 2],  # the same layout, other values
                [np.asfortranarray(base), labels],  # F order: same shape and dtype
                [base.T, labels],  # a transposed view: other strides
                [np.arange(2 * 64 * 64, dtype=np.float32).reshape(64, 128)[:, ::2], labels],
                [base.astype(">f4"), labels],  # byte-swapped dtype
                [base.view(_Tagged), labels],  # a subclass
                [_ArrayLike(base), labels],  # not an array: no buffer to pack directly
                [np.zeros((0, 64), np.float32), labels],  # an empty array
                [np.arange(protocol.PACK_MAX_BYTES // 8 + 1.0), labels]]  # too big to pack
    for arrays in variants * 3:
        for frames in (protocol.encode_minibatch(arrays),
                       protocol.encode_minibatch(iter(arrays)),  # any iterable
                       protocol.encode_minibatch(arrays, pack=True)):
            for wire in ([bytes(f) for f in frames], [bytearray(f) for f in frames]):
                got = protocol.decode_minibatch(wire)
                assert len(got) == len(arrays)
                for sent, received in zip(map(np.asarray, arrays), got):
                    assert type(received) is np.ndarray and not received.flags.writeable
                    assert received.dtype == sent.dtype and received.shape == sent.shape
                    assert _fortran_only(received) == _fortran_only(sent)
                    np.testing.assert_array_equal(received, sent)
    again = protocol.encode_minibatch([base, labels])  # as the first time, byte for byte
    assert again == protocol.encode_minibatch([base.copy(), labels.copy()])


def test_packed_header_seen_before_still_checks_each_frame():
    arrays = [np.arange(6.0).reshape(2, 3), np.arange(4)]
    frame = protocol.encode_minibatch(arrays)[0]
    protocol.decode_minibatch([frame])  # its header is now known
    with pytest.raises(ProtocolError, match="packed minibatch of %d bytes" % (len(frame) - 8)):
        protocol.decode_minibatch([frame[:-8]])
    with pytest.raises(ProtocolError, match="packed minibatch of %d bytes" % (len(frame) + 8)):
        protocol.decode_minibatch([frame + bytes(8)])
    with pytest.raises(ProtocolError, match="packed minibatch is one frame"):
        protocol.decode_minibatch([frame, b""])
    with pytest.raises(ProtocolError, match="longer than its frame"):
        protocol.decode_minibatch([frame[:4] + b"\xff\xff\x00\x00" + frame[8:]])
    length = int.from_bytes(frame[4:8], "little")
    with pytest.raises(ProtocolError):  # a shorter header length: the same bytes, misread
        protocol.decode_minibatch([frame[:4] + (length - 1).to_bytes(4, "little") + frame[8:]])
    for got, sent in zip(protocol.decode_minibatch([bytearray(frame)]), arrays):
        assert not got.flags.writeable
        np.testing.assert_array_equal(got, sent)


def test_split_header_seen_before_still_checks_each_frame():
    """A header then a frame per array (past PACK_MAX_BYTES), its header known: the short way
    still refuses a frame of the wrong size or count, as the checked way does."""
    arrays = [np.arange(protocol.PACK_MAX_BYTES // 8 + 1.0), np.arange(4)]
    header, big, small = [bytes(f) for f in protocol.encode_minibatch(arrays)]
    protocol.decode_minibatch([header, big, small])  # its header is now known
    with pytest.raises(ProtocolError, match="minibatch array 0: %d bytes" % (len(big) - 8)):
        protocol.decode_minibatch([header, big[:-8], small])
    with pytest.raises(ProtocolError, match="minibatch array 1: %d bytes" % (len(small) + 8)):
        protocol.decode_minibatch([header, big, small + bytes(8)])
    with pytest.raises(ProtocolError, match="describes 2 arrays but 1 data frames"):
        protocol.decode_minibatch([header, big])
    for got, sent in zip(protocol.decode_minibatch([header, bytearray(big), small]), arrays):
        assert not got.flags.writeable
        np.testing.assert_array_equal(got, sent)


def test_packed_slots_say_where_encode_minibatch_packs_each_array():
    """The controller packs into reused frames where packed_slots says: the prefix, then each
    array's bytes at its slot, zeros between, is the frame encode_minibatch makes."""
    arrays = [np.arange(12, dtype=np.int16).reshape(3, 4), np.arange(5.0), np.array(7, np.int8)]
    assert protocol.packed_slots([np.arange(13, dtype=np.int16), np.arange(3.0)]) is None  # unseen
    (expected,) = protocol.encode_minibatch(arrays)
    prefix, size, spans = protocol.packed_slots(arrays)
    frame = bytearray(size)
    frame[:len(prefix)] = prefix
    for a, (start, stop) in zip(arrays, spans):
        frame[start:stop] = a.tobytes()
    assert bytes(frame) == expected
    big = [np.arange(protocol.PACK_MAX_BYTES // 8 + 1.0)]
    protocol.encode_minibatch(big)
    fortran = [np.asfortranarray(np.ones((3, 4)))]
    protocol.encode_minibatch(fortran)
    assert protocol.packed_slots(big) is None and protocol.packed_slots(fortran) is None
    assert protocol.packed_slots([[1, 2]]) is None  # not arrays


def test_minibatch_requests_round_trip_and_garbage_is_refused():
    frame = protocol.encode_mb_request(7, "ab" * 16, 12, 9, window_bytes=5 << 30, epoch=3)
    assert protocol.decode_mb_request(frame) == (7, "ab" * 16, 12, 9, False, 5 << 30, 3)
    assert protocol.decode_mb_request(protocol.encode_mb_request(1, "t", 0, 0, bye=True))[4]
    for garbage in (b"", b"junk", b'{"worker_id": 1}', frame[:10], frame + b"x" * 300,
                    b"XXXX" + frame[4:], frame[:4] + b"\x02" + frame[5:],
                    protocol.encode_mb_request(1, "t", 0, (1 << 20) + 1),
                    frame[:-1] + b"\xff"):
        with pytest.raises(ProtocolError, match="minibatch request"):
            protocol.decode_mb_request(garbage)


def test_an_epoch_message_is_told_apart_from_minibatches_and_refusals():
    frame = protocol.encode_mb_epoch(5)
    assert protocol.mb_epoch([frame]) == 5
    assert protocol.mb_refusal([frame]) is None
    with pytest.raises(ProtocolError):
        protocol.decode_minibatch([frame])
    for other in ([frame, b""], [frame[:-1]], [protocol.encode_mb_epoch(0)],
                  [b"PMB\x01" + frame[4:]], protocol.encode_minibatch([np.zeros(1)]),
                  [protocol.encode_mb_refusal("no")]):
        assert protocol.mb_epoch(other) is None
