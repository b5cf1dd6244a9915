"""A worker for tests: changes its model's tensors under PeriodicSync, syncing after each change.

usage: torch_move_worker.py PORT CHANGES OVERLAP OUT [PORT2 OVERLAP2 OUT2]
The only worker of its job, with EASGD(0.5) every 2 steps (overlapped when OVERLAP is 1).
After two steps (one sync) it applies each of CHANGES (comma-separated), in turn:
  share_memory  model.share_memory() (moves every CPU tensor's storage to shared memory)
  data          p.data = p.data.clone() for every parameter
  set           p.set_(p.detach().clone()) for every parameter
  double        model.double()
each followed by adding 0.1 to every parameter and two steps (a sync, waited for).
OUT gets a JSON report per change: the largest |parameter - centre| after its sync, the
largest |centre - centre before its sync| and the syncs so far; or, when the sync raised,
the error (and no later change is made).
PORT2 OVERLAP2 OUT2: then the same again with a fresh model, the only worker of a second job
(the controller at PORT2), overlapped or not as OVERLAP2 says (a torch process fewer in the
suite).
"""

import json
import sys

import torch
from torch import nn

from platoon import EASGD, PeriodicSync, Worker


def change(model, how):
    if how == "share_memory":
        model.share_memory()
    elif how == "data":
        for p in model.parameters():
            p.data = p.data.clone()
    elif how == "set":
        with torch.no_grad():
            for p in model.parameters():
                p.set_(p.detach().clone())
    elif how == "double":
        model.double()
    else:
        raise ValueError(how)


def largest_difference(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def main():
    changes = sys.argv[2].split(",")
    torch.set_num_threads(1)
    run(int(sys.argv[1]), changes, sys.argv[3] == "1", sys.argv[4])
    if len(sys.argv) > 5:
        run(int(sys.argv[5]), changes, sys.argv[6] == "1", sys.argv[7])
    print("DONE", flush=True)


def run(port, changes, overlap, out):
    torch.manual_seed(0)
    # 1024x1024 float32 (4 MiB): big enough that freeing its storage unmaps the pages.
    model = nn.Sequential(nn.Linear(1024, 1024), nn.BatchNorm1d(1024), nn.Linear(1024, 1))
    x = torch.randn(8, 1024)
    report = {}
    with Worker(control_port=port, timeout_s=20) as w:
        opt = PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=1e-3),
                           sync_every=2, rule=EASGD(0.5), overlap=overlap)
        names = opt.shared_names

        def step():
            opt.zero_grad()
            model(x.to(model[0].weight.dtype)).pow(2).mean().backward()
            opt.step()

        how = None
        try:
            with opt:
                step()
                step()  # a sync
                for how in changes:
                    change(model, how)
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(0.1)
                    before = opt.centre_state_dict()
                    step()
                    step()  # a sync
                    opt.wait()  # (when overlapped)
                    after = opt.centre_state_dict()
                    state = model.state_dict()
                    report[how] = {
                        "param_vs_centre": largest_difference(
                            [state[n] for n in names], [after[n] for n in names]),
                        "centre_moved": largest_difference(
                            [before[n] for n in names], [after[n] for n in names]),
                        "syncs": w.syncs}
        except Exception as exc:  # the report says what the sync raised
            report[how] = {"error": "%s: %s" % (type(exc).__name__, exc)}
        with open(out, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
