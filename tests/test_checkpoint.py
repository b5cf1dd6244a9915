"""Checkpoints with real files, processes and shared memory: damaged files, NaN, file modes,
and periodic checkpoints that neither stall nor end the serve loop."""

import os
import stat
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from platoon import EASGD, CheckpointError, Controller, Worker
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
    with Worker(ctl.control_port, timeout=5) as w:
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
