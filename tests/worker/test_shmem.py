"""The shared centre segment and its lock, with real POSIX shared memory and processes."""

import os
import signal
import stat
import threading
import time

import numpy as np
import pytest

from platoon import LockTimeout, PlatoonError
from platoon._centre.shmem import SharedCentre, param_offsets
from platoon.protocol import layout_of

LAYOUT = layout_of([np.zeros(4)])


@pytest.fixture
def centre():
    c = SharedCentre.create("test%d" % os.getpid() + os.urandom(4).hex(), LAYOUT)
    yield c
    c.close()
    c.unlink()


def test_segment_is_private_and_views_are_shared(centre):
    mode = os.stat("/dev/shm" + centre.name).st_mode
    assert stat.S_IMODE(mode) == 0o600
    other = SharedCentre.attach(centre.name, LAYOUT)
    try:
        centre.arrays[0][:] = [1, 2, 3, 4]
        np.testing.assert_array_equal(other.arrays[0], [1, 2, 3, 4])
    finally:
        other.close()


def test_offsets_are_aligned():
    layout = layout_of([np.zeros(3, np.float32), np.zeros((5, 7)), np.zeros(1, np.int8)])
    offsets, size = param_offsets(layout)
    assert all(off % 64 == 0 for off in offsets)
    assert offsets[1] - offsets[0] >= 12 and size >= offsets[2] + 1


def test_two_jobs_never_share_a_segment():
    first = SharedCentre.create("dup" + os.urandom(4).hex(), LAYOUT)
    try:
        with pytest.raises(PlatoonError, match="already exists"):
            SharedCentre.create_named(first.name, LAYOUT)
    finally:
        first.close()
        first.unlink()


def test_attach_to_missing_segment():
    with pytest.raises(PlatoonError, match="does not exist"):
        SharedCentre.attach("/platoon-nosuchjob-centre-0", LAYOUT)


def test_close_is_idempotent_and_survives_live_views(centre):
    other = SharedCentre.attach(centre.name, LAYOUT)
    view = other.arrays[0]
    other.close()
    other.close()
    view[0] = 3.0  # the mapping lives as long as the view
    assert centre.arrays[0][0] == 3.0


def test_lock_excludes_another_holder_and_times_out(centre):
    other = SharedCentre.attach(centre.name, LAYOUT)
    try:
        centre.lock.acquire()
        start = time.monotonic()
        with pytest.raises(LockTimeout, match="within 0.2 s"):
            other.lock.acquire(timeout=0.2)
        assert 0.15 < time.monotonic() - start < 2.0
        centre.lock.release()
        other.lock.acquire(timeout=1.0)
        other.lock.release()
    finally:
        other.close()


def test_lock_is_reentrant_in_a_thread_and_exclusive_between_threads(centre):
    lock = centre.lock
    lock.acquire()
    lock.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(_try(lock, 0.1)))
    t.start()
    t.join(5)
    assert got == [False]
    lock.release()
    lock.release()
    with pytest.raises(PlatoonError, match="does not hold"):
        lock.release()


class _Signalled(BaseException):
    """What a signal's handler raises (SIGTERM's SystemExit, Ctrl-C's KeyboardInterrupt)."""


def _signalled_after(call):
    """`call`, then the exception a signal's handler raises as the call returns (Python runs
    handlers between bytecodes, so right after the lock's system call is one place)."""
    def cut_short(*args, **kwargs):
        call(*args, **kwargs)
        raise _Signalled()
    return cut_short


def _signalled_before(call):
    """The exception a signal's handler raises just before `call` would run (once: a second
    call runs)."""
    raised = []

    def cut_short(*args, **kwargs):
        if not raised:
            raised.append(True)
            raise _Signalled()
        return call(*args, **kwargs)
    return cut_short


@pytest.mark.parametrize("step, timeout", [("acquire", None), ("acquire", 1.0),
                                           ("try_acquire", None), ("release", None)])
def test_a_signal_in_the_lock_calls_leaves_the_lock_free(centre, step, timeout):
    """A worker stopped by SIGTERM tells the controller it is done before it exits; a range
    left locked by the signal would stall every other process meanwhile (the controller's
    final checkpoint among them)."""
    other = SharedCentre.attach(centre.name, LAYOUT)
    lock = centre.lock
    try:
        if step == "release":
            lock.acquire()
            lock._release_range = _signalled_before(lock._release_range)
            with pytest.raises(_Signalled):
                lock.release()
        else:
            lock._try_range = _signalled_after(lock._try_range)
            with pytest.raises(_Signalled):
                if step == "acquire":
                    lock.acquire(timeout)
                else:
                    lock.try_acquire()
        for name in ("_try_range", "_release_range"):
            vars(lock).pop(name, None)
        assert _try(other.lock, 0.5), "another process cannot take the lock"
        assert not lock.held and _try(lock, 0.5), "this process cannot take the lock again"
    finally:
        other.close()


def _try(lock, timeout):
    try:
        lock.acquire(timeout)
    except LockTimeout:
        return False
    lock.release()
    return True


@pytest.mark.parametrize("fork", [False, True])
def test_lock_of_a_killed_holder_is_released(centre, procs, fork):
    holder = procs("hold_lock.py", centre.name, *(["fork"] if fork else []))
    holder.wait_for_line("LOCKED")
    assert not _try(centre.lock, 0.05)
    if fork:  # kill the holder alone: its forked child lives on
        os.kill(holder.pid, signal.SIGKILL)
        holder.popen.wait(5)
    else:
        holder.kill()
    start = time.monotonic()
    centre.lock.acquire(timeout=5)
    released_after = time.monotonic() - start
    centre.lock.release()
    assert released_after < 1.0
    np.testing.assert_array_equal(centre.arrays[0], [7, 7, 0, 0])  # its writes stay, nothing else
