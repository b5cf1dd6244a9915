"""benchmarks.time_to_accuracy: its smallest configuration runs end to end, and the committed
results render to the committed pages (so neither the command nor the docs can rot)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, needs

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def test_committed_results_render_to_the_committed_pages():
    from benchmarks import time_to_accuracy as tta
    with open(os.path.join(RESULTS, "time_to_accuracy.json")) as f:
        report = json.load(f)
    with open(os.path.join(RESULTS, "time_to_accuracy.md")) as f:
        assert f.read() == tta.markdown(report)
    with open(tta.DOC) as f:
        assert f.read() == tta.doc(report), \
            "docs/time-to-accuracy.md is stale: python -m benchmarks.time_to_accuracy --render"
    assert not report["meta"]["quick"]
    names = {r["dataset"]["name"] for r in report["datasets"]}
    assert names == {"digits", "mnist1d"}
    for result in report["datasets"]:  # every method was measured, tuned over its grid
        assert set(result["summary"]) == set(tta.methods())
        assert result["tuned"] and all(len(g) == 3 for g in result["grids"].values())


@pytest.mark.slow  # several seconds: torch's import, then two short runs in forked processes
@needs("torch", "sklearn", reason="the benchmark needs torch and scikit-learn (its digits)")
def test_smallest_configuration_runs_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "benchmarks.time_to_accuracy", "--quick", "--datasets",
           "digits", "--methods", "single,platoon_downpour_nesterov", "--straggler-reps", "0",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "time_to_accuracy_quick.json") as f:
        report = json.load(f)
    (result,) = report["datasets"]
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == {"single", "platoon_downpour_nesterov"}
    for run in runs.values():
        assert "error" not in run, run["error"]
        assert run["trace"] and run["steps"] > 0
    platoon = runs["platoon_downpour_nesterov"]
    assert len(platoon["ranks"]) == 2
    assert all(rank["syncs"] >= rank["steps"] // 4 > 0 for rank in platoon["ranks"])
    assert "| single |" in (tmp_path / "time_to_accuracy_quick.md").read_text()


def test_the_sync_threads_benchmark_runs_and_prints_its_table():
    """benchmarks.bench_sync_threads at its smallest (the figures are not checked: only a
    quiet machine gives meaningful ones)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_sync_threads", "--sizes",
                           "3e6", "--rounds", "1", "--threads", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| 3e+06")]
    assert row.count("x") >= 5 and "nan" not in row


def test_the_gpu_sync_benchmark_says_when_there_is_no_gpu():
    """benchmarks.bench_gpu_sync (run by tests/gpu/device_run.sh bench) exits 0 saying why
    where there is no CUDA GPU, instead of failing; on a GPU machine it measures."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_gpu_sync", "--sizes", "1e6",
                           "--reps", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to measure" in done.stdout
