"""A node controller's link to the other nodes' controllers: agreement, collectives, abort."""

import logging
import threading

import numpy as np

from .._centre.stopsignal import OTHER_NODE
from .._os.environment import JobEnvironment
from ..errors import PlatoonError
from ._comm import abort, import_mpi, wait
from .tie import fixed_world_tie

log = logging.getLogger(__name__)

_MPI_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}
_AGREE_BYTES = 96
_STOP_TAG = 57  # the stop signal's messages, on a communicator of their own
DEFAULT_TIMEOUT_S = 1800.0


def _agree_tie(comm, tie):
    """Check that every rank of `comm` ties its centre alike (`CentreTie.agreed`: the settings
    that decide what a round's messages are and mean); raise PlatoonError naming each
    setting that differs and which node has which. Collective."""
    settings = comm.allgather(None if tie is None else tie.agreed())
    if all(s == settings[0] for s in settings):
        return
    untied = [r for r, s in enumerate(settings) if s is None]
    if untied:
        problems = ["a centre tie on node(s) %s but none on node(s) %s" % (
            ", ".join(str(r) for r, s in enumerate(settings) if s is not None),
            ", ".join(map(str, untied)))]
    else:
        problems = ["%s: %s" % (name, ", ".join("node %d %r" % (r, s[name])
                                               for r, s in enumerate(settings)))
                    for name in settings[0] if any(s[name] != settings[0][name]
                                                   for s in settings)]
    raise PlatoonError("the nodes' centre tie settings differ: %s; give every node the same "
                       "--tie-* options (CentreTie)" % "; ".join(problems))


class NodeLink:
    """A controller's link to the other nodes' controllers.

    Parameters:
        num_workers: workers on this node.
        comm: the communicator with one rank per node (default COMM_WORLD).
        tie: a CentreTie, or None for independent node centres.

    A node that does not reach a collective within `collective_timeout_s`
    (PLATOON_MPI_TIMEOUT_S, default 1800) is taken to hang: the job is
    aborted rather than left waiting forever.

    Collective: every rank must create it. As ``controller.node_link`` it is
    used by the controller: `start` when serve() begins, `finish` when it
    ends; `close()` then frees the communicators.
    """

    def __init__(self, num_workers, comm=None, tie=None):
        MPI = self.MPI = import_mpi()
        world = comm if comm is not None else MPI.COMM_WORLD
        _agree_tie(world, tie)  # before the communicators: a node without a tie makes one fewer
        if tie is not None and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise PlatoonError("the centre tie needs MPI_THREAD_MULTIPLE but MPI gives level %d; "
                               "use an MPI built with thread support (mpich is)"
                               % MPI.Query_thread())
        self._comm = world.Dup()
        self._tie_comm = world.Dup() if tie is not None else None
        self._stop_comm = world.Dup()
        self._stop_sends = []  # this node's stop, on its way to the others
        self._stop_from = set()  # ranks whose stop this node has received
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        counts = self._comm.allgather(int(num_workers))
        self.num_workers = int(num_workers)
        self.worker_offset = sum(counts[:self.rank])
        self.global_size = sum(counts)
        self.tie = tie
        self.final_result = None  # node 0: the agreed centre's evaluation (the controller's)
        self._tie_thread = None
        self._start_lock = threading.Lock()
        self._finished = False
        self._closed = False
        timeout_s = JobEnvironment.read("mpi_timeout_s").mpi_timeout_s
        self.collective_timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s

    @property
    def tie_rounds(self):
        """Centre tie rounds done so far."""
        return 0 if self._tie_thread is None else self._tie_thread.rounds

    @property
    def tie_bytes_sent(self):
        """Bytes this node has sent for the centre tie so far (`compress.compressed_mean`'s
        count: its messages, once for each other node; MPI's headers not counted)."""
        return 0 if self._tie_thread is None else self._tie_thread.bytes_sent

    def tie_summary(self):
        """One line: what this node sent for the centre tie, the rounds in its codec and the
        lossless rounds apart (`NodeTie.summary`); None without a tie."""
        return None if self._tie_thread is None else self._tie_thread.summary()

    def totals(self):
        """What this link adds to the controller's progress totals (and status file):
        ``tie_rounds`` and ``tie_bytes_sent`` when the centres are tied, of which
        ``tie_lossless_rounds`` and ``tie_lossless_bytes_sent`` (whole centres, in their own
        dtype: the first anchor, heals), else nothing."""
        if self.tie is None:
            return {}
        thread = self._tie_thread
        return {"tie_rounds": self.tie_rounds, "tie_bytes_sent": self.tie_bytes_sent,
                "tie_lossless_rounds": 0 if thread is None else thread.lossless_rounds,
                "tie_lossless_bytes_sent": 0 if thread is None else thread.lossless_bytes}

    def topology(self, worker_id):
        """What a worker learns at registration, beyond its local id."""
        return {"global_rank": self.worker_offset + worker_id, "global_size": self.global_size,
                "node_rank": self.rank, "num_nodes": self.size}

    def _agree(self, what):
        """Check that every rank is entering the same collective; raise PlatoonError if not."""
        text = repr(what).encode()[:_AGREE_BYTES]
        mine = np.zeros(_AGREE_BYTES, np.uint8)
        mine[:len(text)] = np.frombuffer(text, np.uint8)
        seen = np.empty((self.size, _AGREE_BYTES), np.uint8)
        if not wait(self._comm.Iallgather(mine, seen), self.collective_timeout_s):
            log.error("node %d: the other nodes did not reach %r within %.0f s (a node "
                      "hangs?)", self.rank, what, self.collective_timeout_s)
            self.abort(1)
        if (seen != mine).any():
            raise PlatoonError("the nodes' workers called different collectives: %s; every worker "
                               "must call the same collectives in the same order" % "; ".join(
                                   "node %d: %s" % (r, bytes(row).rstrip(b"\0").decode())
                                   for r, row in enumerate(seen)))

    def fail_round(self, reason):
        """This node's round failed before its data was ready: enter the agreement anyway, so
        the other nodes fail the same round instead of pairing it with our next one."""
        try:
            self._agree(("failed", reason))
        except PlatoonError:
            pass  # expected: the others entered a real collective

    def all_reduce(self, array, op):
        """Combine this node's reduced `array` with the other nodes' in place; return the
        number of workers it now covers (the divisor of a mean)."""
        self._agree(("all_reduce", array.dtype.str, array.size, op))
        self._comm.Allreduce(self.MPI.IN_PLACE, array.reshape(-1),
                             getattr(self.MPI, _MPI_OPS[op]))
        return self.global_size

    def barrier(self):
        """Wait for every node's controller (each calls it when its workers are all in)."""
        self._agree(("barrier",))

    def abort(self, code=1):
        """End the whole job now: every rank, hence every controller and worker."""
        log.error("node %d aborts the job (exit code %d)", self.rank, code)
        abort(self._comm, code)

    def share_stop(self, job_stop):
        """Pass this node's stop (a platoon._centre.stopsignal.JobStop) to the other nodes,
        once, and take theirs. Called by the controller's serve thread every tick and before
        `finish`."""
        if self._finished:
            return
        comm, MPI = self._stop_comm, self.MPI
        status = MPI.Status()
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=_STOP_TAG, status=status):
            source = status.Get_source()
            reason = comm.recv(source=source, tag=_STOP_TAG)
            self._stop_from.add(source)
            log.info("node %d: node %d asks the job to stop (%s)", self.rank, source, reason)
            job_stop.request(OTHER_NODE, reason)
        if job_stop.requested and not self._stop_from and not self._stop_sends:
            self._stop_sends = [comm.isend(job_stop.reason, dest=r, tag=_STOP_TAG)
                                for r in range(self.size) if r != self.rank]

    def _drain_stops(self):
        """At `finish` (every node is there): take the stops sent to this node and not yet
        received (each was sent before its node finished), and complete this node's."""
        sent = self._comm.allgather(bool(self._stop_sends))
        for source, did in enumerate(sent):
            if did and source != self.rank and source not in self._stop_from:
                self._stop_comm.recv(source=source, tag=_STOP_TAG)
        for request in self._stop_sends:
            request.wait()
        self._stop_sends = []

    def start(self, controller):
        """Start the centre tie (if any) for `controller`'s centre."""
        with self._start_lock:
            if self.tie is not None and self._tie_thread is None:
                self._tie_thread = fixed_world_tie(self.tie, self._tie_comm, controller,
                                                    self.abort)

    def initial_centre(self, centre):
        """False, at once: this node's workers write its centre's first values (each node's
        own; a tie's first round makes them one)."""
        return False

    def trained(self):
        """This node's workers are all past their last sync (`Worker.final_evaluation`): its
        centre is final, and the tie's final round may come without waiting for them to
        leave. Returns whether an agreed centre will come (the centres are tied), to be
        evaluated once, on node 0 (`final_centre`)."""
        thread = self._tie_thread
        if thread is None:
            return False
        thread.node_done()
        return True

    def final_centre(self):
        """None until the tie's final round has run; then whether this node evaluates the
        agreed centre (node 0 does, when the round succeeded; a failed round fails the job
        at `finish`)."""
        thread = self._tie_thread
        if thread is None or not thread.final.is_set():
            return None
        return thread.final_rank == 0 and thread.final_error is None

    def end_tie(self):
        """End the centre tie now, without its final round: the controller is closing before
        `finish` (SIGTERM, an error) and its centre is about to go, so no round may start or
        go on. `Controller.close` calls it before it releases the centre. Not collective;
        idempotent; nothing to do after `finish` (the tie has ended)."""
        thread = self._tie_thread
        if thread is None or self._finished or thread.halted:
            return
        if not thread.halt():
            log.warning("node %d: the centre tie thread did not end (a round waits for the "
                        "centre's lock?); the centre goes anyway", self.rank)

    def finish(self):
        """This node is done: freeze its centre for the tie, check that every node is done (a
        node still in a collective gets an error instead of a hang), then end the centre tie.
        The controller calls it when serve() ends, before its centre goes away. Collective;
        idempotent."""
        if self._finished:
            return
        if self._tie_thread is not None and self._tie_thread.halted:
            raise PlatoonError("node %d: the centre tie was ended (its controller closed) "
                               "before this node finished" % self.rank)
        self._finished = True
        if self._tie_thread is not None:
            self._tie_thread.node_done()  # its centre freezes while the others train on
        self._agree(("done",))
        self._drain_stops()
        if self._tie_thread is not None:
            self._tie_thread.stop()

    def close(self):
        """`finish`, then free the communicators. Collective; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.finish()
        self._comm.Free()
        self._stop_comm.Free()
        if self._tie_comm is not None:
            self._tie_comm.Free()
