"""An LSTM worker: a PyTorch sequence classifier trained with EASGD, synced by PeriodicSync.

An ordinary PyTorch training loop; the one platoon line wraps its optimizer in
`platoon.PeriodicSync`, which syncs the model with the centre every --sync-every steps
(in the background with --overlap). The task, generated in code: each sequence is a noisy
sine wave of one of four frequencies; the class is the frequency.
Run by the launcher:  platoon-launcher examples/lstm/lstm -n 2
"""

import argparse

import torch
from torch import nn

from platoon import EASGD, PeriodicSync, Worker

CLASSES, LENGTH = 4, 30


def make_batch(generator, size):
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    phase = torch.rand(size, 1, generator=generator) * 6.283
    t = torch.arange(LENGTH).float()
    freq = (labels.float() + 1.0).unsqueeze(1) * 0.15
    x = torch.sin(freq * t + phase) + 0.3 * torch.randn(size, LENGTH, generator=generator)
    return x.unsqueeze(2), labels


class Classifier(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.out(h[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="by hand: the controller's port")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--sync-every", type=int, default=10)
    parser.add_argument("--overlap", action="store_true", help="sync in the background")
    args = parser.parse_args()

    torch.manual_seed(0)  # every worker builds the same initial model
    model = Classifier()
    with Worker(control_port=args.port) as w:
        device = w.device.torch  # cuda:0 on the GPU the launcher pinned, else cpu
        model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        optimizer = PeriodicSync(w, model, optimizer, sync_every=args.sync_every,
                                 rule=EASGD(min(0.9 / w.global_size, 1.0)), overlap=args.overlap)
        generator = torch.Generator().manual_seed(1000 + w.worker_id)
        x_valid, y_valid = make_batch(torch.Generator().manual_seed(7), 512)
        x_valid, y_valid = x_valid.to(device), y_valid.to(device)
        print("worker %d training on %s" % (w.worker_id, device), flush=True)
        while w.send_req("next") == "train":
            for _ in range(args.sync_every):
                x, y = make_batch(generator, args.batch_size)
                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()  # syncs every args.sync_every steps
            with torch.no_grad():
                error = (model(x_valid).argmax(1) != y_valid).float().mean().item()
            w.send_req("done", {"n": args.sync_every, "syncs": w.syncs,
                                "loss": loss.item(), "valid_error": error})
        optimizer.finish()  # the sync in flight (--overlap) and the last progress report


if __name__ == "__main__":
    main()
