"""A worker for tests: trains a tiny byte-level transformer with AdamW(LR) through PeriodicSync's
default rule, every 4 steps, and reports the centre's validation loss.

usage: transformer_worker.py PORT STEPS LR OUT
The text is this repository's own platoon/ sources (bytes); each worker draws its own
minibatches (seeded by its id). After STEPS steps, the last worker to finish
evaluates the final centre (PeriodicSync's `evaluate`) and writes {"loss": ..., "rule": ...}
to OUT.
"""

import glob
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from platoon import PeriodicSync, Worker

CONTEXT, WIDTH = 32, 32
HERE = os.path.dirname(os.path.abspath(__file__))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(256, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.block = nn.TransformerEncoderLayer(WIDTH, 2, 4 * WIDTH, 0.0, batch_first=True,
                                                norm_first=True)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 256)
        mask = torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
        return self.head(self.norm(self.block(h, src_mask=self.mask, is_causal=True)))


def text():
    paths = sorted(glob.glob(os.path.join(HERE, "..", "..", "platoon", "**", "*.py"),
                             recursive=True))
    data = b"".join(open(p, "rb").read() for p in paths)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def loss_on(model, windows):
    with torch.no_grad():
        logits = model(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1)).item()


def main():
    port, steps, lr, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    data = text()
    valid, train = data[:len(data) // 10], data[len(data) // 10:]
    starts = torch.linspace(0, len(valid) - CONTEXT - 2, 64).long()
    windows = valid[starts[:, None] + torch.arange(CONTEXT + 1)]
    torch.manual_seed(0)
    model = TinyGPT()
    with Worker(port, timeout_s=60) as w:
        generator = torch.Generator().manual_seed(1 + w.worker_id)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        with PeriodicSync(w, model, opt, sync_every=4,
                          evaluate=lambda m: {"loss": loss_on(m, windows)}) as sync:
            for _ in range(steps):
                offsets = torch.randint(0, len(train) - CONTEXT - 1, (8,), generator=generator)
                batch = train[offsets[:, None] + torch.arange(CONTEXT + 1)]
                sync.zero_grad()
                F.cross_entropy(model(batch[:, :-1]).reshape(-1, 256),
                                batch[:, 1:].reshape(-1)).backward()
                sync.step()
        if sync.final_result is not None:  # the last to finish: the final centre's loss
            with open(out, "w") as f:
                json.dump({"loss": sync.final_result["loss"], "rule": repr(sync.rule)}, f)


if __name__ == "__main__":
    main()
