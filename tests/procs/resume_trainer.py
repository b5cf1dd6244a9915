"""An ordinary training script made a platoon job, run by itself (no launcher, no port: a
one-worker job) and resumed from its own checkpoint. usage:
resume_trainer.py STEPS OUT [--save-at N CKPT] [--resume CKPT] [--centre-only]
                  [--then-resume OUT2 OUT3]

SGD with momentum, a StepLR schedule, PeriodicSync every 3 steps. --save-at writes a
checkpoint after step N (and goes on): the centre, this worker's weights, PeriodicSync's and
the scheduler's state. --resume restores them all and goes on to STEPS; with --centre-only it
restores the centre only (what a resume gave before). OUT gets {"losses": {step: loss},
"final": ...}. --then-resume (with --save-at): after this run, one resumed from its checkpoint
(--resume CKPT) writes OUT2, then one resumed from it with --centre-only writes OUT3: each a
one-worker job of its own, in this process (two torch processes fewer in the suite), each
after a line "THEN resumed" or "THEN centre only".
"""

import argparse
import json

import torch
from torch import nn

import platoon


def batch(step):
    generator = torch.Generator().manual_seed(1000 + step)  # the same data whenever resumed
    x = torch.randn(32, 8, generator=generator)
    return x, x @ torch.linspace(-1, 1, 8).unsqueeze(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("out")
    parser.add_argument("--save-at", nargs=2, metavar=("N", "CKPT"))
    parser.add_argument("--resume")
    parser.add_argument("--centre-only", action="store_true")
    parser.add_argument("--then-resume", nargs=2, metavar=("OUT2", "OUT3"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args)
    for out, centre_only in zip(args.then_resume or (), (False, True)):
        print("THEN %s" % ("centre only" if centre_only else "resumed"), flush=True)
        train(argparse.Namespace(**dict(vars(args), out=out, save_at=None,
                                        resume=args.save_at[1], centre_only=centre_only)))
    print("DONE", flush=True)


def train(args):
    """One run, a one-worker job of its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    ckpt = torch.load(args.resume) if args.resume else None
    if ckpt is not None:  # the first worker's model starts the centre (--resume: the job's)
        model.load_state_dict(ckpt["centre"])
    x_eval, y_eval = batch(-1)

    def evaluate(m):
        with torch.no_grad():
            return {"loss": nn.functional.mse_loss(m(x_eval), y_eval)}

    w = platoon.Worker(timeout_s=30)  # run by itself: a one-worker job
    sync = platoon.PeriodicSync(w, model, opt, sync_every=3, rule=platoon.EASGD(0.5),
                                evaluate=evaluate)
    if ckpt is not None and not args.centre_only:
        model.load_state_dict(ckpt["model"])
        sync.load_state_dict(ckpt["sync"])
        scheduler.load_state_dict(ckpt["scheduler"])
    losses = {}
    with sync:
        for step in range(sync.steps, args.steps):
            x, y = batch(step)
            sync.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            sync.step(loss=loss)
            scheduler.step()
            losses[step] = loss.item()
            if args.save_at and sync.steps == int(args.save_at[0]):
                torch.save({"centre": sync.centre_state_dict(), "model": model.state_dict(),
                            "sync": sync.state_dict(), "scheduler": scheduler.state_dict()},
                           args.save_at[1])
    w.close()
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "final": sync.final_result, "worker": w.worker_id,
                   "num_workers": w.num_workers}, f)


if __name__ == "__main__":
    main()
