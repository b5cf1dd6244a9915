"""The job-wide stop signal: one byte of shared memory that every worker of a node reads.

The controller creates the segment ``/platoon-JOB-stop-TOKEN`` (TOKEN random, so
nobody can create the name first) when the first worker registers, names it in every
registration reply, and unlinks it when it closes.
It is the only writer: a worker asks it to stop with the reserved request
``platoon-stop``. A worker maps the segment and reads one byte, so checking the
signal costs well under a microsecond and never a round trip to the controller.

Layout (after the centre's 4 KiB header, so the stale-segment scan and the
launcher's clean-up know it): byte 0 the flag, bytes 8..16 who asked (a worker
id, -1 for the controller, -2 for another node), 16..20 the reason's length, then the reason in
UTF-8 (at most `MAX_REASON_BYTES`). The flag is written last.
"""

import logging
import struct
import threading
from typing import Callable, List, Optional, Tuple

from .shmem import SharedCentre, param_offsets

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name

PAYLOAD_BYTES = 4096
MAX_REASON_BYTES = 1024
CONTROLLER = -1  # "who asked" when the controller itself asked
OTHER_NODE = -2  # ... when the stop came from another node's controller (platoon.mpi)
_FIELDS = struct.Struct("<qI")  # who asked, reason length; at offset 8
_LAYOUT = [{"dtype": "uint8", "shape": [PAYLOAD_BYTES]}]
SEGMENT_BYTES = param_offsets(_LAYOUT)[1]  # shared memory the segment takes, header included


def describe(by: Optional[int]) -> str:
    """'worker 3', 'the controller' or 'another node' for `by`."""
    if by is None:
        return "nobody"
    return {CONTROLLER: "the controller", OTHER_NODE: "another node"}.get(by, "worker %d" % by)


class StopSignal:
    """A job's stop flag in shared memory (see the module docstring).

    `create` (the controller) owns the segment and may `set` it; `attach` (a
    worker) only reads it. `close` unmaps (and, for the owner, unlinks) it and is
    idempotent; the last state read stays available afterwards.
    """

    def __init__(self, segment: SharedCentre):
        self._segment = segment
        self.name = segment.name
        self.owner = segment.owner
        # indexing a memoryview gives an int: the fastest read
        self._bytes: Optional[memoryview] = memoryview(
            segment.arrays[0])  # type: ignore[arg-type]  # numpy's stubs: no Buffer
        self._lock = threading.Lock()  # the owner's writers (serve's thread, a feeder thread)
        self._final: Optional[Tuple[Optional[int], Optional[str]]] = None  # state at close

    @classmethod
    def create(cls, job_id: str) -> "StopSignal":
        """Create job `job_id`'s stop segment, cleared, under a random name (see
        `SharedCentre.create`); raises PlatoonError if it cannot."""
        return cls(SharedCentre.create(job_id, _LAYOUT, "stop", striped=False))

    @classmethod
    def attach(cls, name: str) -> "StopSignal":
        """Map the existing stop segment `name`; raises PlatoonError if it is gone."""
        return cls(SharedCentre.attach(name, _LAYOUT, striped=False))

    def is_set(self) -> bool:
        """True once a stop has been requested."""
        view = self._bytes
        if view is None:
            return self._final is not None
        return view[0] != 0

    def state(self) -> Tuple[Optional[int], Optional[str]]:
        """(who asked, reason) once set; (None, None) while not."""
        view = self._bytes
        if view is None:
            return self._final or (None, None)
        if not view[0]:
            return None, None
        by, length = _FIELDS.unpack_from(view, 8)
        raw = bytes(view[8 + _FIELDS.size:8 + _FIELDS.size + min(length, MAX_REASON_BYTES)])
        return by, raw.decode("utf-8", "replace") if length else None

    def set(self, by: int, reason: Optional[str]) -> bool:
        """Set the flag on behalf of `by` with `reason` (owner only); False (and nothing
        changed) if it was set already: the first request's reason is kept."""
        with self._lock:
            view = self._bytes
            if view is None or view[0]:
                return False
            raw = b"" if reason is None else reason.encode("utf-8")[:MAX_REASON_BYTES]
            start = 8 + _FIELDS.size
            view[start:start + len(raw)] = raw
            _FIELDS.pack_into(view, 8, by, len(raw))
            view[0] = 1  # last: a reader that sees the flag sees the reason
            return True

    def close(self) -> None:
        """Unmap the segment (unlinking it if this process owns it). Idempotent."""
        if self._bytes is None:
            return
        state = self.state()
        self._final = state if state[0] is not None else None
        self._bytes = None
        self._segment.close()
        if self.owner:
            self._segment.unlink()


class JobStop:
    """The controller's side of the stop signal: who asked and why, the segment, the log.

    Usable before the segment exists (`open` writes what was asked already) and after it
    is closed (asking again then changes nothing): a late or repeated request is harmless.
    """

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.by: Optional[int] = None
        self.reason: Optional[str] = None
        self.requested = False
        self.listeners: List[Callable[[], None]] = []  # called after the first request
        self._signal: Optional[StopSignal] = None
        self._lock = threading.Lock()

    @property
    def segment(self) -> Optional[str]:
        """The segment's name for the workers, None before `open` and after `close`."""
        signal = self._signal
        return None if signal is None else signal.name

    @property
    def shared_bytes(self) -> int:
        """Bytes of shared memory the segment holds (0 while it does not exist)."""
        return 0 if self._signal is None else SEGMENT_BYTES

    def open(self, reserve: Optional[Callable[[int, str], None]] = None) -> str:
        """Create the segment, once (at the first registration, so a controller killed
        before any worker came leaves none), set if a stop was requested before; its name.
        `reserve(nbytes, what)` is asked first and may refuse by raising PlatoonError."""
        with self._lock:
            if self._signal is None:
                if reserve is not None:
                    reserve(SEGMENT_BYTES, "the stop signal")
                self._signal = StopSignal.create(self.job_id)
                if self.requested and self.by is not None:
                    self._signal.set(self.by, self.reason)
            return self._signal.name

    def request(self, by: int, reason: Optional[str]) -> bool:
        """Ask every worker to stop, on behalf of `by` (a worker id, or CONTROLLER); False
        if a stop was requested already (the first reason is kept)."""
        with self._lock:
            if self.requested:  # does nothing (the docs' promise): no line above DEBUG
                log.debug("%s asked to stop job %s (%s); it was already asked by %s (%s)",
                         describe(by), self.job_id, reason or "no reason given",
                         describe(self.by), self.reason or "no reason given")
                return False
            self.requested, self.by, self.reason = True, by, reason
            if self._signal is not None:
                self._signal.set(by, reason)
        log.info(
            "stop requested by %s: %s; every worker sees it now and the job ends when they "
            "have all left", describe(by), reason or "no reason given")
        for listener in self.listeners:
            listener()
        return True

    def message(self) -> Optional[str]:
        """'worker 0 asked job J to stop (reason)' once a stop was requested, else None."""
        if not self.requested:
            return None
        return "%s asked job %s to stop (%s)" % (describe(self.by), self.job_id,
                                                 self.reason or "no reason given")

    def state(self) -> dict:
        """{"stop": bool, "by": int | None, "reason": str | None}, as replies carry it."""
        return {"stop": self.requested, "by": self.by, "reason": self.reason}

    def close(self) -> None:
        """Unlink the segment. Idempotent."""
        with self._lock:
            signal, self._signal = self._signal, None
        if signal is not None:
            signal.close()
