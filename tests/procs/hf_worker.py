"""A small Hugging Face Trainer script (a tiny GPT-2 from a config, made-up text) made a platoon
worker by PlatoonCallback; writes what it did to OUT_JSON (tests/integrations/test_huggingface.py).

usage: hf_worker.py OUT_JSON OUTPUT_DIR [--steps N] [--accum K] [--every K] [--save-steps S]
                    [--stop-at S] [--then-resume N [--uninterrupted]] [--scaler --inf-at STEP]
                    [--rejoin PORT N (last | checkpoint-S)] [--then-scaler N STEP]
                    [--own-output-dir CASES_JSON]
Every run ends with the script's own trainer.evaluate(), and counts the evaluations.
--stop-at S: the run stops after step S of its N (as if killed there, its schedule N steps').
--then-resume N: after training, a fresh model and Trainer resume from the last checkpoint and
train to N steps (a second PlatoonCallback, a second one-worker job); OUT_JSON tells of both,
and each run's training loss at every step. --uninterrupted: then a third run trains N steps
from the start, in its own output directory, to compare with.
--rejoin PORT N RESUME: after the job, a fresh model and Trainer join a second job (the
controller at PORT) and train to N steps, resumed as a script that knows nothing of platoon
says it: RESUME "last" is trainer.train(resume_from_checkpoint="last"); checkpoint-S is the
checkpoint's path in OUTPUT_DIR, given as TrainingArguments(resume_from_checkpoint=...) and
passed on to train() as transformers' run_clm.py does.
--scaler --inf-at STEP: accelerate's mixed-precision path with torch's GradScaler (accelerate
has none on the CPU: the script gives it one), and the gradients of optimizer step STEP
(1-based) made infinite, so that the scaler skips that step.
--then-scaler N STEP: after the other runs, one more of N steps with --scaler --inf-at STEP,
sync_every 1, in its own output directory (a Trainer process fewer in the suite).
--own-output-dir CASES_JSON: what own_output_dir returned and left in output_dir, call by call,
written to CASES_JSON (the check of it needs transformers: in this process, not the suite's).
"""

import argparse
import dataclasses
import json
import os
import types

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from platoon.integrations.huggingface import PlatoonCallback, own_output_dir
from platoon.placement import Placement

TEXT = "the quick brown fox jumps over the lazy dog, then sleeps. " * 30
SEQ = 16


def examples(text):
    ids = torch.tensor([ord(c) % 64 for c in text])
    return [{"input_ids": ids[i:i + SEQ], "labels": ids[i:i + SEQ]}
            for i in range(0, len(ids) - SEQ, SEQ)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--then-resume", type=int, default=0)
    parser.add_argument("--uninterrupted", action="store_true")
    parser.add_argument("--scaler", action="store_true")
    parser.add_argument("--inf-at", type=int, default=0)
    parser.add_argument("--rejoin", nargs=3, metavar=("PORT", "N", "RESUME"))
    parser.add_argument("--then-scaler", nargs=2, type=int, metavar=("N", "STEP"))
    parser.add_argument("--own-output-dir", metavar="CASES_JSON")
    opts = parser.parse_args()
    if opts.own_output_dir:
        with open(opts.own_output_dir, "w") as f:
            json.dump(own_output_dir_cases(), f)
    runs = [train(opts, opts.steps, resume=None, stop_at=opts.stop_at)]
    if opts.rejoin:
        port, steps, resume = opts.rejoin
        os.environ["PLATOON_CONTROL_PORT"] = port
        runs.append(train(opts, int(steps), resume=resume))
    if opts.then_resume:
        runs.append(train(opts, opts.then_resume, resume=True))
    if opts.uninterrupted:
        whole = argparse.Namespace(**dict(vars(opts), output_dir=os.path.join(
            opts.output_dir, "uninterrupted")))
        runs.append(train(whole, opts.then_resume, resume=None))
    if opts.then_scaler:
        steps, inf_at = opts.then_scaler
        scaled = argparse.Namespace(**dict(vars(opts), output_dir=os.path.join(
            opts.output_dir, "scaler"), accum=1, every=1, save_steps=0, scaler=True,
            inf_at=inf_at))
        runs.append(train(scaled, steps, resume=None))
    with open(opts.out, "w") as f:
        json.dump(runs, f)


def own_output_dir_cases():
    """[returned, output_dir after] of own_output_dir: twice for the second of two workers,
    then for arguments the script replaced with an output_dir of its own, then in a job of
    one worker."""
    second = types.SimpleNamespace(placement=Placement(1, 2, 1, 2))
    args = TrainingArguments(output_dir="out", report_to="none")
    cases = [[own_output_dir(args, second), args.output_dir] for _ in range(2)]
    moved = dataclasses.replace(args, output_dir="elsewhere")  # the script's own change
    cases.append([own_output_dir(moved, second), moved.output_dir])
    alone = TrainingArguments(output_dir="out", report_to="none")
    cases.append([own_output_dir(alone, types.SimpleNamespace(placement=Placement(0, 1, 0, 1))),
                  alone.output_dir])
    return cases


class Seen(TrainerCallback):
    """The step the run began at, and how many evaluations it ran."""

    def __init__(self):
        self.first_step, self.evaluations = None, 0

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step is None:
            self.first_step = state.global_step

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations += 1


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def train(opts, steps, resume, stop_at=0):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    path = isinstance(resume, str) and resume.startswith("checkpoint-")
    args = TrainingArguments(opts.output_dir, max_steps=steps, per_device_train_batch_size=4,
                             resume_from_checkpoint=os.path.join(opts.output_dir, resume)
                             if path else None,
                             gradient_accumulation_steps=opts.accum, learning_rate=3e-3,
                             logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                             save_strategy="steps" if opts.save_steps else "no",
                             save_steps=opts.save_steps or 500, dataloader_num_workers=0)
    data = examples(TEXT)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8])
    callback = PlatoonCallback.attach(trainer, sync_every=opts.every)
    seen = Seen()
    trainer.add_callback(seen)
    if stop_at:
        trainer.add_callback(StopAt(stop_at))
    if opts.scaler:  # backward scales the loss, the optimizer's step goes through scaler.step
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    if opts.inf_at:
        def poison(grad):  # during step inf_at, an infinite gradient: the scaler skips the step
            return grad * float("inf") if trainer.state.global_step == opts.inf_at - 1 else grad
        next(model.parameters()).register_hook(poison)
    first_batch = next(iter(trainer.get_train_dataloader()))["input_ids"][:, 0].tolist()
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint if path else resume)
    eval_loss = trainer.evaluate()["eval_loss"]  # the script's own
    return {"platoon_steps": callback.sync.steps, "syncs": callback.worker.syncs,
            "first_step": seen.first_step, "evaluations": seen.evaluations,
            "eval_loss": eval_loss,
            "global_step": trainer.state.global_step, "final_result": callback.final_result,
            "output_dir": trainer.args.output_dir, "first_batch": first_batch,
            "skipped": trainer.accelerator.optimizer_step_was_skipped,
            "losses": [[e["step"], e["loss"]] for e in trainer.state.log_history if "loss" in e]}


if __name__ == "__main__":
    main()
