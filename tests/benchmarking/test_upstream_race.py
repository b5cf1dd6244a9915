"""The upstream race's harness (benchmarks/upstream_race) without running a job: the commands
it gives each side, the job's eval loss from its workers' evaluations, and the report from a
record."""

import json
import os
import subprocess
import sys

from benchmarks.upstream_race.__main__ import (
    PROBE,
    UPSTREAM,
    command,
    crossing,
    job_loss,
    markdown,
    shown,
)

from helpers import ROOT


def test_each_side_is_the_frameworks_own_ddp_or_the_platoon_port_under_the_launcher():
    """DDP: the original script under torchrun (or Lightning's own flags); platoon: the port
    under the launcher with the same arguments; single: the original script alone."""
    ddp, env = command("transformers", "ddp", 2e-3, 3)
    assert ddp[1:3] == ["-m", "torch.distributed.run"] and PROBE in ddp
    assert env["UPSTREAM_RACE_SCRIPT"] == os.path.join(UPSTREAM, "transformers", "run_clm.py")
    assert ddp[ddp.index("--learning_rate") + 1] == "0.002" and ddp[-1] == "3"
    ours, env = command("transformers", "platoon", 2e-3, 3)
    assert ours[1:6] == ["-m", "platoon.launch.cli", "-n", "2", "--log-dir"]
    assert env["UPSTREAM_RACE_SCRIPT"].endswith("run_clm_platoon.py")
    assert ours[ours.index("--") + 1:] == ddp[ddp.index(PROBE) + 1:]  # the same arguments
    lightning_ddp, env = command("lightning", "ddp", 1e-2, 1)
    lightning_ours, env2 = command("lightning", "platoon", 1e-2, 1)
    assert env == env2 and env["UPSTREAM_RACE_SCRIPT"].endswith("autoencoder.py")
    assert "--trainer.strategy=ddp" in lightning_ddp and not any(
        "platoon" in a for a in lightning_ddp)
    assert ("--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy"
            in lightning_ours)
    accelerate_ddp, env = command("accelerate", "ddp", 2e-3, 2)
    assert accelerate_ddp[1:3] == ["-m", "torch.distributed.run"]  # launch --cpu: 1 process
    assert env["UPSTREAM_RACE_SCRIPT"].endswith("local_sgd.py") and env["UPSTREAM_RACE_SEED"] \
        == "2"
    single, env = command("transformers", "single", 2e-3, 3)
    assert single[1:] == ddp[ddp.index(PROBE):] and env["UPSTREAM_RACE_SCRIPT"].endswith(
        os.path.join("transformers", "run_clm.py"))
    text = shown(ddp, env)
    assert ROOT not in text and text.startswith("PYTHONPATH=$REPO ")


def test_the_jobs_loss_is_its_one_model_or_the_mean_of_its_workers_at_a_step_both_reached():
    assert job_loss({"rank0": {25: 4.0, 50: 3.0}}, 1) == {25: 4.0, 50: 3.0}
    assert job_loss({"worker0": {25: 4.0, 50: 3.0}}, 2) == {}  # worker1 not heard yet
    assert job_loss({"worker0": {25: 4.0, 50: 3.0}, "worker1": {25: 3.0}}, 2) == {25: 3.5}


def record():
    run = {"framework": "transformers", "lr": 2e-3, "target": 3.45, "load_before": 1.0,
           "load_after": 1.5, "command": "python probe.py"}
    return [dict(run, method="ddp", seed=1, reached=[50.0, 250], trace=[[200, 3.65],
                                                                         [250, 3.4]]),
            dict(run, method="platoon", seed=1, reached=[40.0, 300], trace=[[300, 3.45]]),
            dict(run, method="platoon", seed=2, reached=None, trace=[[600, 3.5]])]


def test_the_report_gives_medians_ratios_and_every_runs_load(tmp_path):
    """From a record: per side the seeds that reached the target, median steps (and the
    crossing interpolated between evaluations) and seconds, platoon's ratios to DDP; each run
    with its load; each side's command once. `--report` prints it from the json."""
    runs = record()
    assert abs(crossing(runs[0]) - 240) < 1e-9  # 200 + 50 x (3.65 - 3.45) / (3.65 - 3.4)
    text = markdown(runs)
    assert "| transformers | ddp | 0.002 | 1/1 | 250 (240) | 50.0 s |  |  |" in text
    assert "| transformers | platoon | 0.002 | 1/2 | 300 (300) | 40.0 s | 1.20x | 0.80x |" in text
    assert "| transformers | platoon | 0.002 | 2 | 3.45 | not reached | - | 1.0 -> 1.5 | " \
        "3.5 at 600 |" in text
    assert text.count("`python probe.py`") == 2
    path = tmp_path / "race.json"
    path.write_text(json.dumps({"meta": {}, "runs": runs}))
    out = subprocess.run([sys.executable, "-m", "benchmarks.upstream_race", "--report",
                          "--out", str(path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0 and out.stdout.strip() == text, out.stderr
