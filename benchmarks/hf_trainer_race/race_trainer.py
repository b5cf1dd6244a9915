"""One process of the Trainer race: examples/huggingface's Trainer script (a byte-level GPT-2
from a config on Python's own source) with a clock, as one process, a rank of the Trainer's
DDP (torchrun) or a platoon worker (platoon-launcher; PlatoonCallback).

usage: race_trainer.py OUT_DIR --method M --lr LR [--seed S] [--target LOSS] [--eval-every K]
                       [--horizon N] [--warmup F] [--cap-s S] [--sync-every K] [--outer-lr X]
                       [--outer-momentum B] [--delayed-nesterov 0|1] [--slow-rank R] [--quick]
                       [--corpus stdlib|docstrings] [--model race|wide] [--alpha A]

Every `eval_every` optimizer steps the clock stops and the model is evaluated on the held-out
files (platoon: the centre, `PeriodicSync.on_centre`; DDP: every rank evaluates its share):
training stops at `target` eval loss, at `cap_s` seconds of training or at `horizon` steps
(the schedule's end: a warm-up over the `--warmup` fraction of them, 5% unless said, then a
linear decay to 0). The clock counts training only, from the start of train() (after the
workers met: PeriodicSync waits for all, DDP's first all-reduce too). `--slow-rank R`: the
process of rank R (DDP's rank, platoon's global rank) sleeps as long as each of its steps
took, so it runs at half speed. Each process writes OUT_DIR/rankK.json: its trace (step,
training seconds, eval loss), when it reached the target, its steps and seconds.
`--corpus docstrings --model wide`: the second workload (prose.py: the standard library's
docstrings, a wider, shallower GPT-2 with half the context).
"""

import argparse
import json
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "huggingface"))
from prose import EVAL_BYTES, MODELS, ByteWindows, split  # noqa: E402 (this folder's)
from single_process import TRAIN_FILES, VALID_FILES, Chunks  # noqa: E402 (the example's)

METHODS = ("single", "ddp", "platoon_easgd", "platoon_diloco", "platoon_asgd")


class Clock(TrainerCallback):
    """Times training without its evaluations, evaluates every `eval_every` steps, stops at
    the target or the cap, and slows this process 2x when asked."""

    def __init__(self, opts, rank, evaluate, agree):
        self.opts, self.rank = opts, rank
        self.evaluate, self.agree = evaluate, agree  # agree(stop) -> stop on every rank
        self.trace, self.reached = [], None
        self.started = self.step_started = 0.0
        self.eval_s = 0.0
        self.load_before = os.getloadavg()[0]

    def training_s(self):
        return time.monotonic() - self.started - self.eval_s

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.opts.slow_rank == self.rank:  # as long again as the step took
            time.sleep(time.monotonic() - self.step_started)
        if state.global_step % self.opts.eval_every:
            return
        began = time.monotonic()
        loss = float(self.evaluate()["eval_loss"])
        self.eval_s += time.monotonic() - began
        clock = self.training_s()
        self.trace.append([state.global_step, round(clock, 3), round(loss, 4)])
        if loss <= self.opts.target and self.reached is None:
            self.reached = [round(clock, 3), state.global_step]
        if self.agree(self.reached is not None or clock > self.opts.cap_s):
            control.should_training_stop = True

    def record(self, steps):
        return {"method": self.opts.method, "rank": self.rank, "lr": self.opts.lr,
                "seed": self.opts.seed, "slow_rank": self.opts.slow_rank, "steps": steps,
                "clock_s": round(self.training_s(), 3), "eval_s": round(self.eval_s, 3),
                "reached": self.reached, "trace": self.trace,
                "load_before": self.load_before}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=2.0, help="eval loss (nats per byte)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=3200, help="the schedule's steps")
    parser.add_argument("--warmup", type=float, default=0.05,
                        help="the schedule's warm-up, a fraction of the horizon (0: none)")
    parser.add_argument("--cap-s", type=float, default=300.0)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=None,
                        help="platoon_easgd's EASGD alpha (default: PlatoonCallback's rule, "
                             "EASGD(0.9 / p))")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--delayed-nesterov", type=int, default=0,
                        help="1: platoon_diloco's rule is DelayedNesterov (momentum every p "
                             "pushes), not DiLoCo")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--quick", action="store_true", help="a tiny model and data")
    parser.add_argument("--corpus", choices=("stdlib", "docstrings"), default="stdlib",
                        help="the race's source files, or the standard library's docstrings")
    parser.add_argument("--model", choices=sorted(MODELS), default="race",
                        help="GPT-2's shape (prose.MODELS)")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    width, layers, heads, context = MODELS[opts.model]
    windows = EVAL_BYTES // context
    if opts.quick:
        context, width, layers, heads, windows = 32, 16, 1, 2, 32
    torch.manual_seed(opts.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=context, n_embd=width,
                                       n_layer=layers, n_head=heads, bos_token_id=0,
                                       eos_token_id=0))
    training = TrainingArguments(
        os.path.join(opts.out_dir, "trainer"), max_steps=opts.horizon, learning_rate=opts.lr,
        weight_decay=0.01, max_grad_norm=1.0, warmup_steps=int(round(opts.horizon * opts.warmup)),
        lr_scheduler_type="linear", per_device_train_batch_size=16,
        per_device_eval_batch_size=64, logging_steps=50, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=opts.seed, use_cpu=True, dataloader_num_workers=0)
    if opts.corpus == "docstrings":
        text, held_out = split(skip=TRAIN_FILES + VALID_FILES)
        train = ByteWindows(text[:100000] if opts.quick else text, context)
        valid = ByteWindows(held_out, context, limit=windows)
    else:
        train = Chunks(TRAIN_FILES[:3] if opts.quick else TRAIN_FILES, context)
        valid = Chunks(VALID_FILES, context, limit=windows)
    trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=valid)
    rank, evaluate, agree = 0, trainer.evaluate, (lambda stop: stop)
    if opts.method == "ddp":
        import torch.distributed as dist
        rank = dist.get_rank()

        def agree(stop):  # noqa: F811 - every rank stops at the same step
            flag = torch.tensor([float(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item())
    elif opts.method.startswith("platoon"):
        from platoon import ASGD, EASGD, DelayedNesterov, DiLoCo
        from platoon.integrations.huggingface import PlatoonCallback
        outer = DelayedNesterov if opts.delayed_nesterov else DiLoCo
        rule = outer(outer_lr=opts.outer_lr, momentum=opts.outer_momentum) \
            if opts.method == "platoon_diloco" else ASGD() if opts.method == "platoon_asgd" \
            else EASGD(opts.alpha) if opts.alpha is not None else None
        sync = PlatoonCallback.attach(trainer, sync_every=opts.sync_every, rule=rule,
                                      evaluate_centre=False)
        rank = sync.worker.global_rank

        def evaluate():  # noqa: F811 - the centre, as the race's result
            return sync.sync.on_centre(trainer.evaluate)
    clock = Clock(opts, rank, evaluate, agree)
    trainer.add_callback(clock)
    trainer.train()
    os.makedirs(opts.out_dir, exist_ok=True)
    with open(os.path.join(opts.out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(clock.record(trainer.state.global_step), f)


if __name__ == "__main__":
    main()
