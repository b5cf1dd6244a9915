"""platoon.integrations.huggingface: a Hugging Face Trainer script as a platoon worker, with a
tiny GPT-2 built from a config and made-up text (nothing downloaded), in real processes."""

import difflib
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from helpers import PROCS, ROOT, Nothing, Proc, needs

pytestmark = needs("transformers", reason="the Trainer tests need transformers: pip install "
                                          "-e '.[huggingface]'")


def run(out):
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow  # a Trainer process: importing transformers takes ~4 s of CPU
def test_two_trainer_workers_sync_every_k_real_optimizer_steps_and_evaluate_the_centre_once(
        serve, procs, tmp_path):
    """Two Trainer processes under a real controller, with gradient accumulation 2: 4 optimizer
    steps (8 micro-batches) and sync_every 2 give 2 syncs each, not 4; the job's result is the
    final centre evaluated once by trainer.evaluate() (the last worker's second evaluation,
    the script's own its first); each worker checkpoints in its own directory and draws its
    own batches. Then both join a second job with a fresh Trainer, resumed as a script that
    knows nothing of platoon says it, each finding its own checkpoint: one with
    resume_from_checkpoint=OUT/checkpoint-2 in its TrainingArguments, passed on to train() (as
    transformers' run_clm.py does), resumes from OUT/workerK/checkpoint-2; the other with
    train(resume_from_checkpoint="last") from its last, workerK/checkpoint-4. The Trainer's
    AdamW runs without a warm-up: each worker is warned so once, in the first job (the
    second resumes below the peak lr)."""
    ctl, again = Nothing(control_port=0, num_workers=2), Nothing(control_port=0, num_workers=2)
    servings = [serve(ctl, timeout=90), serve(again, timeout=120)]
    env = {"PLATOON_CONTROL_PORT": str(ctl.control_port)}
    # each worker's index in both jobs, as the launcher gives it (its files are workerK's)
    workers = [procs("hf_worker.py", tmp_path / ("w%d.json" % k), tmp_path / "out", "--steps", 4,
                     "--accum", 2, "--every", 2, "--save-steps", 2, "--rejoin",
                     again.control_port, 6, resume, env=dict(env, PLATOON_WORKER_INDEX=str(k)))
               for k, resume in enumerate(("checkpoint-2", "last"))]
    for w in workers:
        assert w.wait(90) == 0, w.output
    for serving in servings:
        serving.join()
    for w in workers:  # the Trainer's AdamW, no warm-up: each told once (the resumed job
        # starts below the peak lr: a resume is no start)
        assert w.output.count("no warm-up, in a job of 2 workers") == 1, w.output
    # the launcher's minibatches are the batches trained: 2 workers x 4 steps x 2 batches
    assert ctl.progress["minibatches"] == 16, ctl.progress
    runs = [run(tmp_path / ("w%d.json" % k))[0] for k in range(2)]
    for r in runs:
        assert (r["global_step"], r["platoon_steps"], r["syncs"]) == (4, 4, 2), r
    assert [r["output_dir"] for r in runs] == [str(tmp_path / "out" / "worker0"),
                                               str(tmp_path / "out" / "worker1")]
    assert runs[0]["first_batch"] != runs[1]["first_batch"], runs
    results = [r["final_result"] for r in runs if r["final_result"] is not None]
    assert len(results) == 1, runs
    assert ctl.final_result["metrics"] == results[0]
    assert results[0]["eval_loss"] < 4.1  # trained: ln(64) = 4.16 at the start
    assert sorted(r["evaluations"] for r in runs) == [1, 2], runs
    by_path, by_last = (run(tmp_path / ("w%d.json" % k))[1] for k in range(2))
    assert (by_path["first_step"], by_path["global_step"], by_path["platoon_steps"],
            by_path["syncs"]) == (2, 6, 6, 2), by_path
    assert (by_last["first_step"], by_last["global_step"], by_last["platoon_steps"],
            by_last["syncs"]) == (4, 6, 6, 1), by_last
    assert [by_path["output_dir"], by_last["output_dir"]] == [r["output_dir"] for r in runs]


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """One Trainer process run alone (no controller: one-worker jobs) for the three tests
    below, a transformers import each fewer: a run that saves a checkpoint at step 3 of 6
    (sync_every 2) and stops there, a fresh Trainer resumed from it to step 6, one
    uninterrupted run of 6 steps; then one of 4 steps with the GradScaler skipping step 2
    (sync_every 1), in its own output directory; and own_output_dir's answers. {"runs": the
    four runs' reports, "out": the output directory, "cases": own_output_dir's}."""
    tmp_path = tmp_path_factory.mktemp("alone")
    proc = Proc([os.path.join(PROCS, "hf_worker.py")] + [str(a) for a in (
        tmp_path / "runs.json", tmp_path / "out", "--steps", 6, "--stop-at", 3,
        "--save-steps", 3, "--every", 2, "--then-resume", 6, "--uninterrupted",
        "--then-scaler", 4, 2, "--own-output-dir", tmp_path / "cases.json")])
    try:
        assert proc.wait(120) == 0, proc.output
    finally:
        proc.kill()
    return {"runs": run(tmp_path / "runs.json"), "out": tmp_path / "out",
            "cases": run(tmp_path / "cases.json")}


@pytest.mark.slow  # a Trainer process: importing transformers takes ~4 s of CPU
def test_resume_from_checkpoint_continues_platoons_sync_phase(alone):
    """A script run alone saves a checkpoint at step 3 of 6 and stops there (sync_every 2:
    synced at step 2); a fresh Trainer resumed from it goes on at step 3: it syncs at steps 4
    and 6, as the uninterrupted run would (counting again from 0 it would sync at 2 only, by
    its step 6), and its training loss at steps 4-6 is the uninterrupted run's. Alone, the
    Trainer evaluates once, the script's own evaluate(): a job of one worker has no centre
    to evaluate apart from its model."""
    first, resumed, whole = alone["runs"][:3]
    assert (first["platoon_steps"], first["syncs"]) == (3, 1), first
    with open(alone["out"] / "checkpoint-3" / "trainer_state.json") as f:
        assert json.load(f)["stateful_callbacks"]["platoon"] == {"platoon_steps": 3}
    assert (resumed["global_step"], resumed["platoon_steps"], resumed["syncs"]) == (6, 6, 2), \
        resumed
    assert resumed["eval_loss"] < 4.1 and resumed["final_result"] is None
    assert [r["evaluations"] for r in (first, resumed, whole)] == [1, 1, 1]
    assert resumed["losses"][:3] == first["losses"]  # the checkpoint's history, then its own
    assert [step for step, _ in resumed["losses"]] == [1, 2, 3, 4, 5, 6]
    assert whole["global_step"] == 6 and len({loss for _, loss in whole["losses"]}) == 6
    assert [loss for _, loss in resumed["losses"]] == pytest.approx(
        [loss for _, loss in whole["losses"]], abs=1e-6), (resumed, whole)


@pytest.mark.slow  # a Trainer process: importing transformers takes ~4 s of CPU
def test_a_step_the_grad_scaler_skips_is_not_counted(alone):
    """accelerate's mixed-precision path with torch's GradScaler; the gradients of step 2 are
    infinite, so the scaler skips it: 4 Trainer steps are 3 optimizer steps and 3 syncs
    (sync_every 1). The Trainer's fused AdamW is called even then (it skips the update
    itself, told by the scaler's found_inf), and its post-step hook fires: counting those
    calls gave 4."""
    result = alone["runs"][3]
    assert (result["global_step"], result["platoon_steps"], result["syncs"]) == (4, 3, 3), result
    assert result["eval_loss"] < 4.1  # the infinite step was not applied


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The other rank of a torchrun-style job: it joins the Trainer's process group, and leaves.
OTHER_RANK = ("import torch.distributed as dist; dist.init_process_group('gloo'); "
              "dist.destroy_process_group()")


@pytest.mark.slow  # a Trainer process: importing transformers takes ~4 s of CPU
def test_the_trainers_own_ddp_is_refused(procs, tmp_path):
    """A Trainer process started as torchrun starts rank 0 of two: the Trainer's DDP is on, and
    the callback refuses it, saying to start the script with platoon-launcher; no worker
    registers (none is made)."""
    ddp = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    trainer = procs("hf_worker.py", tmp_path / "x.json", tmp_path / "out",
                    env=dict(ddp, RANK="0", LOCAL_RANK="0"))
    other = Proc(["-c", OTHER_RANK], env=dict(ddp, RANK="1", LOCAL_RANK="1"))
    try:
        assert trainer.wait(90) != 0, trainer.output
        assert other.wait(30) == 0, other.output
    finally:
        other.kill()
    assert "the Trainer runs its own DDP across 2 processes" in trainer.output, trainer.output
    assert "platoon-launcher -n N" in trainer.output
    assert "one-worker job" not in trainer.output  # no Worker was made
    assert not os.path.exists(tmp_path / "x.json")


def test_the_package_imports_without_any_framework():
    """platoon.integrations imports no framework; its huggingface module names the extra."""
    code = ("import sys; sys.modules['transformers'] = None; import platoon.integrations; "
            "assert 'torch' not in sys.modules\n"
            "try:\n    import platoon.integrations.huggingface\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'platoon-dp[huggingface]'" in out.stdout, out.stdout



def test_the_docs_show_the_examples_diff_and_it_adds_at_most_three_lines():
    """docs/huggingface.md shows examples/huggingface's diff (single_process.py to train.py) as
    it is, and the Trainer script becomes a platoon worker in at most 3 added lines, 0 removed."""
    example = os.path.join(ROOT, "examples", "huggingface")
    files = []
    for name in ("single_process.py", "train.py"):
        with open(os.path.join(example, name)) as f:
            files.append(f.read().splitlines(keepends=True))
    diff = "".join(difflib.unified_diff(*files, "single_process.py", "train.py"))
    with open(os.path.join(ROOT, "docs", "huggingface.md")) as f:
        shown = re.findall(r"^```diff\n(.*?)^```", f.read(), re.S | re.M)
    assert diff in shown, shown  # (the upstream examples show theirs too: test_upstream.py)
    lines = diff.splitlines()[2:]
    assert sum(line.startswith("+") for line in lines) <= 3
    assert not any(line.startswith("-") for line in lines)


@pytest.mark.slow  # in the `alone` fixture's Trainer process
def test_a_workers_output_dir_is_given_once_and_kept_through_a_replace(alone):
    """own_output_dir makes TrainingArguments' output_dir the worker's own once (arguments
    already made so, by huggingface_auto as they were made, are left as they are, and the
    script's directory is still known); a job of one worker keeps its output_dir. (Called in
    the `alone` fixture's Trainer process: importing transformers here cost ~4 s of CPU.)"""
    worker1 = os.path.join("out", "worker1")
    assert alone["cases"] == [
        ["out", worker1],  # made the second worker's own
        ["out", worker1],  # once: not out/worker1/worker1
        ["elsewhere", os.path.join("elsewhere", "worker1")],  # the script's replace
        ["out", "out"],  # a job of one worker
    ], alone["cases"]
