"""A small GPT-2 language model trained by Hugging Face's Trainer on Python's own source.

single_process.py is an ordinary Trainer script: a byte-level GPT-2 built from a config (64
wide, 2 layers, 4 heads, a 128-byte context; nothing downloaded), Python's standard library as
the text (a fixed list of modules, read offline), AdamW with gradients clipped at norm 1, a 5%
warm-up and a linear decay, checkpoints every 500 steps, an evaluation at the end. train.py is
the same script as a platoon worker, two lines apart (docs/huggingface.md); run alone, it
trains as single_process.py does:
    python examples/huggingface/single_process.py
    platoon-launcher -n 2 examples/huggingface/train.py -- --lr 2.4e-2
    python examples/huggingface/train.py
"""

import argparse
import os
import sysconfig

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from platoon.integrations.huggingface import PlatoonCallback

TRAIN_FILES = ["argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py",
               "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py",
               "difflib.py", "fractions.py", "functools.py", "heapq.py", "inspect.py",
               "random.py", "shlex.py", "string.py", "textwrap.py", "threading.py",
               "tokenize.py", "typing.py"]
VALID_FILES = ["queue.py", "pprint.py"]


class Chunks(torch.utils.data.Dataset):
    """The files' bytes cut into `context`-byte examples (at most `limit`)."""

    def __init__(self, files, context, limit=None):
        stdlib = sysconfig.get_paths()["stdlib"]
        text = b"".join(open(os.path.join(stdlib, name), "rb").read() for name in files)
        self.data = torch.tensor(list(text), dtype=torch.long)
        self.context = context
        self.count = len(self.data) // context if limit is None else limit

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        ids = self.data[i * self.context:(i + 1) * self.context]
        return {"input_ids": ids, "labels": ids}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1600, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=1.2e-2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=1,
                        help="micro-batches per optimizer step")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--output-dir", default="hf-gpt2")
    parser.add_argument("--resume", default=None,
                        help="a checkpoint directory to resume from, or 'last'")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=256, n_positions=args.context, n_embd=64, n_layer=2,
                        n_head=4, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        args.output_dir, max_steps=args.steps, learning_rate=args.lr, weight_decay=0.01,
        max_grad_norm=1.0, warmup_steps=args.steps // 20, lr_scheduler_type="linear",
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation, per_device_eval_batch_size=64,
        logging_steps=50, save_strategy="steps", save_steps=500, report_to="none",
        disable_tqdm=True, seed=args.seed)
    trainer = Trainer(model=model, args=training,
                      train_dataset=Chunks(TRAIN_FILES, args.context),
                      eval_dataset=Chunks(VALID_FILES, args.context, limit=256))
    PlatoonCallback.attach(trainer)  # a platoon worker: syncs every 4 optimizer steps
    trainer.train(resume_from_checkpoint=True if args.resume == "last" else args.resume)
    print("final evaluation:", trainer.evaluate())


if __name__ == "__main__":
    main()
