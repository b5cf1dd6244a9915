"""Hierarchical EASGD: the node centres of a multi-node job, elastically tied over MPI.

The tie reads its controller only through `Controller.centre_ready`,
`Controller.shared_centre` (arrays and lock) and, for `every_syncs`, the sync
count in `Controller.progress`. Its messages go through `compress.compressed_mean`.
"""

import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import PlatoonError
from ._comm import wait
from .compress import CODECS, ErrorFeedback, RawCodec, compressed_mean, make_codec

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 60.0  # a worker stopped while holding the centre fails the tie


@dataclass
class CentreTie:
    """Hierarchical EASGD between node centres.

    A tie round comes every `every_s` seconds, or once every node's workers
    have made `every_syncs` syncs since the last round (counted in the centre's
    shared memory, or from `Worker.report()` where that is larger), whichever
    is set (both: whichever comes first on each node). In a round the
    controllers average their centres over MPI and move each toward the mean:
    ``c += beta * (mean - c)``, with `c` and `mean` taken at the same instant
    so syncs made meanwhile are kept; beta=1 makes the centres equal. Rounds
    go on while any node trains. A node whose workers are done stops moving:
    its centre enters the mean of the next round once (handed over to the
    nodes still training), then sits the rounds out. Once every node is done,
    a final round gives every node the mean of the centres not handed over
    (the nodes that finished last; one such centre is copied as it is), the
    same bits on every node: what each controller then holds and checkpoints.

    `compress` ("float32", "int8" or "int4", see `platoon.mpi.compress`) is how
    a round's centres travel. Not as values (large, hence coarse scales): each
    node sends how far its centre moved since the last round, with error
    feedback (what compression dropped goes out with its next message), so
    every node's picture of each centre stays within one message's
    quantisation error of it; the mean is the last round's mean plus the mean
    of the decoded messages, the same bits on every node (when the members
    change, each sends its centre's difference from the last mean instead).
    The final round is sent losslessly, in the centres' own dtype, so the
    nodes end with exactly the mean of their centres. Raises ValueError for
    bad values.
    """

    every_s: Optional[float] = 1.0
    beta: float = 0.5
    every_syncs: Optional[int] = None
    compress: str = "float32"

    def __post_init__(self):
        if self.every_s is None and self.every_syncs is None:
            raise ValueError("CentreTie needs every_s (seconds) or every_syncs (syncs per node)")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError("CentreTie every_s must be > 0 seconds, got %r" % self.every_s)
        if self.every_syncs is not None and (not isinstance(self.every_syncs, int)
                                             or self.every_syncs < 1):
            raise ValueError("CentreTie every_syncs must be an integer >= 1, got %r"
                             % (self.every_syncs,))
        if not 0 < self.beta <= 1:
            raise ValueError("CentreTie beta must be in (0, 1], got %r" % self.beta)
        if self.compress not in CODECS:
            raise ValueError("CentreTie compress must be one of %s, got %r"
                             % (", ".join(CODECS), self.compress))


class TieThread:
    """The thread that runs `tie`'s rounds for `controller` on `comm` (a communicator of its
    own, one rank per node); `on_failure(code)` is called if a round fails (it aborts).

    A node is training until `node_done` (its workers are all done). Its centre then never
    moves again: at the next round it hands it over (the mean the training nodes move
    toward includes it), and from then on sits the rounds out. The final round (`stop`)
    gives every node the mean of the centres not yet handed over: those of the nodes that
    finished last, which hold everything the others handed over.
    """

    def __init__(self, tie, comm, controller, on_failure):
        self.tie, self.comm, self.ctl, self.on_failure = tie, comm, controller, on_failure
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.rounds = 0
        self.bytes_sent = 0  # what this node's compressed_mean calls sent, every round
        self.codec = make_codec(tie.compress)
        # Per centre array: the last round's mean (zeros before; the same on every node), and
        # this node's centre at the last round and what compression has dropped since the
        # members last changed (`_members`): see `_round`.
        self._mean = self._base = self._feedback = self._members = None
        self._done = threading.Event()  # this node's workers are all done
        self._handed_over = False  # this node's final centre is in the training nodes' mean
        self._thread = threading.Thread(target=self._run, name="platoon-centre-tie",
                                        daemon=True)
        self._thread.start()

    def node_done(self):
        """This node's workers are all done: freeze its centre (it no longer moves toward
        the others) and hand it over at the next round. Call it before waiting for the
        other nodes."""
        self._done.set()

    def stop(self):
        """End the rounds once every node is done (the rounds are collective), then run the
        final round. Call it when this node's workers are all done."""
        self._done.set()
        self._thread.join()
        self._final_round()

    def _run(self):
        try:
            while True:
                self._wait_for_round()
                mine = np.array([self.ctl.centre_ready, self._done.is_set(),
                                 self._handed_over], np.int32)
                states = np.empty((self.size, 3), np.int32)
                wait(self.comm.Iallgather(mine, states))
                ready, done, handed_over = states.astype(bool).T
                if done.all():  # every node is done: the final round follows
                    return
                if not ready.all():
                    continue
                leaving = done & ~handed_over
                if (~done).sum() + leaving.sum() > 1:  # alone, a node's mean is its centre
                    self._round(training=~done, leaving=leaving)
                    if leaving[self.rank]:
                        self._handed_over = True
        except Exception:
            log.exception("the centre tie failed on node %d", self.rank)
            self.on_failure(1)

    def _wait_for_round(self):
        """Return when this node is due for a tie round (at once once it is done: the
        training nodes set the pace)."""
        tie, start = self.tie, time.monotonic()
        syncs = self.ctl.progress["syncs"]
        while not self._done.is_set():
            left = None if tie.every_s is None else start + tie.every_s - time.monotonic()
            if left is not None and left <= 0:
                return
            if tie.every_syncs is not None:
                if self.ctl.progress["syncs"] - syncs >= tie.every_syncs:
                    return
                left = 0.01 if left is None else min(left, 0.01)  # syncs: a poll
            self._done.wait(left)

    def _check_layouts(self, centre):
        if self.rounds == 0:
            layouts = self.comm.allgather(centre.layout)
            if any(lay != centre.layout for lay in layouts):
                raise PlatoonError("the nodes' centres differ in layout: %s" % layouts)

    def _round(self, training, leaving):
        """Move the training nodes' centres toward the mean of the training and leaving
        nodes' centres (boolean arrays, one entry per rank); the others contribute nothing,
        but keep the mean too.

        What travels (see `CentreTie`): each member sends how far its centre moved since the
        last round, plus what compression dropped from its earlier messages (its
        `ErrorFeedback`), so the others' picture of its centre stays within one message's
        error of it; the mean is the last one plus the mean of the decoded messages, the same
        bits on every node. When the members change (the first round, a node handing over or
        gone), every member starts again from the last mean: its message is its centre's
        difference from it."""
        centre = self.ctl.shared_centre
        self._check_layouts(centre)
        members = tuple(int(r) for r in np.flatnonzero(training | leaving))
        contributes = self.rank in members
        if self._mean is None:
            self._mean = [np.zeros_like(a) for a in centre.arrays]
        if members != self._members:  # start again from the mean: it is every member's base
            self._base = [m.copy() for m in self._mean] if contributes else None
            self._feedback = [ErrorFeedback(a.size, a.dtype) for a in centre.arrays] \
                if contributes else None
            self._members = members
        centre.lock.acquire(LOCK_TIMEOUT_S)  # a stopped holder: LockTimeout, the tie fails
        try:
            snaps = [a.copy() for a in centre.arrays] if contributes else []
        finally:
            centre.lock.release()
        for i, mean in enumerate(self._mean):  # peers are here: blocking
            if contributes:
                moved, feedback = snaps[i] - self._base[i], self._feedback[i]
                self._base[i][...] = snaps[i]
            else:
                moved, feedback = mean, None  # (not read: this node sends nothing)
            mean_moved, sent = compressed_mean(self.comm, moved, self.codec, feedback,
                                               among=members)
            mean += mean_moved  # the same bits on every node
            self.bytes_sent += sent
        self.rounds += 1
        if not training[self.rank] or self._done.is_set():  # done since the round began
            return
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            for c, s, m in zip(centre.arrays, snaps, self._mean):
                move = m - s
                move *= self.tie.beta
                c += move
        finally:
            centre.lock.release()
        log.debug("node %d: centre tie round %d, %d bytes sent so far", self.rank, self.rounds,
                  self.bytes_sent)

    def _final_round(self):
        """Every node is done (no worker syncs any more): make each node's centre the mean
        of the centres not handed over yet (the nodes that finished last). They send their
        centres losslessly (`RawCodec`) and every node adds them up alike (`compressed_mean`),
        so the centres are identical bit for bit; a single such centre is copied as it is."""
        comm, ctl = self.comm, self.ctl
        states = np.array(comm.allgather((bool(ctl.centre_ready), self._handed_over)), bool)
        if not states[:, 0].all():  # every node is here: blocking
            if ctl.centre_ready:
                log.warning("node %d: no final centre tie: another node has no centre (its "
                            "workers never shared parameters)", self.rank)
            return
        last = np.flatnonzero(~states[:, 1])  # not empty: a round hands over only to a trainer
        centre = ctl.shared_centre
        self._check_layouts(centre)
        for array in centre.arrays:
            centre.lock.acquire(LOCK_TIMEOUT_S)
            try:
                mine = array.copy()
            finally:
                centre.lock.release()
            mean, sent = compressed_mean(self.comm, mine, RawCodec(array.dtype), None,
                                         among=last)
            self.bytes_sent += sent
            centre.lock.acquire(LOCK_TIMEOUT_S)
            try:
                array[...] = mean
            finally:
                centre.lock.release()
        self.rounds += 1
        log.info("node %d: final centre tie round %d: every node holds the centre of node(s) "
                 "%s; the tie sent %d bytes from this node (%s)", self.rank, self.rounds,
                 ", ".join(str(r) for r in last), self.bytes_sent, self.codec.name)
