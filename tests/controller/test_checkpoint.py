"""Checkpoints with real files, processes and shared memory: damaged files, NaN, file modes,
and periodic checkpoints that neither stall nor end the serve loop."""

import io
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from platoon import (
    EASGD,
    CheckpointError,
    Controller,
    DiLoCo,
    LayoutMismatch,
    PlatoonError,
    Worker,
    WorkerDied,
    load_centre,
    protocol,
)
from platoon._centre import checkpoint
from platoon._os.process import unlink_job_segments

from helpers import EXPERIMENTS


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


def _npy(array):
    """The bytes of `array` saved as an .npy file."""
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _no_params(path):
    with zipfile.ZipFile(path, "w") as z:  # an .npz, but without param_0
        z.writestr("meta.npy", _npy(np.frombuffer(b"{}", np.uint8)))


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


def _forged_npy(shape, descr="<f8", data=b"\0" * 16):
    """An .npy entry whose header claims `shape` of `descr` but that holds only `data`."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return out.getvalue() + data


@pytest.mark.parametrize("shape, descr, form", [
    ((1 << 40,), "<f8", "npz"),  # 8 TiB: MemoryError once
    ((1 << 62, 1 << 62), "<f8", "npz"),  # OverflowError once
    ((200_000_000,), "<f8", "npz"),  # 1.6 GB: allocated in full, then EOFError, once
    ((200_000_000,), "<f8", "deflated"),
    ((1 << 40,), "<f8", "npy"),  # a bare .npy was read whole before it was refused
    ((2,), "|O", "npz"),  # objects: never in a checkpoint
])
def test_a_forged_header_is_refused_before_anything_is_allocated(tmp_path, shape, descr, form):
    path = str(tmp_path / "centre.npz")
    if form == "npy":
        with open(path, "wb") as f:
            f.write(_forged_npy(shape, descr))
    else:
        method = zipfile.ZIP_DEFLATED if form == "deflated" else zipfile.ZIP_STORED
        with zipfile.ZipFile(path, "w", compression=method) as z:
            z.writestr("param_0.npy", _forged_npy(shape, descr))
            z.writestr("meta.npy", _npy(np.frombuffer(b"{}", np.uint8)))
    assert os.path.getsize(path) < 1000
    reads = [checkpoint.load, load_centre, checkpoint.load_states,
             lambda p: Controller(resume_from=p)]
    tracemalloc.start()  # numpy reports its arrays' memory to tracemalloc
    try:
        for read in reads:
            with pytest.raises(CheckpointError) as raised:
                read(path)
            message = str(raised.value)
            assert path in message and "earlier copy" in message, message
            assert ("claims shape" in message or "Python objects" in message
                    or "not an .npz archive" in message), message
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # nothing of what the header claims was allocated


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
        [sys.executable, "-m", "platoon.launch.cli", os.path.join(EXPERIMENTS, "envcheck"),
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


def test_a_centre_whose_first_values_are_not_written_yet_is_never_saved(serve, tmp_path):
    """Between the centre's creation and its first worker's values (an interrupt then, or a
    worker that dies before writing) the centre holds nothing of the job's: a checkpoint of
    it would resume a job from zeros. It is refused, saying why, and serve's end writes none."""
    path = tmp_path / "centre.npz"
    ctl = Answering(control_port=0, checkpoint_path=str(path))
    serving = serve(ctl, timeout=30)
    with Worker(ctl.control_port, timeout_s=10) as w:
        reply = w.send_req(protocol.INIT_PARAMS, {  # the first worker's request, no values
            "layout": protocol.layout_of([np.ones(8, np.float32)]), "rule": "EASGD(0.5)"})
        assert reply["initialise"] and ctl.shared_centre is not None
        with pytest.raises(PlatoonError, match="no worker has written the centre's first "
                                               "values yet"):
            ctl.checkpoint()
    serving.join(10)
    assert not path.exists()


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


def test_resume_round_trips_parameters_larger_than_a_chunk(serve, tmp_path):
    """Parameters at and beyond every boundary of the chunks that NaN/Inf are counted in."""
    chunk = checkpoint._CHUNK
    rng = np.random.default_rng(0)
    saved = [rng.standard_normal(n).astype(np.float32)
             for n in (chunk - 1, chunk, chunk + 1, 3 * chunk + 7)]
    saved.append(rng.standard_normal((2, chunk + 3)))  # float64, 2-D
    first, second = str(tmp_path / "first.npz"), str(tmp_path / "second.npz")
    checkpoint.save(first, saved)
    ctl = Controller(control_port=0, resume_from=first, checkpoint_path=second)
    serving = serve(ctl, timeout=60)
    with Worker(ctl.control_port, timeout_s=30) as w:
        mine = [np.zeros_like(a) for a in saved]
        w.init_shared_params(mine, EASGD(0.5))
        for got, want in zip(mine, saved):
            np.testing.assert_array_equal(got, want)
    serving.join(60)  # its final checkpoint is `second`
    again, _ = checkpoint.load(second)
    for got, want in zip(again, saved):
        np.testing.assert_array_equal(got, want)
    Controller(resume_from=second).close()  # resumable in turn
    saved[3][2 * chunk + 5] = np.nan  # one bad value, in the third chunk
    checkpoint.save(first, saved)
    with pytest.raises(CheckpointError, match=r"parameter 3 \(shape \(%d,\), float32\) holds 1 "
                                              r"NaN or Inf" % (3 * chunk + 7)):
        checkpoint.load(first)


def _temporaries(directory, min_bytes=0):
    found = set()
    for name in os.listdir(directory):
        if name.endswith(".tmp"):
            try:
                if os.path.getsize(os.path.join(directory, name)) >= min_bytes:
                    found.add(name)
            except FileNotFoundError:
                pass  # replaced meanwhile
    return found


def _kill_mid_write(procs, path, job_id):
    """Run a controller of `job_id` checkpointing to `path`; once one checkpoint is written,
    SIGKILL it while it writes another; return the temporary it left."""
    directory = os.path.dirname(path)
    before = _temporaries(directory)
    writer = procs("ckpt_writer.py", path, job_id)
    writer.wait_for_line("WRITTEN", timeout=60)
    deadline = time.monotonic() + 30
    while not _temporaries(directory, min_bytes=1 << 20) - before:  # part-written
        if time.monotonic() > deadline:
            pytest.fail("no checkpoint temporary of 1 MiB appeared within 30 s:\n%s"
                        % writer.output)
        time.sleep(0.001)  # polling another process's files, bounded by the deadline
    writer.kill()
    unlink_job_segments(job_id)  # what its controller would have removed
    left = _temporaries(directory) - before
    assert len(left) == 1, left
    return left.pop()


@pytest.mark.parametrize("again", ["restarted", "resumed"])
def test_a_checkpoint_removes_temporaries_its_job_left_when_killed_mid_write(serve, procs,
                                                                             tmp_path, again):
    path = str(tmp_path / "centre.npz")
    job, other_job = "ours-" + secrets.token_hex(4), "theirs-" + secrets.token_hex(4)
    theirs = _kill_mid_write(procs, path, other_job)  # another job, same file
    ours = _kill_mid_write(procs, path, job)  # the last checkpoint written is ours
    assert _temporaries(tmp_path) == {ours, theirs}
    if again == "restarted":  # the same job again (its id, its checkpoint path)
        ctl = Controller(control_port=0, job_id=job, checkpoint_path=path)
    else:  # a new job resuming from the checkpoint our job wrote last, and writing there
        ctl = Controller(control_port=0, resume_from=path, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_shared_params([np.zeros(16 << 20, np.float32)], EASGD(0.5))
        ctl.checkpoint()
        assert _temporaries(tmp_path) == {theirs}  # ours is gone; another job's is not ours
    serving.join()
    np.testing.assert_array_equal(checkpoint.load(path)[0][0][:10],
                                  0.0 if again == "restarted" else 1.0)


def test_the_centre_is_saved_with_its_parameter_names_and_loads_by_name(serve, tmp_path):
    path, again = str(tmp_path / "centre.npz"), str(tmp_path / "again.npz")
    ctl = Controller(control_port=0, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as first, \
            Worker(ctl.control_port, timeout_s=10) as second:
        first.init_shared_params([np.ones((2, 3)), np.arange(3.0)], EASGD(0.5),
                                 names=["fc.weight", "fc.bias"])
        with pytest.raises(LayoutMismatch, match=r"parameter 1 is named 'bias' here but "
                                                 r"'fc.bias' in the job's centre"):
            second.init_shared_params([np.ones((2, 3)), np.arange(3.0)], EASGD(0.5),
                                      names=["fc.weight", "bias"])
    serving.join()
    centre = load_centre(path)
    assert list(centre) == ["fc.weight", "fc.bias"]
    np.testing.assert_array_equal(centre["fc.bias"], np.arange(3.0))
    # Resumed by workers that give no names, the centre keeps the checkpoint's.
    ctl = Controller(control_port=0, resume_from=path, checkpoint_path=again)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w, \
            Worker(ctl.control_port, timeout_s=10) as other:
        with pytest.raises(LayoutMismatch, match=r"parameter 0 is named 'w' here but "
                                                 r"'fc.weight' in the checkpoint %s" % path):
            other.init_shared_params([np.zeros((2, 3)), np.zeros(3)], EASGD(0.5),
                                     names=["w", "b"])
        w.init_shared_params([np.zeros((2, 3)), np.zeros(3)], EASGD(0.5))
    serving.join()
    assert list(load_centre(again)) == ["fc.weight", "fc.bias"]
    # A checkpoint written without names (by an older platoon, or of unnamed parameters).
    checkpoint.save(path, [np.zeros(2), np.ones(1)], {"job_id": "old"})
    assert list(load_centre(path)) == ["param_0", "param_1"]


@pytest.mark.parametrize("names, error, message", [
    (["a", "a"], ValueError, "'a' is given twice"),
    (["a"], ValueError, "one for each of the 2 parameters is needed, got 1"),
    (["a", 3], TypeError, "name 1 is 3, not a non-empty string"),
    (["a", ""], TypeError, "name 1 is '', not a non-empty string"),
    ("ab", TypeError, "a list of strings"),
])
def test_bad_parameter_names_are_refused_before_anything_is_shared(serve, names, error, message):
    ctl = Controller(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        with pytest.raises(error, match=re.escape(message)):
            w.init_shared_params([np.zeros(2), np.zeros(3)], EASGD(0.5), names=names)
        assert ctl.centre is None
        w.init_shared_params([np.zeros(2), np.zeros(3)], EASGD(0.5), names=["a", "b"])
    serving.join()


def test_a_checkpoint_holds_the_centre_and_the_shared_state_of_one_instant(serve, procs):
    """Two workers push through Downpour(Adam) all along: each push moves the centre by
    exactly -LR and adds one to Adam's step count, so a checkpoint taken between two pushes
    holds centre == -LR * steps. One that copied the centre and the state under two
    separate holds of the lock would (now and then: 1-8% of them here) hold a push in one
    and not the other. The checkpoints go to tmpfs, where fsync costs nothing, so that
    hundreds take a few seconds."""
    directory = tempfile.mkdtemp(prefix="checkpoint-test-", dir="/dev/shm")
    path = os.path.join(directory, "centre.npz")
    ctl = Answering(control_port=0, checkpoint_path=path)  # carries on when they are killed
    try:
        serving = serve(ctl, timeout=120)
        pushers = [procs("adam_pusher.py", ctl.control_port) for _ in range(2)]
        for pusher in pushers:
            pusher.wait_for_line("READY", timeout=60)
        torn, taken = [], 0
        deadline = time.monotonic() + 15  # (under load, fewer)
        while taken < 300 and time.monotonic() < deadline:
            ctl.checkpoint()
            taken += 1
            (weights, bias), _ = checkpoint.load(path)
            steps = checkpoint.load_states(path)["downpour"][-1]  # Adam's count, by parameter
            for index, centre in enumerate((weights, bias)):
                if not np.all(centre == -0.0625 * steps[index]):
                    torn.append((index, np.unique(centre / -0.0625), steps[index]))
        assert steps[0] > taken, (steps, taken)  # the workers pushed meanwhile
        assert not torn, "%d of %d checkpoints tore the centre (pushes) from the state: %s" % (
            len(torn), taken, torn[:5])
        for pusher in pushers:
            pusher.kill()
        serving.join(60)
    finally:
        ctl.checkpoint_path = None  # no final checkpoint when serving ends (after a failure)
        shutil.rmtree(directory)


def _diloco_checkpoint(serve, path):
    """A one-worker DiLoCo job's checkpoint (centre, momentum, journal): (params, states)."""
    ctl = Controller(control_port=0, num_workers=1, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = [np.zeros(5, np.float32), np.ones((2, 3))]
        w.init_shared_params(params, DiLoCo(0.5, 0.9))
        for _ in range(2):
            for p in params:
                p += 1
            w.sync_params()
    serving.join()
    arrays, meta = checkpoint.load(path)
    states = checkpoint.load_states(path)
    assert {"diloco", "diloco-journal"} <= set(states), sorted(states)
    return arrays, meta, states


def _refused(path, match):
    """Every way to read `path`'s rule states refuses it, naming the file and `match`."""
    for read in (checkpoint.load_states, lambda p: Controller(resume_from=p)):
        with pytest.raises(CheckpointError, match=match) as raised:
            read(path)
        assert path in str(raised.value)


def test_a_nonfinite_rule_state_is_refused_when_the_checkpoint_is_read(serve, tmp_path):
    """An Inf in a checkpoint's DiLoCo momentum was taken, and one sync wrote -inf into the
    centre; it is refused at read time, as a NaN in the centre is."""
    path = str(tmp_path / "centre.npz")
    arrays, meta, states = _diloco_checkpoint(serve, path)
    states["diloco"][1][0, 2] = np.inf
    checkpoint.save(path, arrays, meta, states)
    _refused(path, r"shared state 'diloco', array 1 \(shape \(2, 3\), float64\) holds 1 NaN or "
                   r"Inf.*allow_nonfinite=True")
    assert checkpoint.load_states(path, allow_nonfinite=True)["diloco"][1][0, 2] == np.inf
    Controller(resume_from=path, allow_nonfinite=True).close()


@pytest.mark.parametrize("record, why", [
    ([1, 0, 3, 4], r"elements \[3, 7\) of parameter 0, which has 5"),
    ([1, 2, 0, 1], r"parameter 2, and the centre has 2"),
    ([1, 1, 0, 1000], r"1000 elements, more than its rows' 6"),
    ([1, 0, -1, 1], r"elements \[-1, 0\) of parameter 0"),
    ([7, 0, 0, 1], r"flag 7"),
])
def test_a_journal_record_that_does_not_fit_is_refused_when_read(serve, tmp_path, record, why):
    """A committed journal record that does not fit made every sync fail with a bare numpy
    ValueError naming no file."""
    path = str(tmp_path / "centre.npz")
    arrays, meta, states = _diloco_checkpoint(serve, path)
    states["diloco-journal"][0][0] = record
    checkpoint.save(path, arrays, meta, states)
    _refused(path, r"shared state 'diloco-journal'.*slot 0.*%s" % why)


def test_a_committed_journal_record_holding_inf_is_refused(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    arrays, meta, states = _diloco_checkpoint(serve, path)
    journal = states["diloco-journal"]
    journal[0][0] = [1, 0, 0, 2]  # committed: recovery would copy its rows into the centre
    journal[1][0, 1] = -np.inf
    checkpoint.save(path, arrays, meta, states)
    _refused(path, r"shared state 'diloco-journal'.*slot 0.*NaN or Inf")
    journal[0][0] = [0, 0, 0, 2]  # not committed: its rows are scratch, never read
    checkpoint.save(path, arrays, meta, states)
    Controller(resume_from=path).close()
