"""Encoding, decoding and validation of control and data messages (no sockets)."""

import json

import numpy as np
import pytest

from platoon import ProtocolError, RemoteError
from platoon import protocol


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
