"""A character-level LSTM language model trained by hand-written SGD.

An ordinary PyTorch script, in the style of PyTorch's word_language_model example:
truncated backpropagation through time, gradient clipping, the update written out
(`p.data.add_(p.grad, alpha=-lr)`), lr divided by 4 when the validation loss stops
improving. The text is Python's own standard library (a fixed list of modules), so it
runs offline anywhere. Three versions, one diff apart (docs/porting-a-script.md):
    python examples/lm/single_process.py --epochs 3
    platoon-launcher -n 2 examples/lm/train.py -- --epochs 3
    torchrun --nproc-per-node 2 examples/lm/ddp.py --epochs 3
"""

import argparse
import math
import os
import sysconfig
import time

import torch
from torch import nn

import platoon

TRAIN_FILES = ["argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py",
               "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py",
               "difflib.py", "fractions.py", "functools.py", "heapq.py", "inspect.py",
               "random.py", "shlex.py", "string.py", "textwrap.py", "threading.py",
               "tokenize.py", "typing.py"]
VALID_FILES = ["queue.py", "pprint.py"]


def read_bytes(files):
    stdlib = sysconfig.get_paths()["stdlib"]
    text = b"".join(open(os.path.join(stdlib, name), "rb").read() for name in files)
    return torch.tensor(list(text), dtype=torch.long)


def batchify(data, batch_size):
    """One column per sequence: (steps, batch_size)."""
    steps = data.size(0) // batch_size
    return data[:steps * batch_size].view(batch_size, -1).t().contiguous()


class CharLM(nn.Module):
    def __init__(self, emsize, nhid):
        super().__init__()
        self.embed = nn.Embedding(256, emsize)
        self.lstm = nn.LSTM(emsize, nhid)
        self.out = nn.Linear(nhid, 256)

    def forward(self, x, hidden=None):
        output, hidden = self.lstm(self.embed(x), hidden)
        return self.out(output).view(-1, 256), hidden


def evaluate(model, data, bptt):
    model.eval()
    total, hidden = 0.0, None
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            x, y = data[i:i + bptt], data[i + 1:i + 1 + bptt]
            output, hidden = model(x[:len(y)], hidden)
            total += len(y) * nn.functional.cross_entropy(output, y.reshape(-1)).item()
    model.train()
    return total / (data.size(0) - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=32)
    parser.add_argument("--emsize", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=128)
    parser.add_argument("--max-batches", type=int, default=None, help="per epoch (quick runs)")
    parser.add_argument("--valid-bytes", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = platoon.Worker()
    files = platoon.shard(TRAIN_FILES, w)
    train = batchify(read_bytes(files), args.batch_size).to(device)
    valid = batchify(read_bytes(VALID_FILES)[:args.valid_bytes], 8).to(device)
    model = CharLM(args.emsize, args.nhid).to(device)
    sync = platoon.PeriodicSync(w, model, sync_every=4)
    lr, best = args.lr, None

    for epoch in range(1, args.epochs + 1):
        start, hidden = time.time(), None
        batches = range(0, train.size(0) - 1, args.bptt)[:args.max_batches]
        for i in batches:
            x, y = train[i:i + args.bptt], train[i + 1:i + 1 + args.bptt]
            if hidden is not None:
                hidden = tuple(h.detach() for h in hidden)
            model.zero_grad()
            output, hidden = model(x[:len(y)], hidden)
            loss = nn.functional.cross_entropy(output, y.reshape(-1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            sync.step(loss=loss)
        val_loss = sync.on_centre(evaluate, model, valid, args.bptt)
        print("epoch %d: %d batches in %.1f s, lr %g, training loss %.3f, validation loss "
              "%.3f (%.3f bits per byte)" % (epoch, len(batches), time.time() - start, lr,
                                               loss.item(), val_loss, val_loss / math.log(2)),
              flush=True)
        if best is None or val_loss < best:
            best = val_loss
        else:
            lr /= 4.0
    sync.finish()


if __name__ == "__main__":
    main()
