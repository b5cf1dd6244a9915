"""The shared-memory centre: a POSIX segment holding the central parameters, and its lock.

Layout of a segment: a 4 KiB header (magic, owner pid, payload size, number of
parameters; from byte `COUNTERS_OFFSET`, one int64 sync counter per worker id),
then each parameter's bytes, 64-byte aligned, in registration order. Both sides
derive the offsets from the parameter layout alone.

The payload is also cut into stripes (`stripe_ranges`, derived from the layout
alone): element ranges of about equal size, each with its own lock, so workers
update different stripes at the same time.

Locks are open-file-description byte-range locks (``F_OFD_SETLK``), each on a
file descriptor of its own: the kernel drops them when their holder dies, so a
worker killed while syncing never leaves the others blocked. Forked children
(data-loader processes, say) close their copies of those descriptors at once, so
they never keep a dead parent's lock alive. Stripe k locks byte 1 + k; the
whole-centre lock covers bytes 0 .. stripes, so it excludes every stripe, also
between the threads of one process (each lock's descriptor is its own open file
description).
"""

import errno
import fcntl
import logging
import math
import mmap
import os
import stat
import struct
import threading
import time
import weakref
from typing import List, Optional, Tuple

import numpy as np
import posix_ipc

from .._os.process import SEGMENT_PREFIX, own_segments, pid_alive  # noqa: F401  (re-exported)
from ..errors import LockTimeout, PlatoonError, SegmentExists

log = logging.getLogger(__name__)

MAGIC = b"PLATOON\x01"
HEADER = struct.Struct("<8sqqq")  # magic, owner pid, payload bytes, number of parameters
HEADER_BYTES = 4096
COUNTERS_OFFSET = 512  # the workers' sync counters, each written by its worker only
COUNTED_WORKERS = (HEADER_BYTES - COUNTERS_OFFSET) // 8  # worker ids 0..447 are counted
ALIGN = 64
MAX_STRIPES = 64
NAME_ATTEMPTS = 8  # random names tried for a new segment before giving up
MIN_STRIPE_BYTES = 1 << 20  # smaller stripes cost more in lock calls than they gain
STRIPE_ALIGN_ELEMENTS = 16  # stripes of float32 never share a 64-byte cache line


_LOCKS: "weakref.WeakSet[CentreLock]" = weakref.WeakSet()


def _forget_locks_after_fork():
    for lock in list(_LOCKS):
        lock._forget_after_fork()  # noqa: SLF001 (a lock of this module)


os.register_at_fork(after_in_child=_forget_locks_after_fork)


def _path(name):
    return "/dev/shm" + name


def new_segment_name(job_id, kind):
    """A fresh name for a segment of job `job_id`: ``/platoon-JOB-KIND-TOKEN``, TOKEN 16
    random hex digits. The job id is no secret (anyone can list /dev/shm), the token is:
    nobody can create the name before we do. Workers learn it from the controller."""
    import secrets  # (loads OpenSSL, a few ms: only the controller names segments)

    return "%s%s-%s-%s" % (SEGMENT_PREFIX, job_id, kind, secrets.token_hex(8))


def segment_owner(path):
    """Owner pid recorded in a centre segment's header, or None if it is not one of ours.

    Only a regular file owned by this user is opened, without following a symlink and
    without blocking: a FIFO or device named like a segment (anyone can make one in
    /dev/shm) is skipped, never waited on.
    """
    try:
        before = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(before.st_mode) or before.st_uid != os.getuid():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # gone, or swapped for a symlink since the lstat
        return None
    try:
        now = os.fstat(fd)
        if (not stat.S_ISREG(now.st_mode) or now.st_uid != os.getuid()
                or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino)):
            return None  # swapped for something else since the lstat
        magic, pid, _, _ = HEADER.unpack(os.pread(fd, HEADER.size, 0))
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    return pid if magic == MAGIC and pid > 0 else None


def remove_stale_segments(shm_dir="/dev/shm"):
    """Unlink centres whose owner process is dead (left by a job that crashed); returns them.

    Segments of live owners, and files that are not platoon centres (anything but a regular
    file of this user with a centre's header), are never touched.
    """
    removed = []
    for path in own_segments(SEGMENT_PREFIX, shm_dir):
        owner = segment_owner(path)
        if owner is not None and owner != os.getpid() and not pid_alive(owner):
            try:
                os.unlink(path)
            except OSError:
                continue
            log.warning("removed %s, left by a dead job (owner pid %d)", path, owner)
            removed.append(path)
    return removed


def param_offsets(layout):
    """Byte offsets of each parameter and the total segment size for a layout."""
    offsets, pos = [], HEADER_BYTES
    for entry in layout:
        offsets.append(pos)
        nbytes = math.prod(entry["shape"]) * np.dtype(entry["dtype"]).itemsize
        pos += -(-nbytes // ALIGN) * ALIGN
    return offsets, max(pos, HEADER_BYTES + ALIGN)


def stripe_ranges(layout, max_stripes=MAX_STRIPES, min_bytes=MIN_STRIPE_BYTES):
    """Cut a layout's payload into stripes of about equal bytes.

    Returns a list of stripes, each a list of ``(param_index, start, stop)``
    ranges of flat element indices; together they cover every element once.
    """
    sizes = [(int(np.prod(e["shape"], dtype=np.int64)), np.dtype(e["dtype"]).itemsize)
             for e in layout]
    total = sum(n * size for n, size in sizes)
    count = int(max(1, min(max_stripes, total // min_bytes)))
    stripes: List[List[Tuple[int, int, int]]] = [[] for _ in range(count)]
    pos = 0
    for index, (n, size) in enumerate(sizes):
        start = 0
        while start < n:
            k = min(count - 1, (pos + start * size) * count // total)
            if k == count - 1:
                stop = n
            else:  # up to the stripe's end byte, rounded up to whole aligned elements
                end = -(-(k + 1) * total // count)
                stop = -(-(end - pos) // size)
                stop = min(n, -(-stop // STRIPE_ALIGN_ELEMENTS) * STRIPE_ALIGN_ELEMENTS)
            stripes[k].append((index, start, stop))
            start = stop
        pos += n * size
    return [s for s in stripes if s] or [[]]


class CentreLock:
    """Exclusive lock on the centre, shared by the threads of one process and between processes.

    Re-entrant within a thread. `acquire(timeout)` takes float seconds, None
    waits forever; it raises LockTimeout when the time runs out.
    """

    _OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
    _OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)

    def __init__(self, fd, name, start=0, length=1):
        self._fd = fd
        self._name = name
        _LOCKS.add(self)
        self._start = start
        self._length = length
        self._thread_lock = threading.Lock()
        self._owner = None
        self._depth = 0

    def _flock(self, kind):
        return struct.pack("hhqqi4x", kind, os.SEEK_SET, self._start, self._length, 0)

    def _try_range(self, blocking):
        if self._OFD_SETLK is None:  # no OFD locks (non-Linux): classic per-process record lock
            flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
            try:
                fcntl.lockf(self._fd, flags, self._length, self._start)
                return True
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return False
                raise
        cmd = self._OFD_SETLKW if blocking else self._OFD_SETLK
        assert cmd is not None  # F_OFD_SETLKW comes with F_OFD_SETLK
        try:
            fcntl.fcntl(self._fd, cmd, self._flock(fcntl.F_WRLCK))
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def _release_range(self):
        if self._OFD_SETLK is None:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, self._length, self._start)
        else:
            fcntl.fcntl(self._fd, self._OFD_SETLK, self._flock(fcntl.F_UNLCK))

    def _forget_after_fork(self):
        """In a forked child: drop the inherited descriptor and the parent's lock state."""
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None
        self._thread_lock = threading.Lock()
        self._owner = None
        self._depth = 0

    def fileno(self):
        """The descriptor whose bytes `start` .. `start` + `length` - 1 this lock locks (OFD
        locks, on Linux), for code that takes it without Python (all_reduce's compiled
        meeting, which locks byte 0 of an unstriped segment); -1 once closed."""
        return -1 if self._fd is None else self._fd

    def close(self):
        """Release the descriptor (and with it any lock it holds). Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _LOCKS.discard(self)

    def acquire(self, timeout=None):
        if self._fd is None:
            raise PlatoonError("the centre's lock %s is closed (or this process was forked "
                               "from its owner); attach to the centre again" % self._name)
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise self.timeout_error(timeout)
        try:
            if timeout is None:
                self._try_range(blocking=True)
            else:
                pause = 20e-6
                assert deadline is not None  # set above, with the timeout
                while not self._try_range(blocking=False):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self.timeout_error(timeout)
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 1e-3)
        except BaseException:
            self._abandon()
            raise
        self._owner = me
        self._depth = 1

    def _abandon(self):
        """Leave an acquire that an exception cut short, the range released too: a signal's
        handler (SIGTERM's SystemExit) runs as the lock call returns, so the range may be
        taken by then, and a worker leaving while it holds the range blocks everyone."""
        try:
            self._release_range()  # unlocking a range this descriptor does not hold does nothing
        finally:
            self._thread_lock.release()

    def try_acquire(self):
        """Take the lock if nobody holds it; True if taken. Never waits."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._thread_lock.acquire(blocking=False):
            return False
        try:
            taken = self._try_range(blocking=False)
        except BaseException:
            self._abandon()
            raise
        if not taken:
            self._thread_lock.release()
            return False
        self._owner = me
        self._depth = 1
        return True

    def release(self):
        if self._owner != threading.get_ident():
            raise PlatoonError("unlock() called by a thread that does not hold the centre's lock; "
                               "call lock() and unlock() from the same thread")
        self._depth -= 1
        if self._depth == 0:
            released = False
            try:
                self._release_range()
                released = True
            finally:
                self._owner = None
                if released:
                    self._thread_lock.release()
                else:  # an exception (a signal's) came before the range was released
                    self._abandon()

    @property
    def held(self):
        """True when the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def timeout_error(self, timeout):
        """The LockTimeout to raise after waiting `timeout` s for this lock."""
        return LockTimeout("could not lock the centre %s within %.3g s; another worker holds it "
                           "(a stopped process?) - raise the timeout or find the holder"
                           % (self._name, timeout))

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class SharedCentre:
    """A job's central parameters in POSIX shared memory, as numpy views.

    `create` makes the segment (mode 0600) and owns it: `unlink` removes it.
    `attach` maps an existing one. `close` unmaps; it is idempotent.
    """

    def __init__(self, shm, layout, owner, striped=True):
        self.name = shm.name
        self.layout = layout
        self.owner = owner
        self._shm = shm
        offsets, self.size = param_offsets(layout)
        self._map: Optional[mmap.mmap] = mmap.mmap(shm.fd, self.size)
        self.arrays = [
            np.ndarray(tuple(e["shape"]), np.dtype(e["dtype"]), buffer=self._map, offset=off)
            for e, off in zip(layout, offsets)]
        self.sync_counts = np.ndarray((COUNTED_WORKERS,), np.int64, buffer=self._map,
                                      offset=COUNTERS_OFFSET)  # syncs, by worker id
        # Each lock has a descriptor of its own (the mapping keeps a duplicate of shm.fd).
        self.stripes = stripe_ranges(layout) if striped else []
        self.stripe_locks = []
        self.lock = CentreLock(self._open_fd(), self.name, 0, 1 + len(self.stripes))
        try:
            for k in range(len(self.stripes)):
                self.stripe_locks.append(CentreLock(
                    self._open_fd(), "%s stripe %d" % (self.name, k), 1 + k, 1))
        except BaseException:  # out of descriptors, say: give back those already opened
            for lock in [self.lock] + self.stripe_locks:
                lock.close()
            raise
        self._closed = False
        self._close_hooks = []

    def _open_fd(self):
        return os.open(_path(self.name), os.O_RDWR | os.O_CLOEXEC)

    @classmethod
    def create(cls, job_id, layout, kind="centre", striped=True):
        """Create a new segment of job `job_id` for `layout` under a name of its own
        (`new_segment_name`); a name that exists already (squatted by someone who guessed
        it) is answered by drawing another. Raises PlatoonError after `NAME_ATTEMPTS`
        taken names, or if the segment does not fit in /dev/shm."""
        for _ in range(NAME_ATTEMPTS):
            name = new_segment_name(job_id, kind)
            try:
                return cls.create_named(name, layout, striped)
            except SegmentExists:
                log.warning("shared memory %s exists already, though its name was drawn at "
                            "random (created by another local user?); drawing another", name)
        raise PlatoonError("could not create the %s segment of job %s: %d names drawn at random "
                           "in /dev/shm/platoon-%s-%s-* all existed already; another local "
                           "user may be squatting them: see who owns them (ls -l /dev/shm)"
                           % (kind, job_id, NAME_ATTEMPTS, job_id, kind))

    @classmethod
    def create_named(cls, name, layout, striped=True):
        """Create segment `name` (mode 0600, fully allocated, header naming this process as
        owner); raises SegmentExists if it exists, PlatoonError if it does not fit in
        /dev/shm."""
        _, size = param_offsets(layout)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            raise SegmentExists("shared memory %s already exists (another job's, or created by "
                                "someone else); choose another name" % name) from None
        try:
            try:
                os.posix_fallocate(shm.fd, 0, size)  # fail now, not with SIGBUS on first touch
            except OSError as exc:
                raise PlatoonError("cannot allocate %d bytes of shared memory for %s (%s); "
                                   "free space in /dev/shm or share less"
                                   % (size, name, exc.strerror)) from None
            centre = cls(shm, layout, owner=True, striped=striped)
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(name)
            raise
        assert centre._map is not None  # open until close()
        HEADER.pack_into(centre._map, 0, MAGIC, os.getpid(), size - HEADER_BYTES, len(layout))
        return centre

    @classmethod
    def attach(cls, name, layout, striped=True):
        """Map the existing segment `name`; raises PlatoonError if it is gone or too small."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise PlatoonError("shared memory %s does not exist: the controller has closed the "
                               "job or died" % name) from None
        _, size = param_offsets(layout)
        if shm.size < size:
            shm.close_fd()
            raise PlatoonError("shared memory %s holds %d bytes but the layout needs %d"
                               % (name, shm.size, size))
        try:
            return cls(shm, layout, owner=False, striped=striped)
        except BaseException:
            shm.close_fd()
            raise

    def snapshot(self, timeout_s):
        """Copies of the arrays, taken under the whole lock; LockTimeout if it is not free
        within `timeout_s` seconds (None: wait forever)."""
        self.lock.acquire(timeout_s)
        try:
            return [a.copy() for a in self.arrays]
        finally:
            self.lock.release()

    def mapping(self):
        """(address, bytes) of the whole mapping (page-aligned: an mmap), for registering it
        with CUDA; PlatoonError once closed."""
        if self._map is None:
            raise PlatoonError("the centre %s is closed" % self.name)
        return np.frombuffer(self._map, np.uint8).ctypes.data, self.size

    def on_close(self, hook):
        """Call `hook()` in `close`, while the mapping is still mapped (unregistering it from
        CUDA must come before the unmap); hooks run newest first, errors are logged."""
        self._close_hooks.append(hook)

    def close(self):
        if self._closed:
            return
        self._closed = True
        while self._close_hooks:
            hook = self._close_hooks.pop()
            try:
                hook()
            except Exception:
                log.exception("a close hook of the centre %s failed", self.name)
        # Views the user still holds keep the mapping alive (numpy does not pin an mmap's
        # buffer, so closing it explicitly could leave them dangling); the last one unmaps.
        self.arrays = []
        self.sync_counts = np.zeros(0, np.int64)
        self._map = None
        self.lock.close()
        for lock in self.stripe_locks:
            lock.close()
        self._shm.close_fd()

    def unlink(self):
        """Remove the segment's name (owner only); mappings that exist stay valid."""
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        if self.owner:
            self.unlink()
