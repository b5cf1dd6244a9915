"""platoon.integrations.lightning: a Lightning script as a platoon worker (an MLP with BatchNorm
and made-up data, nothing downloaded), in real processes: two Lightning processes in all, one
job (importing Lightning costs ~7.5 s of CPU in each process)."""

import difflib
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from helpers import PROCS, ROOT, Nothing, Proc, needs

pytestmark = needs("lightning", "pytorch_lightning", "jsonargparse",
                   reason="the Lightning tests need lightning and pytorch_lightning, and build "
                          "LightningCLI trainers with jsonargparse: pip install -e "
                          "'.[lightning]'")


def report(out):
    with open(out) as f:
        return json.load(f)


# What `import platoon.integrations.lightning_auto` does to the Trainers made after it, checked
# in the lightning worker's process once its jobs are done (--then-exec): a Lightning process
# fewer in the suite (importing Lightning is most of one's ~6 s of CPU).
ONE_IMPORT = """
import lightning as L
import pytorch_lightning as pl
import platoon.integrations.lightning_auto
from platoon.integrations.lightning import PlatoonStrategy
for trainer in (L.Trainer(logger=False), L.Trainer(strategy="auto", logger=False),
                pl.Trainer(logger=False)):
    assert isinstance(trainer.strategy, PlatoonStrategy), trainer.strategy
    assert type(trainer.strategy).package == trainer.__module__.split(".")[0], trainer.strategy
kept = L.Trainer(strategy=PlatoonStrategy(sync_every=8), logger=False)
assert kept.strategy.sync_every == 8
print("OK", type(L.Trainer(strategy="single_device", logger=False).strategy).__name__)
"""


@pytest.fixture(scope="module")
def lightning_job(tmp_path_factory):
    """The two Lightning workers' job below, and the second job they rejoin, under
    controllers serving in this process; then the `lightning` worker runs ONE_IMPORT:
    {"ctl": the first job's controller (closed), "workers": their Procs (exited),
    "tmp_path": their directory}. Run once for the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("lightning")
    (tmp_path / "one_import.py").write_text(ONE_IMPORT)
    ctl, again = Nothing(control_port=0, num_workers=2), Nothing(control_port=0, num_workers=2)
    errors = []

    def serve(controller, timeout):
        try:
            controller.serve(timeout_s=timeout)
        except BaseException as exc:  # raised below
            errors.append(exc)

    servings = [threading.Thread(target=serve, args=(c, t), daemon=True)
                for c, t in ((ctl, 90), (again, 120))]
    for serving in servings:
        serving.start()
    env = {"PLATOON_CONTROL_PORT": str(ctl.control_port)}
    job = ("--steps", 4, "--accum", 2, "--every", 2, "--save-at", 2, "--saves", "--rejoin",
           again.control_port)
    # each worker's index in both jobs, as the launcher gives it (its files are workerK's)
    args = [[tmp_path / "w0.json", tmp_path, *job, "--cli", "--adam", "--then-exec",
             tmp_path / "one_import.py"],
            [tmp_path / "w1.json", tmp_path, *job, "--package", "pytorch_lightning",
             "--ckpt-dir", tmp_path / "ckpts", "--refusals", "--then-alone"]]
    workers = [Proc([os.path.join(PROCS, "lightning_worker.py")] + [str(a) for a in args[k]],
                    env=dict(env, PLATOON_WORKER_INDEX=str(k))) for k in range(2)]
    try:
        for w in workers:
            assert w.wait(120) == 0, w.output
        for serving in servings:
            serving.join(30)
            assert not serving.is_alive(), "a controller still serves"
        if errors:
            raise errors[0]
    finally:
        for w in workers:
            w.kill()
        for controller in (ctl, again):
            controller.close()  # (a serve() still waiting returns first)
        for serving in servings:
            serving.join(30)
    return {"ctl": ctl, "workers": workers, "tmp_path": tmp_path}


@pytest.mark.slow  # two Lightning processes (two jobs), ~30 s on a loaded 2-core machine
def test_two_lightning_workers_count_real_steps_validate_on_the_centre_checkpoint_and_resume(
        lightning_job):
    """One job of two workers under a real controller, one on `lightning`, one on
    `pytorch_lightning`, accumulate_grad_batches 2:
    - 4 optimizer steps (8 batches) and sync_every 2 give 2 syncs each, not 4; the scheduler
      steps on real steps;
    - every validation during fit runs on the centre (the model differs from the worker's own
      weights there, and they are back after it);
    - each worker logs and checkpoints under its own workerK (also in a ModelCheckpoint's
      dirpath), with platoon's state in its checkpoint, and draws its own batches;
    - every checkpoint holds the worker's own weights, never the centre: also those that a
      ModelCheckpoint monitoring val_loss defers to the end of a validation (where val_loss
      is logged), and one saved in the middle of a validation;
    - the job's result is the final centre validated once; after fit the model holds the
      centre (trainer.validate gives that result again on the last worker); a second fit
      with the same strategy is refused;
    - then both join a second job with a fresh Trainer and fit(ckpt_path="last"): each
      resumes from its own last.ckpt (step 4, platoon's 4 steps) and goes on to 8 in 2 syncs;
    - the worker with AdamW and no warm-up (a StepLR from the full lr) is warned once, in
      the first job (the second resumes below the peak lr), that the lr advice assumes a
      warm-up; the one with SGD is not.
    Before the job, the lightning worker builds LightningCLI trainers whose strategy is chosen
    by `--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy` (with
    its init_args), by a config file (a DiLoCo rule given by its class_path too) and, once
    that imported the module, by `--trainer.strategy=platoon`: no subclass of LightningCLI,
    no import of platoon in the script. The pytorch_lightning worker asks for Lightning's DDP
    (Trainer(devices=2), then torchrun's WORLD_SIZE=2): PlatoonError, before any worker is
    made. After it, alone:
    - a GradScaler in Lightning's mixed-precision plugin skips step 2 (infinite gradients): 4
      Trainer steps are 3 counted steps; the checkpoint at step 3 holds 2;
    - a fresh Trainer resumed from it (fit(ckpt_path=...)) goes on from 2: 3 more real steps
      make 5 (counting again from 0 it would say 3), and its scheduler resumes;
    - with two optimizers (manual optimization) the first one's steps are counted;
    - counting an optimizer past configure_optimizers' list is refused, and the worker made
      for that fit leaves its job."""
    ctl, workers, tmp_path = (lightning_job[k] for k in ("ctl", "workers", "tmp_path"))
    # the AdamW worker's schedule has no warm-up: told so once (the resumed job starts below
    # the peak lr: a resume is no start); the SGD worker not
    assert workers[0].output.count("no warm-up, in a job of 2 workers") == 1, workers[0].output
    assert "no warm-up" not in workers[1].output, workers[1].output
    # the launcher's minibatches are the batches trained: 2 workers x 4 steps x 2 batches
    assert ctl.progress["minibatches"] == 16, ctl.progress
    reports = [report(tmp_path / ("w%d.json" % k)) for k in range(2)]
    runs = [r["runs"][0] for r in reports]
    for r in runs:
        assert (r["global_step"], r["platoon_steps"], r["syncs"]) == (4, 4, 2), r
        assert len(r["on_centre"]) >= 8 and all(r["on_centre"][:8]), r  # 4 validations x 2
        assert r["own_back"] and all(r["own_back"]), r
        assert r["checkpoint_platoon"] == {"platoon_steps": 2}, r
        assert r["lr"] == pytest.approx(0.05 * 0.5 ** 2), r
        assert "PlatoonError: a PlatoonStrategy serves one trainer.fit()" in r["refit"], r
    every_run = runs + [report["runs"][1] for report in reports]
    for r in every_run:
        assert all(own for _, own in r["saves"]), r["saves"]  # never the centre
        assert sum(during for during, _ in r["saves"]) >= 1, r["saves"]  # mid-way
    # and saves deferred to a validation's end (not in every run: seen once in a loaded suite)
    assert sum(during for r in every_run for during, _ in r["saves"]) > len(every_run), \
        [r["saves"] for r in every_run]
    dirs = sorted(os.path.relpath(r["log_dir"], tmp_path) for r in runs)
    assert dirs == [os.path.join("lightning_logs", "worker0"),
                    os.path.join("lightning_logs", "worker1")]
    # the default checkpoint directory is under the worker's log directory; a ModelCheckpoint
    # dirpath given (worker w1's) is split by worker
    slots = [os.path.basename(r["log_dir"]) for r in runs]
    assert os.path.dirname(runs[0]["checkpoint"]) == os.path.join(runs[0]["log_dir"],
                                                                  "checkpoints")
    assert os.path.dirname(runs[1]["checkpoint"]) == str(tmp_path / "ckpts" / slots[1])
    assert runs[0]["first_batch"] != runs[1]["first_batch"], runs
    results = [r for r in runs if r["final_result"] is not None]
    assert len(results) == 1, runs
    last = results[0]
    assert ctl.final_result["metrics"] == last["final_result"]
    assert last["validated"] == [last["final_result"]]
    assert all(r["unchanged_by_validate"] for r in runs)
    # after fit, in a job of several workers: validate(ckpt_path=PATH) runs on that checkpoint
    # (one worker's weights), "last" on the fit's model, the centre; each says which
    for k, r in enumerate(runs):
        assert r["on_fits"] == r["validated"] != r["on_own"], r
        assert r["fits_model_back"], r
        assert re.search(r"platoon worker%d: this validate runs on checkpoint \S+last.ckpt, "
                         r"one worker's weights" % k, workers[k].output), workers[k].output
        assert ("platoon worker%d: this validate runs on %s, not on this worker's own "
                "checkpoint (ckpt_path='last' after fit)"
                % (k, "the job's final centre" if r["final_result"] is not None
                   else "the centre as it was when this worker finished (the job's final "
                   "centre is on the worker that evaluated it)")) \
            in workers[k].output, workers[k].output
    for first, rejoined in (r["runs"] for r in reports):
        assert rejoined["resumed_from"] == os.path.join(os.path.dirname(first["checkpoint"]),
                                                        "last.ckpt"), rejoined
        assert (rejoined["global_step"], rejoined["platoon_steps"], rejoined["syncs"]) == \
            (8, 8, 2), rejoined
        assert rejoined["log_dir"] == first["log_dir"], rejoined

    cli = reports[0]["cli"]
    assert not cli["imported_before"], cli
    assert [s["type"] for s in cli["strategies"]] == \
        ["platoon.integrations.lightning.PlatoonStrategy"] * 3, cli
    assert [s["sync_every"] for s in cli["strategies"]] == [3, 5, 4], cli
    assert cli["strategies"][1]["rule"].startswith("DiLoCo(outer_lr=0.5,"), cli
    devices, torchrun = reports[1]["refusals"]
    assert "Trainer(devices=2, num_nodes=1) asks for Lightning's DDP across 2" in devices
    assert "platoon-launcher -n N" in devices
    assert "Lightning runs its own DDP across 2 processes" in torchrun
    assert "WORLD_SIZE=2" in torchrun
    first, resumed, manual = reports[1]["alone"]
    assert (first["global_step"], first["platoon_steps"], first["syncs"]) == (4, 3, 1), first
    assert first["checkpoint_platoon"] == {"platoon_steps": 2}, first
    assert (resumed["global_step"], resumed["platoon_steps"]) == (6, 5), resumed
    assert resumed["lr"] == pytest.approx(0.05 * 0.5 ** 3), resumed
    assert (manual["global_step"], manual["platoon_steps"], manual["syncs"]) == (4, 2, 2), manual
    for run in reports[1]["alone"]:
        assert run["validated"] == [run["final_result"]], run
    past = reports[1]["counted_past_the_list"]
    assert past["error"].startswith("ValueError: PlatoonStrategy(counted_optimizer=1): "
                                    "configure_optimizers gave 1 optimizer(s)"), past
    assert past["worker_closed"], past  # the worker made for the failed fit left its job


def test_the_strategy_serves_the_package_the_script_imported(monkeypatch):
    """A script that imported pytorch_lightning (and not lightning) gets its strategy;
    package= says which; a name that is not Lightning's, or a package not installed, is
    refused. (Nothing here imports Lightning itself.)"""
    from platoon.integrations.lightning import users_package
    monkeypatch.delitem(sys.modules, "lightning", raising=False)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", object())
    assert users_package() == "pytorch_lightning"
    assert users_package("lightning") == "lightning"
    with pytest.raises(ValueError, match="package must be lightning or pytorch_lightning"):
        users_package("torch")
    monkeypatch.setitem(sys.modules, "lightning", None)  # blocked: as if not installed
    with pytest.raises(ImportError, match="lightning is not installed"):
        users_package("lightning")


def test_each_worker_logs_under_its_own_version():
    """No version given: workerK; a version given (or chosen by Lightning before fit):
    workerK under it."""
    from platoon.integrations.lightning import worker_version
    assert worker_version(None, "worker1") == "worker1"
    assert worker_version("exp", "worker1") == os.path.join("exp", "worker1")
    assert worker_version(3, os.path.join("node", "worker0")) == os.path.join(
        "version_3", "node", "worker0")


def test_the_module_names_the_extra_without_lightning():
    """Without lightning and pytorch_lightning, importing the module says which extra to
    install."""
    code = ("import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None\n"
            "try:\n    import platoon.integrations.lightning\n"
            "except ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'platoon-dp[lightning]'" in out.stdout, out.stdout


def test_the_docs_show_the_examples_diff_and_it_adds_one_line():
    """docs/lightning.md shows examples/lightning's diff (single_process.py to train.py) as it
    is: one added line, ``import platoon.integrations.lightning_auto``, none removed (it took
    the strategy, its import and a blank line)."""
    example = os.path.join(ROOT, "examples", "lightning")
    files = []
    for name in ("single_process.py", "train.py"):
        with open(os.path.join(example, name)) as f:
            files.append(f.read().splitlines(keepends=True))
    diff = "".join(difflib.unified_diff(*files, "single_process.py", "train.py"))
    with open(os.path.join(ROOT, "docs", "lightning.md")) as f:
        shown = re.findall(r"^```diff\n(.*?)^```", f.read(), re.S | re.M)
    assert shown[0] == diff
    lines = diff.splitlines()[2:]
    added = [line for line in lines if line.startswith("+")]
    assert not any(line.startswith("-") for line in lines)
    assert len(added) == 1 and "import platoon.integrations.lightning_auto" in added[0], diff

@pytest.mark.slow  # in the `lightning_job` fixture's Lightning process
def test_one_import_gives_every_trainer_the_strategy_unless_it_has_one(lightning_job):
    """``import platoon.integrations.lightning_auto``: a Trainer given no strategy (or "auto")
    gets PlatoonStrategy, of the package it comes from; one given a strategy keeps it. In a
    process of its own as far as the patch goes (the import patches the Trainer for the
    process): the `lightning` worker's, once its jobs are done (ONE_IMPORT)."""
    output = lightning_job["workers"][0].output  # (ONE_IMPORT's traceback, if it failed)
    assert "OK SingleDeviceStrategy" in output and "EXEC DONE" in output, output
