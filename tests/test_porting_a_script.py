"""examples/lm: an ordinary training script, the same as a platoon job (run here under the
launcher, with real processes) and as a DDP job, and the diffs docs/porting-a-script.md shows."""

import difflib
import json
import os
import re
import subprocess
import sys

import pytest

from platoon import load_centre
from platoon._os.process import job_segments

from helpers import ROOT

LM = os.path.join(ROOT, "examples", "lm")
PAGE = os.path.join(ROOT, "docs", "porting-a-script.md")
QUICK = ["--epochs", "2", "--max-batches", "12", "--valid-bytes", "2000"]


def diff_of(name):
    """The unified diff from single_process.py to `name`, and its (added, removed) counts."""
    with open(os.path.join(LM, "single_process.py")) as f:
        before = f.read().splitlines(keepends=True)
    with open(os.path.join(LM, name)) as f:
        after = f.read().splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(before, after, "single_process.py", name))
    lines = diff.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return diff, added, removed


def test_the_docs_show_the_examples_diffs_and_platoon_adds_fewer_lines_than_ddp():
    with open(PAGE) as f:
        page = f.read()
    shown = re.findall(r"^```diff\n(.*?)^```", page, re.S | re.M)
    platoon, platoon_added, platoon_removed = diff_of("train.py")
    ddp, ddp_added, ddp_removed = diff_of("ddp.py")
    assert shown == [platoon, ddp]
    assert "| platoon (`train.py`) | %d | %d |" % (platoon_added, platoon_removed) in page
    assert "| DDP (`ddp.py`) | %d | %d |" % (ddp_added, ddp_removed) in page
    assert platoon_added < ddp_added and platoon_removed <= ddp_removed
    assert "optim" not in platoon  # a hand-written update stays one


def test_the_single_process_script_trains():
    proc = subprocess.run([sys.executable, os.path.join(LM, "single_process.py")] + QUICK,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^epoch 2: 12 batches in .*, lr 20,", proc.stdout, re.M), proc.stdout


def test_the_platoon_version_runs_by_itself_as_a_one_worker_job():
    pytest.importorskip("torch", reason="examples/lm needs PyTorch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATOON_")}
    proc = subprocess.run([sys.executable, os.path.join(LM, "train.py")] + QUICK,
                          capture_output=True, text=True, timeout=120,
                          env=dict(env, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^epoch 2: \d+ batches in .*, lr 20,", proc.stdout, re.M), proc.stdout
    assert proc.stderr.count("running as a one-worker job") == 1, proc.stderr


@pytest.mark.slow
def test_the_platoon_version_runs_under_the_launcher_with_its_arguments(tmp_path):
    torch = pytest.importorskip("torch", reason="examples/lm needs PyTorch")
    launcher = os.path.join(os.path.dirname(sys.executable), "platoon-launcher")
    logs = tmp_path / "logs"
    proc = subprocess.run([launcher, "-n", "2", os.path.join(LM, "train.py"), "--log-dir",
                           str(logs), "--"] + QUICK + ["--lr", "10"], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path),
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "job finished: 2 worker(s) done" in out, out
    job = re.search(r"job ([0-9a-f]{16})", out).group(1)
    assert not job_segments(job)
    for k in (0, 1):
        log = (logs / ("worker%d.log" % k)).read_text()
        assert re.search(r"^epoch 2: 12 batches in .*, lr 10,", log, re.M), log  # its args
    # The centre is the model's, and training moved it from the first worker's start.
    sys.path.insert(0, LM)
    try:
        from single_process import CharLM
    finally:
        sys.path.remove(LM)
    torch.manual_seed(0)
    start = CharLM(32, 128).state_dict()
    centre = load_centre(str(logs))
    assert list(centre) == list(start)
    assert all(not torch.equal(torch.from_numpy(centre[k]), start[k]) for k in start)
    # 2 workers x 24 steps, every 4th a sync
    assert re.search(r"job summary: .*, 12 syncs", out), out
    status = json.loads((logs / "status.json").read_text())
    for k in ("0", "1"):  # sync.step(loss=loss) reported progress: no w.report in the script
        assert status["reports"][k]["metrics"]["steps"] == 24, status
        assert status["reports"][k]["metrics"]["loss"] > 0, status
