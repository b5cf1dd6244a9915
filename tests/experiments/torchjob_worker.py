"""A PyTorch worker as a first-day user writes it: PeriodicSync with a loss per step, one
final evaluation of the centre, no reports of its own. usage: torchjob_worker.py [STEPS]

Prints "FINAL {json}" on the worker that evaluated the final centre.
"""

import json
import sys

import torch
from torch import nn

from platoon import PeriodicSync, Worker

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Linear(4, 1)
x_eval = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y_eval = x_eval.sum(1, keepdim=True)


def evaluate(m):
    with torch.no_grad():
        return {"loss": nn.functional.mse_loss(m(x_eval), y_eval)}  # a tensor: converted


with Worker(timeout_s=30) as w:
    sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.05), sync_every=2,
                        report_every_s=0.0, evaluate=evaluate)
    generator = torch.Generator().manual_seed(10 + w.worker_id)
    with sync:
        for _ in range(steps):
            x = torch.randn(16, 4, generator=generator)
            sync.zero_grad()
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            sync.step(loss=loss)
    if sync.final_result is not None:
        print("FINAL %s" % json.dumps(sync.final_result), flush=True)
