"""Synchronous collectives of a node's workers, through shared memory.

`Worker.all_reduce` writes its array into its own slot of a controller-owned
segment (one per (dtype, size), created on first use and reused). On a job of
one node the workers then meet in the segment without the controller: each
publishes its round number in the segment's control words and waits for the
others' (polling briefly, then sleeping in growing steps), and each reduces
the slots in worker-id order into its result (so every worker gets
bit-identical results, run after run). Where platoon's compiled module is
built (`platoon.rules.kernels.Meeting`), a round's copy, wait and float
sum/mean run in C without the GIL, with the same control words and lock as
the Python path, so workers of either kind meet. The slots alternate between
two sets by round, so a worker may start the next round while another still
reads this one. A round is committed under the segment's lock by the first
worker to see every other arrived; a worker whose timeout runs out withdraws
under that lock unless the round was committed. The controller marks the segment when a worker
leaves, which fails the waiting workers at once. Across nodes (a node link),
each worker instead sends one ``platoon-allreduce`` request: when every worker
of the node has arrived, the controller reduces the slots in worker-id order,
hands the result to the node link (MPI) and replies to all; each worker copies
the result out.

Also here: controller-owned named state segments (`platoon-init-state`, used by
Downpour's optimizer) and `average_gradients`, synchronous data-parallel SGD.
"""

import logging
import os
import platform
import re
import time
import weakref
from typing import Any, Dict

import numpy as np

from . import adapters, protocol
from ._centre.shmem import SharedCentre, param_offsets
from ._controller.services import ControllerServices
from .compat.deprecation import renamed_keywords
from .errors import ControllerTimeout, PlatoonError, ProtocolError, RemoteError
from .rules import kernels

log = logging.getLogger(__name__)

OPS = ("sum", "mean", "max", "min")
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_op(op, dtype):
    """Validate reduction `op` for `dtype`; raises ValueError or TypeError saying what fits."""
    if op not in OPS:
        raise ValueError("all_reduce op must be one of %s, got %r" % (", ".join(OPS), op))
    dtype = np.dtype(dtype)
    if dtype.kind not in "iufc":
        raise TypeError("all_reduce needs a numeric array (integer, float or complex), got %s"
                        % dtype)
    if op == "mean" and dtype.kind in "iu":
        raise TypeError("all_reduce op 'mean' needs a float array, got %s: reduce with 'sum' "
                        "and divide, or convert to float first" % dtype)
    if op in ("max", "min") and dtype.kind == "c":
        raise TypeError("all_reduce op %r is not defined for complex %s" % (op, dtype))


# A registered worker can ask for buffers and states; these bound what it can make us hold.
MAX_REDUCTION_BUFFERS = 64
MAX_STATES = 16


# The workers of one node meet in shared memory only where stores become visible to other
# cores in program order (x86's TSO): a slot's values before the round number that
# publishes them. Elsewhere every round goes through the controller.
_MEET_IN_SHM = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
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


def combine(result, rows, op):
    """result = rows[0] op rows[1] op ... in that order (a mean's sum: the caller divides);
    every reduction of all_reduce, so that all give the same bits."""
    ufunc = _UFUNCS[op]
    np.copyto(result, rows[0])
    for row in rows[1:]:
        ufunc(result, row, out=result)


def reduction_layout(dtype_str, slots, count):
    """The segment of an all_reduce buffer: two sets of `slots` slots and the controller's
    result row; control words (int64): each worker's round, each worker's op by parity,
    the last committed round, and 1 + the id of a worker that left (0: none)."""
    return [{"dtype": dtype_str, "shape": [2 * slots + 1, count]},
            {"dtype": "<i8", "shape": [3 * slots + 2]}]


def create_segment(job_id, kind, layout):
    """A new zero-filled controller-owned segment of job `job_id` holding `layout`, without
    stripes, under a random name ``/platoon-JOB-KIND-TOKEN`` (see `SharedCentre.create`)."""
    return SharedCentre.create(job_id, layout, kind, striped=False)


class _Reduction:
    """One all_reduce buffer: a slot per worker, then the result."""

    def __init__(self, seg, dtype, count, slots):
        self.dtype, self.count, self.slots = dtype, count, slots
        self.seg = seg
        self.buffer = self.seg.arrays[0]
        self.control = self.seg.arrays[1]  # see reduction_layout
        self.waiting = {}  # worker id -> (envelope, seq, op)

    def mark_gone(self, wid):
        """Tell workers meeting in shared memory that worker `wid` left the job."""
        if not self.control[-1]:
            self.control[-1] = wid + 1

    @property
    def committed(self):
        """Rounds completed in shared memory."""
        return int(self.control[-2])


class NodeCollectives:
    """The controller's side of all_reduce and of shared state segments.

    `ctl` (held weakly) is the controller, used only through its
    `platoon._controller.services.ControllerServices` interface: `job_id`, `num_workers`,
    `node_link`, `resume_from`, `reply`, `fail`, `departed_workers` and `reserve_shared`.
    """

    def __init__(self, ctl: ControllerServices):
        self._ctl = weakref.proxy(ctl)
        self._reductions: Dict[str, Any] = {}  # segment name -> _Reduction
        self._reduction_names: Dict[Any, str] = {}  # (dtype, count) -> segment name
        self._states: Dict[str, SharedCentre] = {}      # state name -> SharedCentre
        self._rounds = 0  # completed through the controller

    @property
    def rounds(self):
        """Completed all_reduce rounds, through the controller or in shared memory."""
        return self._rounds + sum(red.committed for red in self._reductions.values())

    def _expected(self):
        n = self._ctl.num_workers
        if n is None:
            raise PlatoonError("all_reduce needs the controller to know how many workers take "
                               "part: pass num_workers=N to the Controller (the launcher does)")
        return n

    def _create(self, kind, layout, what):
        self._ctl.reserve_shared(param_offsets(layout)[1], what)
        return create_segment(self._ctl.job_id, kind, layout)

    def shared_bytes(self):
        """Bytes of shared memory held by all_reduce buffers and shared states."""
        return sum(seg.size for seg in [r.seg for r in self._reductions.values()]
                   + list(self._states.values()))

    # -- all_reduce --

    def setup(self, wid, info):
        """``platoon-allreduce-setup`` {dtype, count}: the segment and slot for this worker."""
        if not isinstance(info, dict):
            raise ProtocolError("platoon-allreduce-setup needs an object {dtype, count}")
        dtype = protocol.parse_dtype(info.get("dtype"), "all_reduce")
        count = info.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ProtocolError("platoon-allreduce-setup: count must be an integer >= 0")
        slots = self._expected()
        if wid >= slots:
            raise PlatoonError("worker %d is a replacement (ids 0-%d started the job): all_reduce "
                               "needs the same workers throughout, so do not combine it with "
                               "worker restarts" % (wid, slots - 1))
        name = self._reduction_names.get((dtype.str, count))
        if name is None:
            if len(self._reductions) >= MAX_REDUCTION_BUFFERS:
                raise PlatoonError("this job already has %d all_reduce buffers (one per dtype "
                                   "and size); reduce fewer distinct shapes, e.g. concatenate "
                                   "arrays first" % MAX_REDUCTION_BUFFERS)
            seg = self._create("ar-%s-%d" % (dtype.str[1:], count),
                               reduction_layout(dtype.str, slots, count), "an all_reduce buffer")
            name = self._reduction_names[(dtype.str, count)] = seg.name
            self._reductions[name] = _Reduction(seg, dtype, count, slots)
            log.info("all_reduce buffer %s: %d slots of %d x %s", name, 2 * slots + 1, count,
                     dtype)
        gone = self._ctl.departed_workers()
        if gone:
            self._reductions[name].mark_gone(gone[0])
        return {"segment": name, "slots": slots, "slot": wid,
                "local": self._ctl.node_link is None and _MEET_IN_SHM}

    def join(self, envelope, seq, wid, info):
        """``platoon-allreduce`` {segment, op}: deferred until every worker has joined."""
        if not isinstance(info, dict) or info.get("segment") not in self._reductions:
            raise ProtocolError("platoon-allreduce: unknown segment; call "
                                "platoon-allreduce-setup first (Worker.all_reduce does)")
        red = self._reductions[info["segment"]]
        op = info.get("op")
        check_op(op, red.dtype)
        gone = self._ctl.departed_workers()
        if gone:
            raise PlatoonError("worker %d has left the job, so all_reduce cannot complete; "
                               "every worker must call the same collectives" % gone[0])
        if wid in red.waiting:
            raise ProtocolError("worker %d joined the same all_reduce twice" % wid)
        red.waiting[wid] = (envelope, seq, op)
        self._maybe_reduce(red)

    def cancel(self, wid, info):
        """``platoon-allreduce-cancel`` {segment}: the worker gave up waiting (its timeout)."""
        red = self._reductions.get(info.get("segment")) if isinstance(info, dict) else None
        if red is not None:
            red.waiting.pop(wid, None)

    def _maybe_reduce(self, red):
        if len(red.waiting) < self._expected():
            return
        waiting, red.waiting = red.waiting, {}
        ops = {op for _, _, op in waiting.values()}
        if len(ops) != 1:
            self._fail(waiting, PlatoonError(
                "the workers called all_reduce with different ops: %s; every worker must call "
                "the same collectives with the same op" % ", ".join(
                    "worker %d: %s" % (w, o) for w, (_, _, o) in sorted(waiting.items()))))
            return
        try:
            self._reduce(red, sorted(waiting), ops.pop())
        except Exception as exc:  # the other nodes, if any, failed this round too
            log.warning("all_reduce failed: %s", exc)
            for envelope, seq, _ in waiting.values():
                self._ctl.fail(envelope, seq, exc)
            return
        self._rounds += 1
        for envelope, seq, _ in waiting.values():
            self._ctl.reply(envelope, seq, None)

    def _reduce(self, red, slots, op):
        buf = red.buffer
        result = buf[2 * red.slots]
        combine(result, [buf[k] for k in slots], op)
        total = len(slots)
        link = self._ctl.node_link
        if link is not None:
            total = link.all_reduce(result, op)
        if op == "mean":
            np.divide(result, total, out=result, casting="unsafe")

    def _fail(self, waiting, exc):
        """Fail a round before it reached the other nodes: they must fail it too, or they
        would pair their round with this node's next one."""
        log.warning("all_reduce failed: %s", exc)
        link = self._ctl.node_link
        if link is not None:
            link.fail_round(str(exc))
        for envelope, seq, _ in waiting.values():
            self._ctl.fail(envelope, seq, exc)

    def worker_left(self, wid):
        """Worker `wid` is done: fail every all_reduce that waits for it."""
        for red in self._reductions.values():
            red.mark_gone(wid)
            if red.waiting:
                waiting, red.waiting = red.waiting, {}
                self._fail(waiting, PlatoonError(
                    "worker %d has left the job while the others waited in all_reduce; every "
                    "worker must call the same collectives" % wid))

    # -- named state segments --

    def state(self, info):
        """``platoon-init-state`` {name, layout}: a zero-filled segment, created once per name."""
        if not isinstance(info, dict) or not isinstance(info.get("name"), str) \
                or not _NAME.match(info["name"]):
            raise ProtocolError("platoon-init-state needs a name of letters, digits, '_.-'")
        layout = protocol.validate_layout(info.get("layout"))
        name = info["name"]
        seg = self._states.get(name)
        if seg is None:
            if len(self._states) >= MAX_STATES:
                raise PlatoonError("this job already has %d shared states" % MAX_STATES)
            seg = self._create("state-%s" % name, layout, "shared state %r" % name)
            try:
                self._resume_state(name, seg)
            except BaseException:
                seg.close()
                seg.unlink()
                raise
            self._states[name] = seg
            log.info("shared state %r created: %d arrays, %d bytes", name, len(layout), seg.size)
        else:
            mismatch = protocol.describe_mismatch(layout, seg.layout)
            if mismatch:
                raise PlatoonError("shared state %r: %s" % (name, mismatch))
        return {"segment": seg.name}

    def _resume_state(self, name, seg):
        """Fill a new state segment from the controller's `resume_from` checkpoint, if any."""
        path = self._ctl.resume_from
        if not path:
            return
        from ._centre.checkpoint import load_states  # zipfile and hashlib: only on resume
        saved = load_states(path).get(name)
        if saved is None:
            log.warning("checkpoint %s holds no shared state %r: it starts from zero", path, name)
            return
        mismatch = protocol.describe_mismatch(seg.layout, protocol.layout_of(saved))
        if mismatch:
            raise PlatoonError("shared state %r in checkpoint %s does not fit: %s"
                               % (name, path, mismatch))
        for dst, src in zip(seg.arrays, saved):
            dst[...] = src
        log.info("shared state %r resumed from %s", name, path)

    @property
    def states(self):
        """Shared state arrays by name (for checkpoints)."""
        return {name: seg.arrays for name, seg in self._states.items()}

    def close(self):
        """Unmap and unlink every segment. Idempotent."""
        for seg in [r.seg for r in self._reductions.values()] + list(self._states.values()):
            seg.close()
            seg.unlink()
        self._reductions = {}
        self._reduction_names = {}
        self._states = {}


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


@renamed_keywords(timeout="timeout_s")
def average_gradients(worker, grads, *, timeout_s=None):
    """Synchronous data-parallel SGD: replace each array in `grads` by its mean over all workers.

    `grads` are numpy arrays or torch tensors (CPU tensors are reduced in place
    through numpy views; CUDA tensors are copied to host and back), or a torch
    ``nn.Module``, whose parameters' ``.grad`` are averaged (every parameter
    that requires a gradient must have one: call ``backward()`` first). Arrays
    of one dtype travel together in one all_reduce. Call it every step on every
    worker, after the backward pass, before the optimizer step. Returns
    `grads` (the list of gradients for a module). `timeout_s` bounds each
    all_reduce (None: forever). Raises TypeError for other arrays, and as
    `Worker.all_reduce`.
    """
    grads = _gradients_of(grads)
    arrays, install = adapters.host_arrays(grads)
    by_dtype = {}
    for g in arrays:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        flat = np.concatenate([g.reshape(-1) for g in group]) if len(group) > 1 \
            else np.ascontiguousarray(group[0]).reshape(-1).copy()
        worker.all_reduce(flat, "mean", timeout_s=timeout_s)
        pos = 0
        for g in group:
            g[...] = flat[pos:pos + g.size].reshape(g.shape)
            pos += g.size
    install()
    return grads


def _gradients_of(grads):
    """The list of arrays `grads`, or the gradients of a torch module's parameters."""
    if adapters.framework_of(grads) == "torch" and hasattr(grads, "parameters"):  # nn.Module
        found = []
        for name, p in grads.named_parameters():
            if p.requires_grad:
                if p.grad is None:
                    raise TypeError("parameter %s has no gradient; call backward() before "
                                    "average_gradients(), on every worker" % name)
                found.append(p.grad)
        return found
    return list(grads)


__all__ = ["OPS", "NodeCollectives", "average_gradients", "check_op", "create_segment"]
