"""What PeriodicSync costs a PyTorch training loop: time per step against the plain optimizer.

usage: python -m benchmarks.bench_torch [--quick] [--hidden H] [--sync-every N]

One process, torch on one thread: a controller serving in a thread, and four
copies of an MLP 784-H-H-10 stepped by SGD on a fixed batch of 64: the plain
optimizer, PeriodicSync syncing in place, PeriodicSync with overlap=True (the
sync, from a snapshot, runs in a background thread while the next steps
compute) and with overlap="step" (no snapshot: the sync runs during the next
step's forward and backward, finished before its optimizer step). Each is
timed over rounds of sync_every*8 steps, in alternation (best round of each), and
reported as milliseconds per step and as a ratio to the plain optimizer.
"""

import argparse
import os
import threading
import time

from ._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():
    os.environ.setdefault(_name, _value)


def measure(hidden=1024, sync_every=4, rounds=5):
    """{setup: ms per step} and {setup: ratio to plain} for the four setups."""
    import torch
    from torch import nn

    from platoon import EASGD, Controller, PeriodicSync, Worker

    torch.set_num_threads(1)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, 10))

    ctl = Controller(control_port=0, num_workers=3)
    serving = threading.Thread(target=ctl.serve, kwargs={"timeout_s": 600}, daemon=True)
    serving.start()
    workers = []
    try:
        setups = {}
        model = make()
        setups["plain"] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
        for name, overlap in (("in_place", False), ("overlap", True), ("overlap_step", "step")):
            w = Worker(ctl.control_port, timeout_s=60)
            workers.append(w)
            model = make()
            setups[name] = (model, PeriodicSync(w, model, torch.optim.SGD(
                model.parameters(), lr=0.01), sync_every=sync_every, rule=EASGD(0.3),
                overlap=overlap, start_together=False))  # three workers of one thread
        steps = sync_every * 8

        def run(model, opt):
            start = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            if isinstance(opt, PeriodicSync):
                opt.wait()
            return (time.perf_counter() - start) / steps

        for model, opt in setups.values():
            run(model, opt)  # warm up (torch's first step imports much of torch)
        best = {name: float("inf") for name in setups}
        for _ in range(rounds):
            for name, (model, opt) in setups.items():
                best[name] = min(best[name], run(model, opt))
    finally:
        for w in workers:
            w.close()
        serving.join(30)
        ctl.close()
    return ({name: 1e3 * t for name, t in best.items()},
            {name: t / best["plain"] for name, t in best.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--sync-every", type=int, default=4)
    args = parser.parse_args()
    ms, ratio = measure(args.hidden, args.sync_every, 2 if args.quick else 5)
    params = 784 * args.hidden + args.hidden * args.hidden + args.hidden * 10 + 2 * args.hidden + 10
    print("MLP 784-%d-%d-10 (%.2fM float32 parameters), batch 64, sync every %d steps, "
          "load %s" % (args.hidden, args.hidden, params / 1e6, args.sync_every,
                       open("/proc/loadavg").read().split()[0]))
    for name in ms:
        print("%-12s %7.2f ms/step  %5.2fx plain" % (name, ms[name], ratio[name]))


if __name__ == "__main__":
    main()
