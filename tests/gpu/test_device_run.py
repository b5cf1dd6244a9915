"""tests/gpu/device_run.sh, the one-shot GPU check, runs cleanly where there is no GPU: every
stage says so and it exits 0 at once (on the GPU machine nothing may fail for a typo)."""

import os
import shutil
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_run.sh")
STAGES = ["probe", "setup", "gputests", "launch", "suite", "bench"]


def device_run(tmp_path, *stages):
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    env = dict(os.environ, OUT=str(tmp_path / "out"), DEVICE_RUN_NO_GPU="1")
    proc = subprocess.run(["bash", SCRIPT] + list(stages), capture_output=True, text=True,
                          timeout=60, env=env, cwd=str(tmp_path))
    return proc.returncode, proc.stdout + proc.stderr


def test_without_a_gpu_every_stage_says_so_and_the_run_ends_cleanly(tmp_path):
    code, out = device_run(tmp_path, *STAGES)
    assert code == 0, out
    for stage in STAGES:
        line = "device_run: %s: skipped, no GPU here (DEVICE_RUN_NO_GPU is set)" % stage
        assert line in out
        assert line in (tmp_path / "out" / (stage + ".log")).read_text()


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    code, out = device_run(tmp_path, "probe", "tests")
    assert code == 2 and "unknown stage 'tests' (stages: %s)" % " ".join(STAGES) in out, out
    assert not (tmp_path / "out" / "probe.log").exists()
    code, out = device_run(tmp_path)
    assert code == 2 and "usage:" in out, out
