"""The frameworks' own example scripts (examples/upstream: transformers' run_clm.py,
accelerate's by_feature/local_sgd.py, Lightning's basics/autoencoder.py, adapted to run
offline) as platoon workers with the one line the docs show (none for LightningCLI: a
flag): each under platoon-launcher -n 2 and alone, with gradient accumulation 2 and bf16
on the CPU, and run_clm.py resumed from a checkpoint. Real processes, tiny models, local
text and made-up data."""

import difflib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT, launcher_cmd, long_run, needs, run_launcher

UPSTREAM = os.path.join(ROOT, "examples", "upstream")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
SUMMARY = r"platoon-launcher: job summary: wall time [\d.]+ s, (\d+) minibatches, (\d+) syncs"


def alone(script, args, cwd, timeout=120):
    """(exit code, output) of `script` run alone (no launcher): a one-worker job."""
    proc = subprocess.run([sys.executable, os.path.join(UPSTREAM, script)] + list(args),
                          capture_output=True, text=True, timeout=timeout, cwd=str(cwd),
                          env=ENV)
    return proc.returncode, proc.stdout + proc.stderr


def launched(script, args, tmp_path):
    return run_launcher(launcher_cmd(os.path.join(UPSTREAM, script), "-n", "2"), tmp_path,
                        env={"PYTHONPATH": ENV["PYTHONPATH"]}, timeout=150,
                        script_args=[str(a) for a in args])


def state(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow  # three Trainer processes, each importing transformers (~4 s of CPU)
@needs("transformers", reason="run_clm.py needs transformers: pip install -e '.[huggingface]'")
def test_run_clm_alone_then_two_workers_resumed_from_its_checkpoint(text_and_tokenizer,
                                                                   tmp_path):
    """transformers' run_clm.py plus `import platoon.integrations.huggingface_auto`: alone
    (bf16, accumulation 2) to step 4, a checkpoint there and one evaluation; then two workers
    under the launcher resumed from that checkpoint (--resume_from_checkpoint, the path as
    the script passes it on, taken as it is since the workers have none of their own) go on
    to step 8 (one sync each at platoon's step 8), 2 x 4 steps x 2 batches = 16 minibatches;
    each worker's checkpoints under its own workerK, its metrics tables headed as its own;
    one final result, the final centre's."""
    text_and_tokenizer(tmp_path)
    common = ["--model_type", "gpt2", "--config_overrides",
              "vocab_size=500,n_embd=32,n_layer=1,n_head=2,n_positions=64",
              "--tokenizer_name", "tok", "--train_file", "train.txt", "--validation_file",
              "valid.txt", "--block_size", "32", "--do_train", "--do_eval",
              "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
              "--bf16", "--use_cpu", "--report_to", "none", "--max_eval_samples", "16",
              "--disable_tqdm", "true"]
    code, out = alone("transformers/run_clm_platoon.py", common + [
        "--output_dir", "out", "--max_steps", "4", "--save_steps", "4"], tmp_path)
    assert code == 0, out
    assert "***** eval metrics *****" in out and "platoon worker" not in out, out
    assert state(tmp_path / "out" / "checkpoint-4" / "trainer_state.json")[
        "stateful_callbacks"]["platoon"] == {"platoon_steps": 4}
    code, out = launched("transformers/run_clm_platoon.py", common + [
        "--output_dir", "both", "--max_steps", "8", "--save_steps", "8",
        "--resume_from_checkpoint", "out/checkpoint-4"], tmp_path)
    assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("16", "2"), out
    assert re.search(r"final result \(the final centre, evaluated once by worker \d\): .*"
                     r"eval_loss", out), out
    for k in range(2):
        saved = state(tmp_path / "both" / ("worker%d" % k) / "checkpoint-8" /
                      "trainer_state.json")
        assert saved["global_step"] == 8 and \
            saved["stateful_callbacks"]["platoon"] == {"platoon_steps": 8}, saved
        for split in ("train", "eval"):
            assert ("[worker%d] platoon worker%d: the %s metrics below are this worker's own"
                    % (k, k, split)) in out, out


@pytest.mark.slow  # three Accelerate processes, each importing transformers
@needs("accelerate", reason="local_sgd.py needs accelerate: pip install -e '.[accelerate]'")
def test_accelerates_local_sgd_example_alone_and_as_two_workers(tmp_path):
    """accelerate's by_feature/local_sgd.py with platoon's LocalSGD imported instead of
    Accelerate's (its one changed line): a new `with LocalSGD` block per epoch, bf16,
    accumulation 2, local_sgd_steps 2. Alone it trains both epochs; under the launcher the
    two workers are one job from the first block to the scripts' end: 2 workers x 2 epochs x
    8 batches = 32 minibatches, 8 optimizer steps each, a sync every 2: 8 syncs. (The script
    saves no checkpoint: there is nothing to resume.)"""
    args = ["--cpu", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2",
            "--local_sgd_steps", "2"]
    code, out = alone("accelerate/local_sgd_platoon.py", args, tmp_path)
    assert code == 0, out
    assert "epoch 1: {'accuracy'" in out, out
    code, out = launched("accelerate/local_sgd_platoon.py", args, tmp_path)
    assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("32", "8"), out
    for k in range(2):
        assert "[worker%d] epoch 1: {'accuracy'" % k in out, out


@pytest.mark.slow  # three Lightning processes (importing Lightning: ~7.5 s of CPU each)
@needs("lightning", "jsonargparse", reason="autoencoder.py needs lightning and jsonargparse: "
                                           "pip install -e '.[lightning]'")
def test_lightnings_autoencoder_example_with_the_strategy_chosen_by_a_flag(tmp_path):
    """Lightning's basics/autoencoder.py, unchanged, with
    --trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy, bf16-mixed
    and accumulate_grad_batches 2: under the launcher two workers, 2 x 8 batches = 16
    minibatches, 4 steps each (one sync each, every 4), logs and checkpoints under their own
    workerK; the script's test(ckpt_path="best") and predict(ckpt_path="best") after fit run on
    the centre, not on the worker's own checkpoint, and each worker says so; one final
    result. Alone, with the same flag, it trains, tests and predicts as a one-worker job, on
    its best checkpoint as Lightning does."""
    args = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=8",
            "--trainer.accumulate_grad_batches=2", "--trainer.precision=bf16-mixed",
            "--trainer.enable_progress_bar=false",
            "--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy"]
    (tmp_path / "alone").mkdir()
    code, out = alone("lightning/autoencoder.py", args, tmp_path / "alone")
    assert code == 0, out
    assert "test_loss" in out and "platoon worker" not in out, out
    assert os.listdir(tmp_path / "alone" / "lightning_logs" / "version_0" / "checkpoints")
    code, out = launched("lightning/autoencoder.py", args, tmp_path)
    assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("16", "2"), out
    assert re.search(r"final result \(the final centre, evaluated once by worker \d\): val_loss",
                     out), out
    for k in range(2):
        assert (tmp_path / "lightning_logs" / ("worker%d" % k) / "config.yaml").exists()
        for what in ("test", "predict"):
            assert re.search(r"\[worker%d\] platoon worker%d: this %s runs on the (job's final "
                             r"centre|centre as it was when this worker finished).*"
                             r"\(ckpt_path='best' after fit\)" % (k, k, what), out), out


@pytest.fixture(scope="module")
def text_and_tokenizer(tmp_path_factory):
    """copy(tmp_path) puts train.txt and valid.txt (standard-library modules, read offline)
    and tok (make_tokenizer.py's tokenizer, trained on train.txt) in tmp_path: made once for
    the run_clm and run_mlm tests (a process fewer)."""
    made = tmp_path_factory.mktemp("text")
    stdlib = os.path.dirname(os.__file__)
    for name, files in (("train.txt", ("argparse.py", "ast.py")), ("valid.txt", ("bisect.py",))):
        with open(made / name, "w") as out:
            for source in files:
                with open(os.path.join(stdlib, source)) as f:
                    out.write(f.read())
    code, out = alone("transformers/make_tokenizer.py", ["train.txt", "tok"], made)
    assert code == 0, out

    def copy(tmp_path):
        for name in ("train.txt", "valid.txt"):
            shutil.copy(made / name, tmp_path / name)
        shutil.copytree(made / "tok", tmp_path / "tok")

    return copy


MLM = ["--model_type", "bert", "--config_overrides",
       "vocab_size=500,hidden_size=32,num_hidden_layers=1,num_attention_heads=2,"
       "intermediate_size=64,max_position_embeddings=64",
       "--tokenizer_name", "tok", "--train_file", "train.txt", "--validation_file",
       "valid.txt", "--max_seq_length", "32", "--per_device_train_batch_size", "4",
       "--use_cpu", "--report_to", "none", "--disable_tqdm", "true"]


@pytest.mark.slow  # two Trainer jobs of two workers, each importing transformers
@pytest.mark.timeout(240)  # 78 s at load 10 on the 2 cores
@needs("transformers", reason="run_mlm.py needs transformers")
def test_run_mlm_run_again_resumes_each_worker_from_its_own_last_checkpoint(text_and_tokenizer,
                                                                          tmp_path):
    """transformers' run_mlm.py plus the one import, under platoon-launcher -n 2 twice with
    the same --output_dir and no resume option: the script's own
    get_last_checkpoint(training_args.output_dir), before it makes its Trainer, finds each
    worker's own checkpoint (its TrainingArguments hold the worker's both/workerK from the
    start), so the second run, to step 4, resumes from checkpoint-2: 2 workers x 2 steps =
    4 minibatches (8 from scratch), platoon's sync phase with it."""
    text_and_tokenizer(tmp_path)
    for steps in ("2", "4"):
        shutil.rmtree(tmp_path / "logs", ignore_errors=True)  # the launcher's, one job's
        code, out = launched("transformers/run_mlm_platoon.py", MLM + [
            "--do_train", "--output_dir", "both", "--max_steps", steps, "--save_steps", "2"],
            tmp_path)
        assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("4", "2"), out
    assert "training starts from scratch" not in out, out
    assert sorted(os.listdir(tmp_path / "both")) == ["worker0", "worker1"]
    for k in range(2):
        saved = state(tmp_path / "both" / ("worker%d" % k) / "checkpoint-4" /
                      "trainer_state.json")
        assert saved["global_step"] == 4 and \
            saved["stateful_callbacks"]["platoon"] == {"platoon_steps": 4}, saved


@long_run("four Trainer jobs importing transformers, about 80 s")
@pytest.mark.timeout(400)  # 153 s at load 10 on the 2 cores
@needs("transformers", reason="run_mlm.py needs transformers")
def test_run_mlm_alone_then_two_workers_resumed_from_their_own_last_checkpoint(
        text_and_tokenizer, tmp_path):
    """transformers' run_mlm.py (random masking by DataCollatorForLanguageModeling, the last
    checkpoint detected in --output_dir by the script) plus the one import: alone, bf16 and
    accumulation 2, to step 4; two workers to step 4 under `both`; run again to step 8 with
    no resume option, the script finds each worker's own checkpoint-4 (its output_dir is
    the worker's both/workerK) and resumes from it; with --resume_from_checkpoint last each
    resumes from its own checkpoint-8 to step 12: each 2 x 4 steps x 2 batches = 16
    minibatches."""
    text_and_tokenizer(tmp_path)
    common = MLM + ["--do_train", "--do_eval", "--gradient_accumulation_steps", "2", "--bf16",
                    "--max_eval_samples", "16", "--save_steps", "4"]
    code, out = alone("transformers/run_mlm_platoon.py",
                      common + ["--output_dir", "out", "--max_steps", "4"], tmp_path)
    assert code == 0, out
    assert "eval_accuracy" in out and "platoon worker" not in out, out
    assert (tmp_path / "out" / "checkpoint-4").is_dir()
    runs = ((["--max_steps", "4"], "16"), (["--max_steps", "8"], "16"),
            (["--max_steps", "12", "--resume_from_checkpoint", "last"], "16"))
    for extra, batches in runs:
        shutil.rmtree(tmp_path / "logs", ignore_errors=True)  # the launcher's, one job's
        code, out = launched("transformers/run_mlm_platoon.py",
                             common + ["--output_dir", "both"] + extra, tmp_path)
        assert code == 0, out
        assert re.search(SUMMARY, out).group(1) == batches, out
        assert "training starts from scratch" not in out, out
    for k in range(2):
        saved = state(tmp_path / "both" / ("worker%d" % k) / "checkpoint-12" /
                      "trainer_state.json")
        assert saved["stateful_callbacks"]["platoon"] == {"platoon_steps": 12}, saved


def torch_rng(folder):
    import torch  # accelerate's extra brings it
    return torch.load(os.path.join(folder, "random_states_0.pkl"),
                      weights_only=False)["torch_manual_seed"]


@long_run("two Accelerate jobs importing transformers, about 30 s")
@needs("accelerate", reason="checkpointing.py needs accelerate")
def test_accelerates_checkpointing_example_alone_then_two_workers_from_its_checkpoint(tmp_path):
    """accelerate's by_feature/checkpointing.py plus `import
    platoon.integrations.accelerate_auto` (no LocalSGD in it to replace): alone, bf16,
    accumulation 2 (batch 16 over MAX_GPU_BATCH_SIZE 8), save_state every 12 batches; two
    workers resumed from its step_12 (load_state of a path no worker has under its own
    workerK: taken as it is by both) train epochs 1 (its last 4 batches) and 2: 2 x 12 =
    24 minibatches, 6 optimizer steps each from platoon step 6, a sync at 8 and 12: 4 syncs;
    each saves under its own step_12/workerK with its sync phase, and its RNG state there is
    its own (reseeded after loading the run alone's: not the same batches twice)."""
    args = ["--cpu", "--mixed_precision", "bf16", "--checkpointing_steps", "12"]
    code, out = alone("accelerate/checkpointing_platoon.py", args + ["--output_dir", "out"],
                      tmp_path)
    assert code == 0, out
    assert "epoch 2: {'accuracy'" in out, out
    with open(tmp_path / "out" / "step_12" / "platoon_state.json") as f:
        assert json.load(f) == {"platoon_steps": 6, "worker": None}
    code, out = launched("accelerate/checkpointing_platoon.py", args + [
        "--output_dir", "both", "--resume_from_checkpoint", "out/step_12"], tmp_path)
    assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("24", "4"), out
    for k in range(2):
        assert "[worker%d] epoch 2: {'accuracy'" % k in out, out
        with open(tmp_path / "both" / "step_12" / ("worker%d" % k) / "platoon_state.json") as f:
            assert json.load(f) == {"platoon_steps": 10, "worker": "worker%d" % k}
    rngs = [torch_rng(tmp_path / "both" / "step_12" / ("worker%d" % k)) for k in range(2)]
    assert not bool((rngs[0] == rngs[1]).all())


@long_run("two Lightning jobs, about 60 s")
@needs("lightning", reason="transformer.py needs lightning")
def test_lightnings_transformer_example_alone_then_two_workers_from_its_checkpoint(tmp_path):
    """Lightning's basics/transformer.py, a plain Trainer(...) script (gradient clipping, SGD),
    plus `import platoon.integrations.lightning_auto`: alone, bf16-mixed and accumulation 2,
    to step 4 and its checkpoint; two workers resumed from it with fit(ckpt_path=...) to
    step 8: 2 x 4 steps x 2 batches = 16 minibatches, one sync each at platoon step 8;
    checkpoints under lightning_logs/workerK; test(model, ...) after fit runs on the centre
    and each worker says so; one final result."""
    args = ["--accumulate_grad_batches", "2", "--precision", "bf16-mixed"]
    code, out = alone("lightning/transformer_platoon.py", args + ["--max_steps", "4"],
                      tmp_path)
    assert code == 0, out
    assert "test_loss" in out and "platoon worker" not in out, out
    ckpt = os.path.join("lightning_logs", "version_0", "checkpoints", "epoch=0-step=4.ckpt")
    assert (tmp_path / ckpt).exists(), out
    code, out = launched("lightning/transformer_platoon.py",
                         args + ["--max_steps", "8", "--ckpt_path", ckpt], tmp_path)
    assert code == 0, out
    assert re.search(SUMMARY, out).groups() == ("16", "2"), out
    assert re.search(r"final result \(the final centre, evaluated once by worker \d\): val_loss",
                     out), out
    for k in range(2):
        assert (tmp_path / "lightning_logs" / ("worker%d" % k) / "checkpoints" /
                "epoch=0-step=8.ckpt").exists()
        assert re.search(r"\[worker%d\] platoon worker%d: this test runs on the" % (k, k), out)


# -- the diffs the docs show --

DIFFS = [  # (doc, original, platoon's, lines added, lines removed)
    ("huggingface.md", "transformers/run_clm.py", "transformers/run_clm_platoon.py", 1, 0),
    ("accelerate.md", "accelerate/local_sgd.py", "accelerate/local_sgd_platoon.py", 1, 1),
    ("huggingface.md", "transformers/run_mlm.py", "transformers/run_mlm_platoon.py", 1, 0),
    ("accelerate.md", "accelerate/checkpointing.py", "accelerate/checkpointing_platoon.py",
     1, 0),
    ("lightning.md", "lightning/transformer.py", "lightning/transformer_platoon.py", 1, 0),
]


@pytest.mark.parametrize("doc, original, ours, added, removed", DIFFS)
def test_the_docs_show_each_upstream_examples_diff_and_it_is_one_line(doc, original, ours,
                                                                      added, removed):
    """Each upstream example's diff in the docs is the files' diff, and it adds one line (a
    Trainer script: the import that attaches the callback; Accelerate's: the import that
    replaces Accelerate's LocalSGD with platoon's)."""
    files = []
    for name in (original, ours):
        with open(os.path.join(UPSTREAM, name)) as f:
            files.append(f.read().splitlines(keepends=True))
    diff = "".join(difflib.unified_diff(*files, os.path.basename(original),
                                        os.path.basename(ours)))
    with open(os.path.join(ROOT, "docs", doc)) as f:
        shown = re.findall(r"^```diff\n(.*?)^```", f.read(), re.S | re.M)
    assert diff in shown, diff
    lines = diff.splitlines()[2:]
    assert sum(line.startswith("+") for line in lines) == added
    assert sum(line.startswith("-") for line in lines) == removed


def test_lightnings_autoencoder_needs_no_line_and_the_docs_give_its_flag():
    """There is no platoon copy of autoencoder.py (the flag is all: the only platoon copy is
    the Trainer(...) script's), and docs/lightning.md shows the command with the flag that the
    test above runs."""
    scripts = [n for n in os.listdir(os.path.join(UPSTREAM, "lightning")) if n.endswith(".py")]
    assert sorted(scripts) == ["autoencoder.py", "transformer.py", "transformer_platoon.py"]
    with open(os.path.join(ROOT, "docs", "lightning.md")) as f:
        doc = f.read()
    assert ("platoon-launcher -n 2 examples/upstream/lightning/autoencoder.py -- "
            "--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy") in doc
