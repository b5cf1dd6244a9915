"""platoon.integrations.accelerate: platoon's LocalSGD in an Accelerate loop (an MLP with
BatchNorm, made-up data: nothing downloaded), in real processes."""

import difflib
import json
import os
import re
import subprocess
import sys
import types

import pytest

from helpers import ROOT, Nothing, needs

pytestmark = needs("accelerate", reason="the Accelerate tests need accelerate: pip install "
                                        "-e '.[accelerate]'")



def run(out):
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow  # worker processes importing accelerate (about 2 s of CPU each)
def test_two_workers_sync_every_k_real_optimizer_steps_with_buffers_and_evaluate_once(
        serve, procs, tmp_path):
    """Two Accelerate processes under a real controller, a new `with LocalSGD` block for
    each of 2 epochs (as Accelerate's own example), gradient accumulation 2: 2 x 4 batches
    are 4 optimizer steps, and local_sgd_steps 2 gives 2 syncs each (counting step() calls,
    as Accelerate's LocalSGD, gave 4), the second block continuing the first's worker and
    sync phase; BatchNorm's statistics are synced with the parameters under the default rule
    (EASGD for two workers); the workers draw their own batches, from the seedable sampler
    accelerate's prepare() made with the script's seed (use_seedable_sampler=True) and from a
    plain shuffled loader; the final centre is evaluated once, when the scripts end; worker
    K's save_state() (automatic checkpoint naming) goes under workerK of the project
    directory they share, and worker_path("ckpt") is ckpt/workerK. Their AdamW runs at its
    full lr from the first step: each is warned once that the lr advice assumes a warm-up."""
    ctl = Nothing(control_port=0, num_workers=2)
    serving = serve(ctl, timeout=90)
    env = {"PLATOON_CONTROL_PORT": str(ctl.control_port)}
    workers = [procs("accel_worker.py", tmp_path / ("w%d.json" % k), "--epochs", 2,
                     "--batches", 4, "--accum", 2, "--every", 2, "--seedable",
                     "--project-dir", tmp_path / "project",
                     env=dict(env, PLATOON_WORKER_INDEX=str(k))) for k in range(2)]
    for w in workers:
        assert w.wait(90) == 0, w.output
    serving.join()
    for w in workers:  # AdamW at its full lr from the first step: warned once, in both blocks
        assert w.output.count("no warm-up, in a job of 2 workers") == 1, w.output
    # the launcher's minibatches are the batches trained: 2 workers x 2 epochs x 4 batches
    assert ctl.progress["minibatches"] == 16, ctl.progress
    runs = [run(tmp_path / ("w%d.json" % k)) for k in range(2)]
    for r in runs:
        assert (r["num_steps"], r["platoon_steps"], r["syncs"]) == (4, 4, 2), r
        assert len(set(r["workers"])) == len(set(r["jobs"])) == 1, r  # one worker, one job
        assert {"1.running_mean", "1.running_var"} <= set(r["shared"]), r
        assert r["rule"] == "EASGD(alpha=0.45)", r
    assert runs[0]["first_batch"] != runs[1]["first_batch"], runs
    assert runs[0]["first_plain"] != runs[1]["first_plain"], runs
    for k, r in enumerate(runs):
        own = tmp_path / "project" / ("worker%d" % k)
        assert r["project_dir"] == r["logging_dir"] == str(own), r
        assert r["worker_path"] == os.path.join("ckpt", "worker%d" % k), r
        assert (own / "checkpoints" / "checkpoint_0" / "custom_checkpoint_0.pkl").exists()
    results = [r["final_result"] for r in runs if r["final_result"] is not None]
    assert len(results) == 1, runs
    assert ctl.final_result["metrics"] == results[0]


@pytest.mark.slow  # two worker processes importing accelerate
def test_one_import_makes_a_plain_accelerate_loop_two_workers_each_saving_its_own_state(
        serve, procs, tmp_path):
    """accelerate_auto: two plain Accelerate loops (no LocalSGD, no step() of platoon's) of 8
    optimizer steps each are one job of two workers, synced right after every 4th step (2
    syncs each), each backward a batch for the launcher's count; save_state(DIR) writes
    worker K's DIR/workerK with its sync phase in platoon_state.json."""
    ctl = Nothing(control_port=0, num_workers=2)
    serving = serve(ctl, timeout=90)
    workers = [procs("accel_auto_worker.py", tmp_path / "state", 8,
                     env={"PLATOON_CONTROL_PORT": str(ctl.control_port),
                          "PLATOON_WORKER_INDEX": str(k)}) for k in range(2)]
    for w in workers:
        assert w.wait(90) == 0, w.output
    serving.join()
    assert (ctl.progress["minibatches"], ctl.progress["syncs"]) == (16, 4), ctl.progress
    for k in range(2):
        with open(tmp_path / "state" / ("worker%d" % k) / "platoon_state.json") as f:
            assert json.load(f) == {"platoon_steps": 8, "worker": "worker%d" % k}


@pytest.mark.slow  # two worker processes in turn, each importing accelerate
def test_a_step_the_scaler_skips_is_not_counted_and_a_checkpoint_keeps_the_sync_phase(
        procs, tmp_path):
    """Run alone, under DiLoCo, two `with LocalSGD` blocks of 2 batches are one worker of one
    job (not a job per block), whose sync phase runs on across them. A fused AdamW stepped
    through a GradScaler, the gradients of optimizer step 2 infinite: the scaler skips it (the
    fused optimizer is called all the same, and its post-step hook fires), so 4 batches are 3
    counted steps, and local_sgd_steps 2 syncs once (counting the calls: 4 steps, 2 syncs).
    The first block's LocalSGD registered for the accelerator's checkpoints: a fresh process
    that load_state's the run's save_state goes on at step 4 and syncs at steps 4 and 6 over
    3 more batches, as the uninterrupted run would (counting again from 0 it would sync
    once); its step() count goes on from the first block's 2."""
    ckpt = tmp_path / "ckpt"
    first = procs("accel_worker.py", tmp_path / "a.json", "--epochs", 2, "--batches", 2,
                  "--every", 2, "--scaler", "--inf-at", 2, "--rule", "diloco",
                  "--save-to", ckpt)
    assert first.wait(90) == 0, first.output
    a = run(tmp_path / "a.json")
    assert (a["num_steps"], a["platoon_steps"], a["syncs"]) == (2, 3, 1), a
    assert len(set(a["jobs"])) == 1, a
    assert a["rule"].startswith("DiLoCo(outer_lr=0.7"), a
    assert a["final_result"]["loss"] == a["final_result"]["loss"]  # finite, not NaN
    resumed = procs("accel_worker.py", tmp_path / "b.json", "--batches", 3, "--every", 2,
                    "--resume-from", ckpt)
    assert resumed.wait(90) == 0, resumed.output
    b = run(tmp_path / "b.json")
    assert (b["num_steps"], b["platoon_steps"], b["syncs"]) == (5, 6, 2), b


def test_accelerates_own_multi_process_mode_is_refused():
    """An accelerator of several processes (torchrun, accelerate launch) is refused before any
    worker is made, saying to start the script with platoon-launcher."""
    from platoon.errors import PlatoonError
    from platoon.integrations.accelerate import LocalSGD
    accelerator = types.SimpleNamespace(num_processes=2)
    with pytest.raises(PlatoonError, match="the Accelerator runs its own DDP across 2 "
                                           "processes.*platoon-launcher -n N"):
        LocalSGD(accelerator, None, 4)
    with pytest.raises(ValueError, match="local_sgd_steps must be an integer >= 1, got 0"):
        LocalSGD(types.SimpleNamespace(num_processes=1), None, 0)


def test_each_worker_of_an_elastic_job_gets_its_own_directory_and_seed():
    """Both integrations place a worker's files and offset its seed by `worker_slot`: in an
    elastic job two one-worker nodes both have global rank 0 of 1, yet get different
    directories and seeds (from their node names); a fixed world keeps workerK and K."""
    from platoon.integrations._core import worker_slot
    from platoon.placement import Placement

    def worker(rank, size, node=None):
        return types.SimpleNamespace(placement=Placement(rank, size, rank, size,
                                                         elastic_node=node))

    a, b = worker_slot(worker(0, 1, "a")), worker_slot(worker(0, 1, "b"))
    assert (a[0], b[0]) == (os.path.join("a", "worker0"), os.path.join("b", "worker0"))
    assert a[1] != b[1] and worker_slot(worker(1, 2, "a"))[1] not in (a[1], b[1])
    assert worker_slot(worker(0, 1, "a")) == a  # stable: a restarted node keeps its slot
    assert worker_slot(worker(1, 2)) == ("worker1", 1)
    assert worker_slot(worker(0, 1)) is None  # a job of one worker: as without platoon


def test_disabled_it_makes_no_worker_and_only_counts():
    """enabled=False, as Accelerate's: no worker is made (none could register: there is no
    controller), local_sgd_steps is not read (Accelerate's example passes None then),
    step() counts its calls, leaving the block does nothing more. Enabled, None is refused,
    saying to pass enabled=False."""
    from platoon.integrations.accelerate import LocalSGD
    accelerator = types.SimpleNamespace(num_processes=1)
    for steps in (2, None):
        with LocalSGD(accelerator, None, steps, enabled=False) as local_sgd:
            for _ in range(3):
                local_sgd.step()
        assert (local_sgd.num_steps, local_sgd.worker, local_sgd.sync) == (3, None, None)
        assert local_sgd.state_dict() == {"platoon_steps": 0, "num_steps": 3}
        assert local_sgd.worker_path("ckpt") == "ckpt"
        assert local_sgd.finish() is None and local_sgd.final_result is None
    with pytest.raises(ValueError, match="got None.*pass enabled=False"):
        LocalSGD(accelerator, None, None)


def test_the_module_names_the_extra_without_accelerate():
    code = ("import sys; sys.modules['accelerate'] = None\n"
            "try:\n    import platoon.integrations.accelerate\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'platoon-dp[accelerate]'" in out.stdout, out.stdout


def test_the_docs_show_the_examples_diff_and_it_adds_at_most_three_lines():
    """docs/accelerate.md shows examples/accelerate's diff (local_sgd.py, with Accelerate's own
    LocalSGD, to train.py) as it is: at most 3 lines added, at most 2 removed (changed)."""
    example = os.path.join(ROOT, "examples", "accelerate")
    files = []
    for name in ("local_sgd.py", "train.py"):
        with open(os.path.join(example, name)) as f:
            files.append(f.read().splitlines(keepends=True))
    diff = "".join(difflib.unified_diff(*files, "local_sgd.py", "train.py"))
    with open(os.path.join(ROOT, "docs", "accelerate.md")) as f:
        shown = re.findall(r"^```diff\n(.*?)^```", f.read(), re.S | re.M)
    assert diff in shown, shown  # (the upstream examples show theirs too: test_upstream.py)
    lines = diff.splitlines()[2:]
    assert sum(line.startswith("+") for line in lines) <= 3
    assert sum(line.startswith("-") for line in lines) <= 2
