"""A small byte-level language model trained with Accelerate's LocalSGD on Python's own source.

local_sgd.py is an Accelerate script as Accelerate's docs write one: a byte-level model built
in code (an embedding, two convolutions with BatchNorm over a 32-byte context, a linear head:
nothing downloaded), Python's standard library as the text (a fixed list of modules, read
offline), AdamW with gradient accumulation 2, a linear decay, ``accelerate.local_sgd.LocalSGD``
averaging the models every 8 optimizer steps, an evaluation at the end. Its multi-process mode
is Accelerate's own: ``accelerate launch --num_processes 2 local_sgd.py`` (or ``torchrun
--nproc-per-node 2``). train.py is the same script as a platoon worker, two lines apart
(docs/accelerate.md):
    python examples/accelerate/local_sgd.py
    platoon-launcher -n 2 examples/accelerate/train.py
    python examples/accelerate/train.py
"""

import argparse
import os
import sysconfig

import torch
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD

TRAIN_FILES = ["argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py",
               "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py",
               "difflib.py", "fractions.py", "functools.py", "heapq.py", "inspect.py"]
VALID_FILES = ["queue.py", "pprint.py"]


def windows(files, context, limit=None):
    """The files' bytes as (context bytes, next byte) pairs, one every 4 bytes."""
    stdlib = sysconfig.get_paths()["stdlib"]
    data = b"".join(open(os.path.join(stdlib, name), "rb").read() for name in files)
    ids = torch.tensor(list(data), dtype=torch.long)
    starts = torch.arange(0, len(ids) - context - 1, 4)[:limit]
    x = torch.stack([ids[s:s + context] for s in starts.tolist()])
    return torch.utils.data.TensorDataset(x, ids[starts + context])


class ByteModel(torch.nn.Module):
    """Next byte from the last `context` bytes: embedding, two convolutions with BatchNorm."""

    def __init__(self, context=32, width=64):
        super().__init__()
        self.embed = torch.nn.Embedding(256, width)
        self.convs = torch.nn.Sequential(
            torch.nn.Conv1d(width, width, 5, padding=2), torch.nn.BatchNorm1d(width),
            torch.nn.ReLU(), torch.nn.Conv1d(width, width, 5, stride=2, padding=2),
            torch.nn.BatchNorm1d(width), torch.nn.ReLU())
        self.head = torch.nn.Linear(width * context // 2, 256)

    def forward(self, x):
        h = self.convs(self.embed(x).transpose(1, 2))
        return self.head(h.flatten(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--local-sgd-steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = ByteModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1 - k / args.steps)
    train = torch.utils.data.DataLoader(windows(TRAIN_FILES, 32), args.batch_size, shuffle=True)
    valid = windows(VALID_FILES, 32, limit=2048)
    model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)

    def evaluate_model(model):
        model.eval()
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(valid.tensors[0]), valid.tensors[1])
        model.train()
        return {"eval_loss": float(loss)}

    batches = 0
    with LocalSGD(accelerator=accelerator, model=model,
                  local_sgd_steps=args.local_sgd_steps) as local_sgd:
        while batches < 2 * args.steps:
            for x, y in train:
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                    local_sgd.step()
                batches += 1
                if batches % 200 == 0:
                    accelerator.print("batch %d: loss %.3f" % (batches, loss.item()))
                if batches == 2 * args.steps:
                    break
    accelerator.print("final evaluation:", evaluate_model(model))


if __name__ == "__main__":
    main()
