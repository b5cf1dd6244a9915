"""benchmarks.transformer: the harness runs platoon (EASGD, AdamW, the transformer's schedule)
and one process end to end, and renders its table."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow  # about 10 s: torch's import, then two short runs in forked processes
@pytest.mark.timeout(300)
def test_the_transformer_benchmark_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "benchmarks.transformer", "--methods",
           "single,platoon_easgd", "--reps", "1", "--straggler-reps", "0",
           "--cap-s", "0.2", "--eval-every", "5", "--target", "1.0",
           "--out", str(tmp_path)]  # the harness, not the target: runs of some 5-15 steps
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "transformer.json").read_text())
    runs = {r["method"]: r for r in report["measured"]["runs"]}
    assert set(runs) == {"single", "platoon_easgd"}
    for run in runs.values():
        assert "error" not in run, run["error"]
        assert run["trace"] and run["steps"] > 0
    assert "| platoon_easgd |" in (tmp_path / "transformer.md").read_text()


def test_the_summary_takes_a_member_without_platoons_lock_figures():
    """torchft's DiLoCo reports its outer steps, not platoon's lock waits (the report step
    once failed on it, after every run had finished)."""
    from benchmarks.time_to_accuracy.tuning import summarise
    ranks = [{"setup_s": 1.0, "steps": 2500, "clock_s": 80.0, "outer_steps": 50}]
    runs = [{"method": "torchft_diloco", "phase": "measure", "reached": [80.0, 2500],
             "ranks": ranks},
            {"method": "platoon_easgd", "phase": "measure", "reached": [50.0, 1500],
             "ranks": [dict(ranks[0], syncs=375, lock_wait_s=0.75, lock_hold_s=1.5)]}]
    out = summarise(runs, {"torchft_diloco": None, "platoon_easgd": None})
    assert out["torchft_diloco"]["measure"]["time_s"] == 80.0
    assert out["torchft_diloco"]["measure"]["lock_wait_ms_per_sync"] is None
    assert out["platoon_easgd"]["measure"]["lock_wait_ms_per_sync"] == 2.0
