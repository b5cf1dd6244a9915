"""The worker's side of all_reduce: its views of the controller's buffers, and the meeting.

On a job of one node the workers meet in a buffer's segment without the controller:
each publishes its round number in the segment's control words and waits for the
others' (polling briefly, then sleeping in growing steps), and each reduces the slots in
worker-id order into its result (so every worker gets bit-identical results, run after
run). Where platoon's compiled module is built (`platoon.rules.kernels.Meeting`), a
round's copy, wait and float sum/mean run in C without the GIL, with the same control
words and lock as the Python path, so workers of either kind meet. The slots alternate
between two sets by round, so a worker may start the next round while another still
reads this one. A round is committed under the segment's lock by the first worker to
see every other arrived; a worker whose timeout runs out withdraws under that lock
unless the round was committed. Across nodes each worker sends one ``platoon-allreduce``
request instead (`platoon._controller.collectives`).
"""

import logging
import os
import time
import weakref
from typing import Any

import numpy as np

from .. import protocol
from .._centre.reduction import OPS, check_op, combine, reduction_layout
from .._centre.shmem import SharedCentre
from ..errors import ControllerTimeout, PlatoonError, RemoteError
from ..rules import kernels

log = logging.getLogger(__name__)

_SPIN_S = 2e-3           # poll, yielding the core between polls, this long; then sleep
_PAUSE_S = (50e-6, 1e-3)  # sleeps between polls, doubling (a sleep lasts 50 us at least)
# The compiled meeting (kernels.Meeting) first polls without yielding, this long, when the
# node's workers are no more than its cores: a peer a few microseconds late is seen at once
# instead of after a trip through the scheduler. With more workers than cores it yields
# from the start (the worker it waits for may need its core).
_BUSY_S = 50e-6
# ... and polls, yielding, for _SPIN_S plus the time of copying an array at 4 GB/s: workers of
# a large all_reduce drift apart by more than 2 ms, and a sleep would cost up to 1 ms.
_POLL_S_PER_BYTE = 0.25e-9
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
_MEETING_KINDS = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}  # reduced in C


class _Buffer:
    """A worker's view of one all_reduce buffer."""

    def __init__(self, seg, name, slot, slots, local, dtype):
        self.seg, self.name, self.slot, self.slots, self.local = seg, name, slot, slots, local
        self.dtype = dtype
        self.data, control = seg.arrays
        self.count = self.data.shape[1]  # elements of an array
        self.arrived = control[:slots]                      # each worker's last round
        self.ops = control[slots:3 * slots].reshape(2, slots)  # each worker's op, by parity
        self.control = control
        self.round = 0  # this worker's completed rounds in shared memory
        self.op_codes = {}  # op -> its index in OPS, for the ops checked against dtype
        self.meeting = None  # the compiled round (kernels.Meeting), where there is one
        if local and kernels.Meeting is not None:
            try:
                self.meeting = kernels.Meeting(self.data, control, slot, slots,
                                               seg.lock.fileno(), _MEETING_KINDS.get(dtype, 0))
            except (ValueError, OSError, BufferError, NotImplementedError) as exc:
                log.info("all_reduce buffer %s: meeting in Python (%s)", name, exc)
            else:
                _MEETINGS.add(self)
        self.busy_ns = int(_BUSY_S * 1e9) if slots <= _CORES else 0
        self.poll_s = _SPIN_S + self.data[0].nbytes * _POLL_S_PER_BYTE
        self.poll_ns = int(self.poll_s * 1e9)

    def meet(self, array, op, out, timeout_s):
        """One round in shared memory (see the module docstring); the result into `out`."""
        slot, slots = self.slot, self.slots
        r = self.round + 1
        meeting = self.meeting
        if meeting is not None:  # the round in C, and the reduction where it can
            poll_ns = self.poll_ns if timeout_s is None or timeout_s >= self.poll_s \
                else int(timeout_s * 1e9)
            code = self.op_codes[op]
            status = meeting.meet(array, out, r, code, self.busy_ns, poll_ns)
            if status == kernels.MEET_COPY:  # not C-contiguous: copy here
                np.copyto(self._rows(r)[slot].reshape(array.shape), array)
                status = meeting.meet(None, out, r, code, self.busy_ns, poll_ns)
            if status == kernels.MEET_DONE:
                self.round = r
                return
            if status == kernels.MEET_GONE:
                raise self._gone(int(self.control[-1]))
            if status == kernels.MEET_PENDING:
                self._wait_for_all(r, timeout_s, time.monotonic() - poll_ns * 1e-9, polled=True)
        else:
            np.copyto(self._rows(r)[slot].reshape(array.shape), array)
            self.ops[r % 2, slot] = OPS.index(op)
            self.control[slot] = r  # publishes the slot
            self._wait_for_all(r, timeout_s, time.monotonic())
        self.round = r
        ops = self.ops[r % 2].tolist()
        if len(set(ops)) != 1:
            raise RemoteError("the workers called all_reduce with different ops: %s; every "
                              "worker must call the same collectives with the same op" % ", ".join(
                                  "worker %d: %s" % (w, OPS[o]) for w, o in enumerate(ops)),
                              "PlatoonError")
        # The controller's order and operations (NodeCollectives._reduce): the same bits.
        contiguous = out.flags.c_contiguous
        result = out.reshape(-1) if contiguous else np.empty(out.size, out.dtype)
        combine(result, self._rows(r), op)
        if op == "mean":
            np.divide(result, slots, out=result, casting="unsafe")
        if not contiguous:
            out[...] = result.reshape(out.shape)

    def _rows(self, r):
        """The slots of round r."""
        return self.data[(r % 2) * self.slots:(r % 2 + 1) * self.slots]

    def _all_arrived(self, r):
        return min(self.arrived.tolist()) >= r

    @staticmethod
    def _gone(gone):
        return RemoteError("worker %d has left the job, so all_reduce cannot complete; every "
                           "worker must call the same collectives" % (gone - 1), "PlatoonError")

    def _wait_for_all(self, r, timeout_s, start, polled=False):
        """Wait for round r, from `start` (time.monotonic()); `polled`: the compiled meeting
        has polled already, so sleep between polls from the start."""
        control, lock = self.control, self.seg.lock
        deadline = None if timeout_s is None else start + timeout_s
        pause = _PAUSE_S[0]
        while True:
            if control[-2] >= r:  # another worker committed the round
                return
            if self._all_arrived(r) and lock.try_acquire():  # busy: poll again
                try:  # commit, unless someone withdrew meanwhile
                    if self._all_arrived(r) or control[-2] >= r:
                        control[-2] = max(int(control[-2]), r)
                        return
                finally:
                    lock.release()
            gone = int(control[-1])  # checked after the round: one that left after it is fine
            if gone:
                raise self._gone(gone)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                with _held(lock, timeout_s):
                    if control[-2] >= r:  # the round was committed: it stands
                        return
                    control[self.slot] = r - 1  # withdraw
                raise ControllerTimeout(
                    "all_reduce: not every worker arrived within %.3g s (the others must call "
                    "the same collectives); this worker withdrew from the round" % timeout_s)
            if not polled and now - start < _SPIN_S:
                os.sched_yield()  # to the worker we wait for, if it shares our core
            else:
                time.sleep(pause)
                pause = min(2 * pause, _PAUSE_S[1])


class _held:
    """The segment's lock, held for a `with` block (waiting at most `timeout_s`)."""

    def __init__(self, lock, timeout_s):
        self.lock, self.timeout_s = lock, timeout_s

    def __enter__(self):
        self.lock.acquire(None if self.timeout_s is None else max(self.timeout_s, 1.0))

    def __exit__(self, *exc):
        self.lock.release()


# Buffers with a compiled meeting: a forked child must not use its parent's lock descriptor.
_MEETINGS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _forget_meetings_after_fork():
    for buf in list(_MEETINGS):
        buf.meeting = None
    _MEETINGS.clear()


os.register_at_fork(after_in_child=_forget_meetings_after_fork)


class WorkerCollectives:
    """The worker's side: attached all_reduce and state segments, released by `close`."""

    def __init__(self):
        self.reductions = {}  # (dtype str, count) -> _Buffer
        self.segments = []
        self._last = None  # the _Buffer of the last all_reduce (a loop reduces one shape)

    def attach(self, name, layout):
        seg = SharedCentre.attach(name, layout, striped=False)
        self.segments.append(seg)
        return seg

    def all_reduce(self, send_req, array, op, out, timeout_s):
        """`Worker.all_reduce`, through `send_req` (the worker's); `timeout_s` in seconds
        (None: forever)."""
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        buf = self._last  # the checks below cost more than a 1K round: skip what was checked
        if buf is None or buf.dtype is not array.dtype or buf.count != array.size:
            buf = None
        if buf is None or type(op) is not str or op not in buf.op_codes:
            check_op(op, array.dtype)
        out = array if out is None else out
        if out is not array and (not isinstance(out, np.ndarray) or out.shape != array.shape
                                 or out.dtype != array.dtype) or not out.flags.writeable:
            raise ValueError("all_reduce writes into a writable numpy array of the input's shape "
                             "%s and dtype %s; got %r" % (array.shape, array.dtype, out))
        if buf is None:
            buf = self._buffer(send_req, array)
        if op not in buf.op_codes:
            buf.op_codes[op] = OPS.index(op)
        self._last = buf
        if buf.local:
            buf.meet(array, op, out, timeout_s)
            return out
        np.copyto(buf.data[buf.slot].reshape(array.shape), array)
        try:
            send_req(protocol.ALLREDUCE, {"segment": buf.name, "op": op}, timeout_s=timeout_s)
        except ControllerTimeout:  # withdraw, so the others do not reduce without us
            try:
                send_req(protocol.ALLREDUCE_CANCEL, {"segment": buf.name}, timeout_s=1.0)
            except PlatoonError:
                pass
            raise
        np.copyto(out, buf.data[2 * buf.slots].reshape(array.shape))
        return out

    def _buffer(self, send_req, array):
        """The _Buffer for arrays of `array`'s dtype and size, set up on first use."""
        key = (array.dtype.str, array.size)
        buf = self.reductions.get(key)
        if buf is None:
            reply = send_req(protocol.ALLREDUCE_SETUP,
                             {"dtype": array.dtype.str, "count": array.size})
            seg = self.attach(reply["segment"], reduction_layout(
                array.dtype.str, reply["slots"], array.size))
            buf = self.reductions[key] = _Buffer(seg, reply["segment"], reply["slot"],
                                                 reply["slots"], bool(reply.get("local")),
                                                 array.dtype)
        return buf

    def close(self):
        for buf in self.reductions.values():
            buf.meeting = None
        for seg in self.segments:
            seg.close()
        self.segments = []
        self.reductions = {}
        self._last = None
