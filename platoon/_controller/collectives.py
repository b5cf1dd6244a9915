"""The controller's side of all_reduce and of shared state segments.

`Worker.all_reduce` writes its array into its own slot of a controller-owned
segment (one per (dtype, size), created here on first use and reused; its layout is
`platoon._centre.reduction`'s). On a job of one node the workers then meet in the
segment without the controller (`platoon._worker.collectives`); the controller marks
the segment when a worker leaves, which fails the waiting workers at once. Across nodes
(a node link), each worker instead sends one ``platoon-allreduce`` request: when every
worker of the node has arrived, the controller reduces the slots in worker-id order,
hands the result to the node link (MPI) and replies to all; each worker copies the
result out.

Also here: controller-owned named state segments (`platoon-init-state`, used by
Downpour's optimizer).
"""

import logging
import platform
import re
import weakref
from typing import Any, Dict

import numpy as np

from .. import protocol
from .._centre.reduction import check_op, combine, reduction_layout
from .._centre.shmem import SharedCentre, param_offsets
from ..errors import PlatoonError, ProtocolError
from .services import ControllerServices

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# A registered worker can ask for buffers and states; these bound what it can make us hold.
MAX_REDUCTION_BUFFERS = 64
MAX_STATES = 16


# The workers of one node meet in shared memory only where stores become visible to other
# cores in program order (x86's TSO): a slot's values before the round number that
# publishes them. Elsewhere every round goes through the controller.
_MEET_IN_SHM = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


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
        segment = info.get("segment") if isinstance(info, dict) else None
        red = self._reductions.get(segment) if segment is not None else None
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
        from .._centre.checkpoint import load_states  # zipfile and hashlib: only on resume
        saved = load_states(path, allow_nonfinite=self._ctl.allow_nonfinite).get(name)
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


__all__ = ["NodeCollectives", "create_segment"]
