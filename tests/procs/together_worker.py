"""A worker for tests: shares a small model with PeriodicSync (start_together by default)
and trains it. usage: together_worker.py PORT [STEPS]

Prints "REGISTERED ID" once registered, then "TRAINING ID SAME" once PeriodicSync lets it
start (SAME: 1 if its model is then still the initial one, which no sync has moved), then
"DONE ID SYNCS".
"""

import sys

import torch
from torch import nn

from platoon import EASGD, PeriodicSync, Worker


def main():
    port, steps = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20
    torch.set_num_threads(1)
    with Worker(control_port=port, timeout_s=90) as w:
        print("REGISTERED %d" % w.worker_id, flush=True)
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        initial = [p.detach().clone() for p in model.parameters()]
        sync = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1,
                            rule=EASGD(0.5))
        same = all(torch.equal(a, b) for a, b in zip(initial, model.parameters()))
        print("TRAINING %d %d" % (w.worker_id, same), flush=True)
        x = torch.full((8, 4), 1.0 + w.worker_id)
        with sync:
            for _ in range(steps):
                sync.zero_grad()
                model(x).pow(2).mean().backward()
                sync.step()
        print("DONE %d %d" % (w.worker_id, w.syncs), flush=True)


if __name__ == "__main__":
    main()
