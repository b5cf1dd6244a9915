"""The language-model problem: a byte-level LSTM on the standard library's source, scored in
bits per byte on held-out files (lower is better)."""

import math
from dataclasses import dataclass

import numpy as np

from ..time_to_accuracy.methods import Dataset
from . import corpus


def char_lstm(hidden, embed, seed):
    """Embedding(256, embed) -> LSTM(embed, hidden) -> Linear(hidden, 256)."""
    import torch

    class CharLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(256, embed)
            self.lstm = torch.nn.LSTM(embed, hidden, batch_first=True)
            self.out = torch.nn.Linear(hidden, 256)

        def forward(self, x):
            return self.out(self.lstm(self.embed(x))[0])

    torch.manual_seed(seed)
    return CharLSTM()


@dataclass
class Text(Dataset):
    """Next-byte prediction: minibatches of `batch` windows of `bptt` bytes at random offsets
    of the training text (each process its own offsets), every step from a zero state;
    gradients clipped to norm `clip`. The metric: bits per byte on `eval_windows` windows of
    `eval_bptt` bytes spread evenly over the validation text (each from a zero state). The
    target is a ceiling."""
    bptt: int = 64
    embed: int = 32
    clip: float = 1.0
    train_bytes: int = 4_000_000
    valid_bytes: int = 2_000_000
    eval_bptt: int = 128
    eval_windows: int = 256

    def load(self):
        train, valid, self.corpus = corpus.load(self.train_bytes, self.valid_bytes)
        return train.astype(np.int64), valid.astype(np.int64)

    def model(self, seed):
        return char_lstm(self.hidden, self.embed, seed)

    def trainer(self, data, seed):
        import torch
        import torch.nn.functional as F
        train, valid = (torch.from_numpy(a) for a in data)
        rng = np.random.default_rng(seed)
        offsets = torch.from_numpy(rng.integers(0, len(train) - self.bptt - 1,
                                                (8192, self.batch)))
        window = torch.arange(self.bptt + 1)
        starts = torch.linspace(0, len(valid) - self.eval_bptt - 1, self.eval_windows).long()
        windows = valid[starts[:, None] + torch.arange(self.eval_bptt + 1)]
        vx, vy = windows[:, :-1], windows[:, 1:]

        def step(net, optimizer, k):
            seq = train[offsets[k % len(offsets)][:, None] + window]
            optimizer.zero_grad()
            F.cross_entropy(net(seq[:, :-1]).reshape(-1, 256), seq[:, 1:].reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.clip)
            optimizer.step()

        def evaluate(net):
            with torch.no_grad():
                nats = F.cross_entropy(net(vx).reshape(-1, 256), vy.reshape(-1))
            return float(nats) / math.log(2)
        return step, evaluate

    def reached(self, metric):
        return metric <= self.target

    def shortfall(self, metric):
        return metric - self.target
