"""The node centres of a multi-node job, tied over MPI: hierarchical EASGD (each centre moves
toward the mean) or DiLoCo's outer step (the nodes average how far their centres moved and
apply one outer Nesterov step to a common anchor).

The tie reads its controller only through `Controller.centre_ready`,
`Controller.shared_centre` (arrays and lock) and, for `every_syncs`, the sync
count in `Controller.progress`. Its messages go through `compress.compressed_mean`.
"""

import hashlib
import logging
import threading
import time
from typing import List, Optional, Tuple

import numpy as np

from ..errors import NonFiniteValues, PlatoonError
from ..node.compress import ErrorFeedback, RawCodec, make_codec
from ..node.tie import (  # noqa: F401 (CentreTie, OUTER_RULES: names of this module too)
    LOCK_TIMEOUT_S,
    OUTER_RULES,
    CentreTie,
    outer_step,
)
from ._comm import Cancelled, wait
from .compress import compressed_mean

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05  # between the tie thread's checks while there is nothing to tie
HALT_TIMEOUT_S = 10.0  # for a halted tie thread to end (a round waiting for the centre's lock)


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
        # Of which the lossless rounds (DiLoCo's first, the final one: whole centres, in
        # their own dtype), whatever the codec of the others.
        self.lossless_rounds = 0
        self.lossless_bytes = 0
        self.codec = make_codec(tie.compress)
        # Per centre array, the same bits on every node: the last round's mean (zeros
        # before), or with DiLoCo the anchor and the outer momentum. This node's own: its
        # centre at the last round and what compression has dropped since the members last
        # changed (`_members`); empty where this node does not contribute (or, the outer
        # momentum, without DiLoCo). See `_round`.
        self._mean: Optional[List[np.ndarray]] = None  # None before the first round
        self._velocity: List[np.ndarray] = []
        self._base: List[np.ndarray] = []
        self._feedback: List[ErrorFeedback] = []
        self._members: Optional[Tuple[int, ...]] = None
        self._done = threading.Event()  # this node's workers are all done
        self._halt = threading.Event()  # end now, no final round (`halt`)
        self.final = threading.Event()  # the final round has run (or failed: `final_error`)
        self.final_error = None
        self._handed_over = False  # this node's final centre is in the training nodes' mean
        self._last_start = time.monotonic()  # of the last round (its period counts from it)
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
        final round (the thread runs it as soon as every node is done: a worker waiting to
        evaluate the agreed centre need not wait for `stop`). Call it when this node's
        workers are all done; raises what the final round raised."""
        self._done.set()
        self._thread.join()
        if not self.final.is_set():  # the thread ended without it (it failed: aborting)
            self._final_round()
        if self.final_error is not None:
            raise self.final_error

    def halt(self, timeout_s=HALT_TIMEOUT_S):
        """End the rounds now, without a final round: the controller is closing without
        having finished (SIGTERM, an error), and its centre is about to go. A round under way
        is left where it is (its collective unfinished; the job is going down) and the centre
        is not touched again. Not collective. Returns whether the thread ended within
        `timeout_s` (it waits for the centre's lock at most that long)."""
        self._halt.set()
        self._done.set()  # wakes `_wait_for_round`
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def halted(self):
        """Whether `halt` was called."""
        return self._halt.is_set()

    def _run(self):
        try:
            while not self._halt.is_set():
                self._wait_for_round()
                if self._halt.is_set():
                    return
                self._last_start = time.monotonic()
                mine = np.array([self.ctl.centre_ready, self._done.is_set(),
                                 self._handed_over], np.int32)
                states = np.empty((self.size, 3), np.int32)
                if not wait(self.comm.Iallgather(mine, states), cancel=self._halt):
                    return  # halted
                ready, done, handed_over = states.astype(bool).T
                if done.all():  # every node is done: the final round, now
                    try:
                        self._final_round()
                    except Exception as exc:  # raised by `stop`, in the controller's thread
                        self.final_error = exc
                    finally:
                        self.final.set()
                    return
                leaving = done & ~handed_over
                if ready.all() and (~done).sum() + leaving.sum() > 1:  # alone: no round
                    self._round(training=~done, leaving=leaving)
                    if leaving[self.rank]:
                        self._handed_over = True
                else:  # nothing to tie: poll, even with a tiny every_s
                    time.sleep(IDLE_POLL_S)
        except Cancelled:
            log.debug("node %d: the centre tie was halted in a round", self.rank)
        except Exception:
            if self._halt.is_set():  # the controller is closing: not a failure of the tie
                log.debug("node %d: the centre tie ended while halted", self.rank,
                          exc_info=True)
                return
            log.exception("the centre tie failed on node %d", self.rank)
            self.on_failure(1)

    def _wait_for_round(self):
        """Return when this node is due for a tie round: `every_s` after the last round
        began (at once if that round took longer), or once its workers made `every_syncs`
        syncs; at once when it is done (the training nodes set the pace)."""
        tie, start = self.tie, self._last_start
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
        """One round among the training and leaving nodes (boolean arrays, one entry per
        rank); the others contribute nothing, but keep the mean (the anchor) too. Then the
        training nodes' centres move: EASGD toward the mean by `beta`, DiLoCo to the new
        anchor, each keeping what its workers added since the snapshot.

        What travels (see `CentreTie`): each member sends how far its centre moved since the
        last round (DiLoCo: from the anchor, its pseudo-gradient), plus what compression
        dropped from its earlier messages (its `ErrorFeedback`); every node decodes and adds
        the messages alike, so the mean (the anchor) is the same bits on every node. EASGD:
        when the members change (the first round, a node handing over), every member starts
        again from the last mean: its message is its centre's difference from it. DiLoCo:
        the first round sends the centres losslessly and their mean becomes the anchor."""
        centre = self.ctl.shared_centre
        self._check_layouts(centre)
        diloco = self.tie.outer == "diloco"
        members = tuple(int(r) for r in np.flatnonzero(training | leaving))
        contributes = self.rank in members
        first = self._mean is None
        if self._mean is None:  # (first)
            self._mean = [np.zeros_like(a) for a in centre.arrays]
            self._velocity = [np.zeros_like(a) for a in centre.arrays] if diloco else []
        means = self._mean
        if members != self._members:  # start again from the mean: it is every member's base
            self._base = [m.copy() for m in means] if contributes else []
            self._feedback = [ErrorFeedback(a.size, a.dtype) for a in centre.arrays] \
                if contributes else []
            self._members = members
        self._lock_centre(centre)  # a stopped holder: LockTimeout, the tie fails
        try:
            snaps = [a.copy() for a in centre.arrays] if contributes else []
        finally:
            centre.lock.release()
        sent_before = self.bytes_sent
        try:
            self._send_moves(means, snaps, members, contributes, diloco, first)
        except NonFiniteValues as exc:
            raise self._diverged(exc, "round %d" % (self.rounds + 1)) from exc
        self.rounds += 1
        if diloco and first:  # the anchor: the centres themselves, losslessly
            self.lossless_rounds += 1
            self.lossless_bytes += self.bytes_sent - sent_before
        if not training[self.rank] or self._done.is_set():  # done (or halted) since it began
            return
        self._lock_centre(centre)
        try:
            for c, s, m in zip(centre.arrays, snaps, means):
                if diloco:  # the anchor plus what the workers added since the snapshot
                    c -= s
                    c += m
                else:
                    move = m - s
                    move *= self.tie.beta
                    c += move
        finally:
            centre.lock.release()
        log.debug("node %d: centre tie round %d, %d bytes sent so far", self.rank, self.rounds,
                  self.bytes_sent)

    def _diverged(self, exc, where):
        """The error for a refused round (`compressed_mean`'s NonFiniteValues), naming the
        nodes whose centre holds NaN or Inf."""
        nodes = ", ".join(map(str, exc.ranks)) or "?"
        return NonFiniteValues("node(s) %s's centre holds NaN or Inf (training diverged "
                               "there?): the centre tie refuses it in %s rather than average "
                               "it into every node's centre, whatever --tie-compress; the job "
                               "is aborted (resume from a node's last good checkpoint, with a "
                               "lower learning rate)" % (nodes, where), exc.ranks)

    def _digests(self, snaps):
        """Every node's sha256 of its centre's arrays `snaps` (dtypes, shapes and bytes; None
        for a node without): all-gathered, 32 bytes to each other node (counted)."""
        digest = None
        if snaps is not None:
            h = hashlib.sha256()
            for s in snaps:
                h.update(("%s%s" % (s.dtype.str, s.shape)).encode())
                h.update(np.ascontiguousarray(s).tobytes())
            digest = h.digest()
        digests = self.comm.allgather(digest)  # peers are here: blocking
        self.bytes_sent += hashlib.sha256().digest_size * (self.size - 1)
        return digests

    def _centres_equal(self, snaps, members, contributes):
        """Whether every node's centre is already the same bits (nodes started from one
        seed, say): each node sends the sha256 of its snapshot (dtypes, shapes and bytes; 32
        bytes to each other node, counted) and they compare. A node outside `members` has
        no snapshot: not equal. Equal centres holding NaN or Inf are refused as
        `compressed_mean` refuses them, on every node alike."""
        digests = self._digests(snaps if contributes else None)
        digest = digests[self.rank]
        if digest is None or any(d != digest for d in digests):
            return False
        if not all(np.isfinite(s).all() for s in snaps):  # the same answer on every node
            raise NonFiniteValues("NaN or Inf in the centres", members)
        return True

    def _send_moves(self, means, snaps, members, contributes, diloco, first):
        """A round's messages (see `_round`): the new mean (anchor) in `means` (`self._mean`).
        DiLoCo's first round sets the anchor to the mean of the centres, losslessly: when
        they are already equal (a hash shows it), no centre is sent, it is the mean."""
        equal = diloco and first and self._centres_equal(snaps, members, contributes)
        for i, mean in enumerate(means):  # peers are here: blocking
            if equal:  # every node has the mean already: its own centre
                mean[...] = snaps[i]
                self._base[i][...] = mean
                continue
            if diloco and first:  # the anchor: the mean of the centres, exactly
                _, sent = compressed_mean(self.comm, snaps[i] if contributes else mean,
                                          RawCodec(mean.dtype), None, among=members, out=mean,
                                          cancel=self._halt)
            else:
                if contributes:
                    moved, feedback = snaps[i] - self._base[i], self._feedback[i]
                else:
                    moved, feedback = mean, None  # (not read: this node sends nothing)
                mean_moved, sent = compressed_mean(self.comm, moved, self.codec, feedback,
                                                   among=members, cancel=self._halt)
                if diloco:
                    self._outer_step(mean, self._velocity[i], mean_moved)
                else:
                    mean += mean_moved  # the same bits on every node
            if contributes:
                self._base[i][...] = mean if diloco else snaps[i]
            self.bytes_sent += sent

    def _lock_centre(self, centre):
        """Take the centre's lock for a round; Cancelled once halted (the centre may be
        going: it must not be touched)."""
        if self._halt.is_set():
            raise Cancelled("the centre tie was halted")
        centre.lock.acquire(LOCK_TIMEOUT_S)
        if self._halt.is_set():
            centre.lock.release()
            raise Cancelled("the centre tie was halted")

    def _outer_step(self, anchor, velocity, mean_moved):
        """DiLoCo's outer SGD step with Nesterov momentum on `anchor`, in place: the gradient
        is -mean_moved (the nodes' mean pseudo-gradient). With lr 1 and momentum 0 the new
        anchor is the mean of the centres."""
        outer_step(anchor, velocity, mean_moved, self.tie.outer_lr, self.tie.outer_momentum)

    def _final_round(self):
        """Every node is done (no worker syncs any more): make each node's centre the mean
        of the centres not handed over yet (the nodes that finished last). They send their
        centres losslessly (`RawCodec`) and every node adds them up alike (`compressed_mean`),
        so the centres are identical bit for bit; a single such centre is copied as it is.
        The nodes first compare a sha256 of their centres (`_digests`): when those of the last
        nodes are equal, one of them is copied as it is (sent by that node alone); when every
        node's is equal, no centre is sent (NaN or Inf is still refused)."""
        comm, ctl = self.comm, self.ctl
        states = np.array(comm.allgather((bool(ctl.centre_ready), self._handed_over)), bool)
        if not states[:, 0].all():  # every node is here: blocking
            if ctl.centre_ready:
                log.warning("node %d: no final centre tie: another node has no centre (its "
                            "workers never shared parameters)", self.rank)
            return
        last = np.flatnonzero(~states[:, 1])  # not empty: a round hands over only to a trainer
        centre = ctl.shared_centre
        sent_before = self.bytes_sent
        self._check_layouts(centre)
        centre.lock.acquire(LOCK_TIMEOUT_S)
        try:
            snaps = [a.copy() for a in centre.arrays]
        finally:
            centre.lock.release()
        digests = self._digests(snaps)
        senders = [int(r) for r in last]
        if all(digests[r] == digests[last[0]] for r in last):  # the mean: any of them
            senders = senders[:1]
            if all(d == digests[last[0]] for d in digests):  # every node holds it already
                if not all(np.isfinite(s).all() for s in snaps):  # the same on every node
                    raise self._diverged(NonFiniteValues("NaN or Inf in the centres",
                                                         [int(r) for r in last]),
                                         "the final round")
                senders = []
        for array, mine in zip(centre.arrays if senders else (), snaps):
            try:
                mean, sent = compressed_mean(self.comm, mine, RawCodec(array.dtype), None,
                                             among=senders)
            except NonFiniteValues as exc:
                raise self._diverged(exc, "the final round") from exc
            self.bytes_sent += sent
            centre.lock.acquire(LOCK_TIMEOUT_S)
            try:
                array[...] = mean
            finally:
                centre.lock.release()
        self.rounds += 1
        self.lossless_rounds += 1
        self.lossless_bytes += self.bytes_sent - sent_before
        log.info("node %d: final centre tie round %d: every node holds the centre of node(s) "
                 "%s (what the tie sent: platoon.mpi says it on stderr, NodeLink.tie_summary)",
                 self.rank, self.rounds, ", ".join(str(r) for r in last))

    def summary(self):
        """What this node sent for the tie, the rounds in its codec and the lossless ones
        (whole centres) apart, with the bytes of each kind per round: one line."""
        tie, lossless = self.tie, self.lossless_rounds
        coded, coded_bytes = self.rounds - lossless, self.bytes_sent - self.lossless_bytes
        outer = "outer diloco (lr %g, momentum %g)" % (tie.outer_lr, tie.outer_momentum) \
            if tie.outer == "diloco" else "outer easgd (beta %g)" % tie.beta
        return ("the tie sent %d bytes from this node in %d round(s): %d in %s, %d bytes "
                "(%.0f a round), and %d lossless (%s), %d bytes (%.0f a round); %s"
                % (self.bytes_sent, self.rounds, coded, tie.compress, coded_bytes,
                   coded_bytes / coded if coded else 0.0, lossless,
                   "DiLoCo's first and the final round" if lossless > 1 else "the final round"
                   if lossless else "none yet", self.lossless_bytes,
                   self.lossless_bytes / lossless if lossless else 0.0, outer))
