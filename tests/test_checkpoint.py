"""Checkpoints with real files, processes and shared memory: damaged files, NaN, file modes,
and periodic checkpoints that neither stall nor end the serve loop."""

import logging
import os
import stat
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from platoon import EASGD, CheckpointError, Controller, Worker, WorkerDied
from platoon import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


def _truncated(path):
    checkpoint.save(path, [np.arange(1000.0)], {"n": 1})
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def _random_bytes(path):
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(4096))


def _empty(path):
    open(path, "wb").close()


def _no_params(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.npy", b"")  # a zip, even an .npz, but without param_0


def _bare_npy(path):
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))


@pytest.mark.parametrize("damage, fault", [
    (_truncated, "BadZipFile|EOFError"), (_random_bytes, "ValueError"), (_empty, "EOFError"),
    (_no_params, "no param_0"), (_bare_npy, "not an .npz archive")])
def test_a_damaged_checkpoint_fails_the_controller_at_start_naming_the_file(tmp_path, damage,
                                                                            fault):
    path = str(tmp_path / "centre.npz")
    damage(path)
    for read in (checkpoint.load, lambda p: Controller(resume_from=p)):
        with pytest.raises(CheckpointError, match=fault) as raised:
            read(path)
        assert path in str(raised.value) and "earlier copy" in str(raised.value)
    if damage is not _no_params:  # (a checkpoint without states is fine for load_states)
        with pytest.raises(CheckpointError, match="shared states of checkpoint %s" % path):
            checkpoint.load_states(path)


def test_a_checkpoint_with_nan_is_refused_unless_allowed(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    saved = [np.array([1.0, np.nan, np.inf], np.float32), np.arange(3.0)]
    checkpoint.save(path, saved)
    with pytest.raises(CheckpointError, match=r"parameter 0 \(shape \(3,\), float32\) holds 2 "
                                              r"NaN or Inf.*allow_nonfinite=True") as raised:
        Controller(resume_from=path)
    assert path in str(raised.value)
    arrays, _ = checkpoint.load(path, allow_nonfinite=True)
    np.testing.assert_array_equal(arrays[0], saved[0])

    ctl = Controller(control_port=0, resume_from=path, allow_nonfinite=True)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        mine = [np.zeros(3, np.float32), np.zeros(3)]
        w.init_shared_params(mine, EASGD(0.5))
        np.testing.assert_array_equal(mine[0], saved[0])
    serving.join()


def test_the_launcher_reports_a_corrupt_resume_at_once(tmp_path):
    bad = tmp_path / "centre.npz"
    _truncated(str(bad))
    done = subprocess.run(
        [sys.executable, "-m", "platoon.launcher", os.path.join(HERE, "experiments", "envcheck"),
         "-n", "1", "--resume", str(bad), "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "the controller did not become ready" in out, out
    assert "CheckpointError: cannot read checkpoint %s" % bad in out, out
    assert not list((tmp_path / "logs").glob("worker*")), out  # no worker was started


def test_checkpoints_are_private_whatever_the_umask(tmp_path):
    path = str(tmp_path / "centre.npz")
    previous = os.umask(0)
    try:
        with open(path, "w") as f:  # an older, world-readable checkpoint is replaced
            f.write("old")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        checkpoint.save(path, [np.arange(4.0)])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["centre.npz"]
    np.testing.assert_array_equal(checkpoint.load(path)[0][0], np.arange(4.0))


class Answering(Controller):
    """Answers any request; carries on when a worker dies."""

    def handle_control(self, req, worker_id, req_info):
        return None

    def handle_worker_death(self, worker_id, exit_info):
        pass


def _poke_until(worker, condition, timeout, what):
    """Send requests until `condition()` holds; returns the longest round trip (s)."""
    deadline = time.monotonic() + timeout
    longest = 0.0
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.3g s waiting for %s" % (timeout, what))
        start = time.monotonic()
        worker.send_req("poke")
        longest = max(longest, time.monotonic() - start)
    return longest


def _messages(caplog, text, level=logging.DEBUG):
    return [r.getMessage() for r in list(caplog.records)
            if r.levelno >= level and text in r.getMessage()]


def _stat_or_none(path):
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def test_a_checkpoint_that_cannot_take_the_lock_is_logged_and_retried(serve, procs, tmp_path,
                                                                       caplog):
    caplog.set_level(logging.DEBUG, logger="platoon.controller")
    path = str(tmp_path / "centre.npz")
    ctl = Answering(control_port=0, checkpoint_path=path, checkpoint_every_s=0.1,
                    checkpoint_lock_timeout_s=0.2, liveness_interval_s=0.05)
    serving = serve(ctl)
    holder = procs("die_worker.py", ctl.control_port, "hold")  # a stopped worker, in effect
    holder.wait_for_line("HOLDING")
    with Worker(ctl.control_port, timeout_s=5) as poker:
        _poke_until(poker, lambda: _messages(caplog, "failed"), 20, "a failed checkpoint")
        # One may have been written before the holder took the lock; none is while it holds it
        # (a checkpoint is skipped while the previous one runs, so none is in flight now).
        written = _stat_or_none(path)
        longest = _poke_until(poker, lambda: len(_messages(caplog, "failed")) >= 3, 20,
                              "three failed checkpoints")
        assert longest < 0.5  # serving went on while the checkpoints waited for the lock
        warned = _messages(caplog, "failed", logging.WARNING)
        assert len(warned) == 1, warned  # logged once, retried quietly
        assert path in warned[0] and "LockTimeout" in warned[0]
        assert _stat_or_none(path) == written
        holder.kill()  # the kernel releases its lock
        _poke_until(poker, lambda: _messages(caplog, "written again"), 20,
                    "a checkpoint once the lock is free")
    serving.join()  # the job completes
    arrays, _ = checkpoint.load(path)
    np.testing.assert_array_equal(arrays[0][:50000], 5.0)  # what the holder wrote


def test_a_failed_final_checkpoint_is_logged_not_raised_over_how_serve_ended(serve, procs,
                                                                           tmp_path, caplog):
    path = str(tmp_path / "centre.npz")
    ctl = Controller(control_port=0, checkpoint_path=path, checkpoint_lock_timeout_s=0.2)
    serving = serve(ctl)
    holder = procs("die_worker.py", ctl.control_port, "hold")
    holder.wait_for_line("HOLDING")
    with pytest.raises(RuntimeError):
        with Worker(ctl.control_port, timeout_s=5):
            raise RuntimeError("training diverged")
    with pytest.raises(WorkerDied, match="training diverged"):  # not LockTimeout
        serving.join(10)
    serving.error = None
    failed = _messages(caplog, "final checkpoint to %s failed (LockTimeout" % path,
                       logging.ERROR)
    assert len(failed) == 1, caplog.text
    assert not os.path.exists(path)


def test_periodic_checkpoints_do_not_stall_control_replies(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    ctl = Answering(control_port=0, checkpoint_path=path)
    serving = serve(ctl, timeout=60)
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_shared_params([np.ones(16 << 20, np.float32)], EASGD(0.5))  # 64 MiB
        idle = _poke_until(w, iter([False] * 200 + [True]).__next__, 20, "200 round trips")
        start = time.monotonic()
        ctl.checkpoint(str(tmp_path / "timed.npz"))
        took = time.monotonic() - start
        ctl.checkpoint_every_s = 0.2
        written = set()

        def two_written():  # the second one begins and ends while requests are answered
            try:
                written.add(os.stat(path).st_mtime_ns)
            except FileNotFoundError:
                pass
            return len(written) >= 2

        longest = _poke_until(w, two_written, 30, "two periodic checkpoints")
        print("round trip: idle max %.4f s, while checkpointing max %.4f s; a checkpoint "
              "takes %.3f s" % (idle, longest, took))
        # Written on the serving thread, a checkpoint would hold replies for all of `took`.
        assert longest < min(0.5, max(0.1, took / 2)), (idle, longest, took)
    serving.join()
