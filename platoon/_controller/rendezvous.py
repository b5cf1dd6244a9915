"""Where workers wait for each other: the barrier, and the centre's initialisation.

The centre is created by the first worker to register its parameters. Its first
values come from a checkpoint when resuming, else from one worker, the
initialiser (the first to register): it is told to write them, and the others
wait (their replies are deferred) until it reports them written. If it leaves
before that, the next waiting worker takes over. On an elastic node the first values may
come from a live peer: the node link decides that (`initial_centre`) while the workers'
replies are deferred and the controller serves on (`poll_initial_centre`).
"""

import logging
from typing import Dict, List, Optional, Tuple

from .. import protocol
from .._centre.shmem import SharedCentre, param_offsets
from .._resources import Resources
from ..errors import LayoutMismatch, PlatoonError, ProtocolError
from .checkpointing import Resume
from .registry import WorkerRecord, WorkerRegistry
from .services import ControllerServices

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name

Waiter = Tuple[list, Optional[int]]  # (envelope, seq) of a deferred reply


class Rendezvous:
    """The barrier and the centre's initialisation for `ctl` (a `ControllerServices`).

    The centre is kept in `res.centre`; `resume`, if given, supplies its first values.
    """

    def __init__(self, ctl: ControllerServices, registry: WorkerRegistry, res: Resources,
                 resume: Optional[Resume]):
        self._ctl = ctl
        self._registry = registry
        self._res = res
        self._resume = resume
        # The parameters' names, for checkpoints: the checkpoint's, else the first worker's
        # to give any (None: unnamed).
        self.names: Optional[List[str]] = resume.names if resume is not None else None
        self.initialiser: Optional[int] = None  # worker id writing the centre's first values
        self.centre_ready = False
        # an elastic node's centre whose first values its tie is deciding (`initial_centre`)
        self.deciding = False
        self._init_waiting: List[Waiter] = []  # workers waiting for the centre's values
        self._barrier_waiting: Dict[int, Waiter] = {}

    # -- centre initialisation --

    def worker_registered(self, worker_id: int) -> None:
        """The first worker to register initialises the centre (unless resuming)."""
        if self.initialiser is None and not self.centre_ready and self._resume is None:
            self.initialiser = worker_id

    def is_first(self, worker_id: int, new: bool) -> bool:
        """Whether worker `worker_id` initialises the centre (once registered, if `new`)."""
        return self.initialiser == worker_id or (
            new and self.initialiser is None and not self.centre_ready and self._resume is None)

    def init_params(self, envelope: list, seq: Optional[int], record: WorkerRecord,
                    layout: list, names: Optional[List[str]] = None) -> None:
        """``platoon-init-params``: create or check the centre (and the parameters' `names`),
        then tell the worker its segment and whether it writes the first values; deferred
        while another one does."""
        wid = record.worker_id
        mismatch = protocol.describe_name_mismatch(names, self.names)
        if mismatch:
            if self._resume is not None and self._resume.names is not None:
                mismatch = mismatch.replace("job's centre", "checkpoint %s" % self._resume.path)
            raise LayoutMismatch("worker %d: %s; every worker must name its parameters alike "
                                 "(or not at all)" % (wid, mismatch))
        centre = self._res.centre
        if centre is None:
            centre = self._create_centre(layout, wid)
        else:
            mismatch = protocol.describe_mismatch(layout, centre.layout)
            if mismatch:
                raise LayoutMismatch("worker %d: %s; every worker must pass the same parameters "
                                     "in the same order to init_shared_params" % (wid, mismatch))
        if self.names is None:
            self.names = names
        if self.deciding:
            self._init_waiting.append((envelope, seq))
            return
        self._answer_init(envelope, seq, record)

    def _answer_init(self, envelope: list, seq: Optional[int], record: WorkerRecord) -> None:
        """Tell a worker whether it writes the centre's first values, or defer it."""
        centre = self._res.centre
        assert centre is not None  # created by the first platoon-init-params
        wid = record.worker_id
        if self.centre_ready:
            self._registry.mark_ready(record)
            self._ctl.reply(envelope, seq, {"segment": centre.name, "initialise": False})
        elif self.initialiser in (None, wid):  # (again, after a failed first attempt)
            self.initialiser = wid
            self._ctl.reply(envelope, seq, {"segment": centre.name, "initialise": True})
        else:
            self._init_waiting.append((envelope, seq))

    def _create_centre(self, layout: list, wid: int) -> SharedCentre:
        self._ctl.reserve_shared(param_offsets(layout)[1], "the centre")
        resume = self._resume
        resumed = resume.arrays_for(layout, wid) if resume is not None else None
        self._res.centre = centre = SharedCentre.create(self._ctl.job_id, layout)
        log.info("centre %s created by worker %d: %d parameters, %d bytes",
                 centre.name, wid, len(layout), centre.size)
        if resume is not None and resumed is not None:
            for dst, src in zip(centre.arrays, resumed):
                dst[...] = src
            resume.release()
            self.centre_ready = True
            log.info("centre initialised from checkpoint %s", resume.path)
        elif self._ctl.node_link is not None:
            # an elastic node's workers may start from a live peer's anchor: its tie decides
            # while the controller serves on (`poll_initial_centre`); an MPI node's link
            # decides at once (its workers write the first values)
            self.deciding = True
            self.poll_initial_centre()
        return centre

    def poll_initial_centre(self) -> None:
        """An elastic node's centre: once its node link has decided where the first values
        come from (True: a live peer's anchor, now in the centre; False: its workers), answer
        the workers waiting in init_params."""
        link, centre = self._ctl.node_link, self._res.centre
        if not self.deciding or link is None or centre is None:
            return
        decided = link.initial_centre(centre)
        if decided is None:
            return
        self.deciding = False
        self.centre_ready = bool(decided)
        waiting, self._init_waiting = self._init_waiting, []
        for envelope, seq in waiting:
            record = self._registry.by_identity(envelope[0])
            if record is not None and not record.has_left:
                self._answer_init(envelope, seq, record)

    def params_ready(self, envelope: list, seq: Optional[int], record: WorkerRecord) -> None:
        """``platoon-params-ready``: the initialiser wrote the values; release the waiters."""
        if record.worker_id != self.initialiser:
            raise ProtocolError("worker %d reported the centre's values but worker %s writes them"
                                % (record.worker_id, self.initialiser))
        self.centre_ready = True
        self._registry.mark_ready(record)
        self._ctl.reply(envelope, seq, None)
        assert self._res.centre is not None  # created by the first platoon-init-params
        reply = {"segment": self._res.centre.name, "initialise": False}
        waiting, self._init_waiting = self._init_waiting, []
        for waiting_envelope, waiting_seq in waiting:
            self._ctl.reply(waiting_envelope, waiting_seq, reply)
            waiter = self._registry.by_identity(waiting_envelope[0])
            if waiter is not None:
                self._registry.mark_ready(waiter)

    # -- barrier --

    def barrier(self, envelope: list, seq: Optional[int], worker_id: int) -> None:
        """``platoon-barrier``: deferred until every worker still expected is waiting."""
        self._barrier_waiting[worker_id] = (envelope, seq)
        self.release_barrier()

    def leave_barrier(self, worker_id: int) -> None:
        """Worker `worker_id` no longer waits (it gave up, or sent another request)."""
        self._barrier_waiting.pop(worker_id, None)

    def release_barrier(self) -> None:
        """Reply to the barrier's waiters if they are all the workers still expected."""
        if not self._barrier_waiting \
                or len(self._barrier_waiting) < self._registry.still_expected():
            return
        waiting, self._barrier_waiting = self._barrier_waiting, {}
        link = self._ctl.node_link
        if link is not None:
            try:
                link.barrier()  # the whole job, across nodes
            except PlatoonError as exc:
                for envelope, seq in waiting.values():
                    self._ctl.fail(envelope, seq, exc)
                return
        for envelope, seq in waiting.values():
            self._ctl.reply(envelope, seq, None)

    # -- departures --

    def worker_left(self, worker_id: int) -> None:
        """Release a barrier the worker held up; hand its initialiser role on, if it had it."""
        self._barrier_waiting.pop(worker_id, None)
        self.release_barrier()
        if worker_id != self.initialiser or self.centre_ready:
            return
        if self.deciding:  # `poll_initial_centre` picks the initialiser, if one is needed
            self.initialiser = None
            return
        # The initialising worker left before writing: the next waiting one takes over.
        self.initialiser = None
        while self._init_waiting and self.initialiser is None:
            envelope, seq = self._init_waiting.pop(0)
            waiting = self._registry.by_identity(envelope[0])
            if waiting is not None and not waiting.has_left:
                assert self._res.centre is not None  # created for the initialiser that left
                self.initialiser = waiting.worker_id
                self._ctl.reply(envelope, seq, {"segment": self._res.centre.name,
                                                "initialise": True})
