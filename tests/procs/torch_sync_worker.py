"""A worker for tests: trains a small torch model with PeriodicSync and reports what it saw.

usage: torch_sync_worker.py PORT STEPS SYNC_EVERY OUT
Worker 0 syncs in place, worker 1 with overlap=True. The model (Linear, BatchNorm1d,
ReLU, Linear) learns a fixed linear map. OUT % worker_id gets a JSON report (w.syncs
after each step, losses on a fixed set before, after and of the centre); OUT % worker_id
+ ".pt" the centre's state dict, taken after every worker has finished training.
Prints "REGISTERED ID" once registered, "TRAINING ID SAME" once PeriodicSync (which starts
the job's workers together) lets it train (SAME: 1 if its model is then still the initial
one, which no sync has moved), "DONE ID SYNCS" at the end.
"""

import json
import sys

import torch
from torch import nn

from platoon import EASGD, PeriodicSync, Worker


def make_model():
    torch.manual_seed(0)  # every worker builds the same initial model
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))


def data(generator, n):
    x = torch.randn(n, 8, generator=generator)
    w_true = torch.arange(1.0, 9.0).unsqueeze(1) / 8.0
    return x, x @ w_true + 0.01 * torch.randn(n, 1, generator=generator)


def loss_of(model, x, y):
    model.eval()
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(x), y).item()
    model.train()
    return loss


def main():
    port, steps, sync_every, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4]
    torch.set_num_threads(1)
    model = make_model()
    x_eval, y_eval = data(torch.Generator().manual_seed(7), 256)
    report = {"loss_before": loss_of(model, x_eval, y_eval), "syncs": []}
    initial = [p.detach().clone() for p in model.parameters()]
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # (seconds of imports)
    with Worker(control_port=port, timeout_s=90) as w:
        print("REGISTERED %d" % w.worker_id, flush=True)
        opt = PeriodicSync(w, model, sgd, sync_every=sync_every, rule=EASGD(0.45),
                           overlap=w.worker_id == 1)
        same = all(torch.equal(a, b) for a, b in zip(initial, model.parameters()))
        print("TRAINING %d %d" % (w.worker_id, same), flush=True)
        generator = torch.Generator().manual_seed(100 + w.worker_id)
        with opt:
            for _ in range(steps):
                x, y = data(generator, 32)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                report["syncs"].append(w.syncs)
        report["final_syncs"] = w.syncs  # leaving the block finished an overlapped sync
        report["loss_after"] = loss_of(model, x_eval, y_eval)
        w.barrier()  # nobody syncs any more: the centre is final
        centre = opt.centre_state_dict()
        fresh = make_model()
        fresh.load_state_dict(centre, strict=True)
        report["centre_loss"] = loss_of(fresh, x_eval, y_eval)
        torch.save(centre, (out % w.worker_id) + ".pt")
        with open(out % w.worker_id, "w") as f:
            json.dump(report, f)
        print("DONE %d %d" % (w.worker_id, w.syncs), flush=True)


if __name__ == "__main__":
    main()
