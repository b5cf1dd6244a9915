"""What `send_mb`'s default path copies: what raw pyzmq's copying send would (each array once),
so the caller may reuse its arrays as soon as send_mb returns, and no Python-owned memory
handed to ZeroMQ without a copy (pyzmq's garbage-collector thread wakes for each such frame);
and what runs per minibatch: not pyzmq's Python wrapper of its send."""

import contextlib
import os
import sys
import threading

import numpy as np
import zmq
import zmq.utils.garbage

from platoon import Controller, Worker
from platoon.protocol import PACK_MAX_BYTES


@contextlib.contextmanager
def zero_copy_frames():
    """Yields a list that gets the type of every object pyzmq sends without copying (it
    keeps each in its garbage collector's store until ZeroMQ releases the frame)."""
    collector = zmq.utils.garbage.gc
    stored = []
    store = collector.store

    def counting_store(obj, event=None):
        stored.append(type(obj))
        return store(obj, event)
    collector.store = counting_store  # an instance attribute: the Cython code looks it up
    try:
        yield stored
    finally:
        del collector.store


def test_send_mb_copies_each_array_once_into_a_zeromq_message(serve):
    """Before: a minibatch past PACK_MAX_BYTES was packed into a new bytes object (the copy),
    which was then sent without a copy: pyzmq's collector thread woke for every minibatch to
    release it, taking the GIL from the sending thread. Now each array is copied once, into a
    ZeroMQ message that the channel keeps for a re-send."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    batch = [np.zeros(PACK_MAX_BYTES // 4 + 1024, np.float32), np.zeros(100, np.int64)]
    got, errors = [], []

    def work():
        try:
            with Worker(ctl.control_port, timeout_s=10) as w:
                w.init_mb_sock(ctl.data_port)
                for _ in range(5):
                    x, y = w.recv_mb()
                    got.append((float(x.min()), float(x.max()), int(y.min()), int(y.max())))
        except Exception as exc:  # reported by the assertions below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    with zero_copy_frames() as stored:
        for i in range(5):
            batch[0][:], batch[1][:] = i, 10 * i
            assert ctl.send_mb(batch, timeout_s=10) == 0
            held = ctl._mb.peers[0].unacked[-1][1]  # the frames kept for a re-send
            batch[0][:], batch[1][:] = -1, -1  # reused at once: what was sent is unchanged
            assert len(held) == 3 and all(type(f) is zmq.Frame for f in held[1:])
            assert [len(f) for f in held[1:]] == [a.nbytes for a in batch]
        ctl.flush_mb(timeout_s=10)
    worker.join(15)
    assert not errors and got == [(i, i, 10 * i, 10 * i) for i in range(5)]
    assert stored == []
    serving.join()


def test_small_minibatches_travel_packed_in_one_frame(serve):
    """Up to PACK_MAX_BYTES a minibatch is joined into one frame (its copy): one frame costs
    the sender and the worker less than a frame per array."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    batch = [np.ones((64, 64), np.float32), np.arange(64, dtype=np.int64)]  # 16 KiB
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_mb_sock(ctl.data_port)
        sender = threading.Thread(target=lambda: ctl.send_mb(batch, timeout_s=10))
        with zero_copy_frames() as stored:
            sender.start()
            x, y = w.recv_mb()
            sender.join(10)
        assert len(ctl._mb.peers[0].unacked[-1][1]) == 1 and stored == []
        np.testing.assert_array_equal(x, batch[0])
        np.testing.assert_array_equal(y, batch[1])
    serving.join()


def test_a_packed_minibatch_is_filled_into_a_zeromq_message_sent_by_reference(serve):
    """The packing is the only copy: send_mb fills a ZeroMQ message (a zmq.Frame of ZeroMQ's
    memory) and sends it by reference. Before: it packed into a bytearray that pyzmq's copying
    send then copied again into a new message, which ZeroMQ's I/O thread freed (a second
    16 KiB copy, an allocation and a free per minibatch)."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    batch = [np.ones((64, 64), np.float32), np.arange(64, dtype=np.int64)]  # 16 KiB
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_mb_sock(ctl.data_port)
        sender = threading.Thread(target=lambda: [ctl.send_mb(batch, timeout_s=10)
                                                  for _ in range(2)])  # the 2nd: packed
        with zero_copy_frames() as stored:
            sender.start()
            w.recv_mb()
            x, y = w.recv_mb()
            sender.join(10)
        (frame,) = ctl._mb.peers[0].unacked[-1][1]
        assert isinstance(frame, zmq.Frame) and stored == []  # ZeroMQ's memory, not Python's
        np.testing.assert_array_equal(x, batch[0])
        np.testing.assert_array_equal(y, batch[1])
    serving.join()


def test_a_packed_copy_is_reused_once_acknowledged_and_never_before(serve):
    """send_mb's packed copies are kept until acknowledged: each new one used to be written
    into fresh memory, mapped in again after the allocator had returned the acknowledged ones
    to the system (page faults). Now the frame of an acknowledged minibatch of the same
    layout is reused: 60 minibatches through a window of 4 need a few frames, and each
    arrives as it was sent (none was overwritten while the worker could still need it)."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    batch = [np.zeros((64, 64), np.float32), np.zeros(64, np.int64)]  # 16 KiB: packed
    got, errors = [], []

    def work():
        try:
            with Worker(ctl.control_port, timeout_s=10) as w:
                w.init_mb_sock(ctl.data_port, prefetch=3)
                for _ in range(60):
                    x, y = w.recv_mb()
                    got.append((float(x.min()), float(x.max()), int(y.min()), int(y.max())))
        except Exception as exc:  # reported by the assertions below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    frames = []  # held: every frame's identity stays its own
    for i in range(60):
        batch[0][:], batch[1][:] = i, -i
        ctl.send_mb(batch, timeout_s=10)
        frames.append(ctl._mb.peers[0].unacked[-1][1][0])
    ctl.flush_mb(timeout_s=10)
    worker.join(15)
    assert not errors and got == [(i, i, -i, -i) for i in range(60)]
    assert len({id(f) for f in frames}) <= 8  # the first (encoded), then at most a window's
    serving.join()


def test_packed_buffers_pack_every_plain_layout_as_encode_minibatch_does():
    """Pure logic of PackedBuffers: the frame it fills, new or given back, holds the bytes
    encode_minibatch packs, for every plain dtype and shape (empty and 0-d arrays too, whose
    views cannot be cast to bytes), and nothing before encode_minibatch has seen the layout."""
    from platoon import protocol
    from platoon._controller.minibatches import PackedBuffers
    buffers = PackedBuffers()
    layouts = [[np.arange(5, dtype=">i4")], [np.ones(3, np.complex64), np.array([True, False])],
               [np.float16([1, 2])], [np.array(3.5)], [np.zeros((0, 4), np.float32), np.arange(3)],
               [np.zeros((2, 0))], [np.arange(24.0).reshape(2, 3, 4), np.arange(6, dtype=np.uint8)]]
    assert buffers.pack([np.arange(7, dtype=np.int8).reshape(7, 1)]) is None  # not encoded yet
    for arrays in layouts:
        for _ in range(3):
            arrays = [np.roll(a, 1) for a in arrays]  # new values in the frame given back
            (expected,) = protocol.encode_minibatch(arrays)
            (frame,) = buffers.pack(arrays)
            assert bytes(frame) == expected
            buffers.give_back(frame)


def test_a_re_sent_packed_copy_is_never_refilled(serve):
    """A minibatch re-sent (its worker left without taking it) went out on two connections,
    and ZeroMQ may still be writing it on the first: its frame is not refilled once the
    second worker acknowledges it. The one the first worker took and acknowledged is."""
    from platoon import protocol
    ctl = Controller(control_port=0, data_port=0, num_workers=2)
    serving = serve(ctl)
    batch = [np.zeros((64, 64), np.float32), np.zeros(64, np.int64)]  # 16 KiB: packed
    protocol.encode_minibatch(batch)  # a layout seen before: every send_mb packs
    first = Worker(ctl.control_port, timeout_s=10)
    second = Worker(ctl.control_port, timeout_s=10)
    try:
        first.init_mb_sock(ctl.data_port, prefetch=3)  # a window of 4
        second.init_mb_sock(ctl.data_port)
        taken = []
        taker = threading.Thread(target=lambda: taken.append(int(first.recv_mb()[0][0, 0])))
        taker.start()
        for i in range(4):
            batch[0][:] = i
            assert ctl.send_mb(batch, timeout_s=10) == first.worker_id
        taker.join(10)
        frames = [f for _, (f,), _ in ctl._mb.peers[first.worker_id].unacked]
        first.close()  # took minibatch 0: 1 to 3 go to the second worker
        taker = threading.Thread(target=lambda: taken.extend(
            int(second.recv_mb()[0][0, 0]) for _ in range(3)))
        flusher = threading.Thread(target=ctl.flush_mb, args=(10,))  # re-sends them
        taker.start()
        flusher.start()
        taker.join(10)
        second.close()  # acknowledges them: the flush ends
        flusher.join(10)
        assert taken == [0, 1, 2, 3] and not ctl._mb.peers
        free = [id(f) for kept in ctl._mb.packed._free.values() for f in kept]
        assert [id(f) in free for f in frames] == [True, False, False, False]
    finally:
        first.close()
        second.close()
    serving.join()


def test_send_mb_sends_without_pyzmqs_python_wrapper(serve):
    """send_mb calls pyzmq's send itself: zmq.Socket.send's Python wrapper (which adds only
    the draft sockets' routing_id= and group=, and passes the rest on by keyword) cost a few
    microseconds of CPU per minibatch on this machine. Before: two calls of it per minibatch
    (the worker's identity, then the frame). (Reading the workers' requests, a few per
    window, still goes through pyzmq's recv_multipart.)"""
    zmq_dir = os.path.dirname(zmq.__file__)
    batch = [np.ones((64, 64), np.float32), np.arange(64, dtype=np.int64)]
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_mb_sock(ctl.data_port)
        taker = threading.Thread(target=lambda: [w.recv_mb() for _ in range(400)])
        taker.start()
        for _ in range(200):  # the layout seen, frames to refill, the worker streaming
            ctl.send_mb(batch, timeout_s=10)
        called = []

        def count(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(zmq_dir) \
                    and frame.f_code.co_name.startswith("send"):
                called.append(frame.f_code.co_name)
        sys.setprofile(count)
        try:
            for _ in range(200):
                ctl.send_mb(batch, timeout_s=10)
        finally:
            sys.setprofile(None)
        taker.join(15)
    assert not taker.is_alive() and called == []
    serving.join()
