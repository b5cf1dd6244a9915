"""A small Accelerate loop (an MLP with BatchNorm, made-up data) using platoon's LocalSGD in
place of accelerate.local_sgd's, a new ``with LocalSGD(...)`` block per epoch as Accelerate's
own example writes it; writes what it did to OUT_JSON at the script's exit, after the worker's
training ended there (tests/integrations/test_accelerate.py).

usage: accel_worker.py OUT_JSON [--epochs E] [--batches N] [--accum K] [--every K]
                       [--rule diloco] [--scaler --inf-at STEP] [--save-to DIR]
                       [--resume-from DIR] [--project-dir DIR] [--seedable]
--epochs E --batches N: E epochs (E LocalSGD blocks) of N batches each.
--save-to DIR: accelerator.save_state(DIR) after training (the first block's LocalSGD
registered for checkpointing); --resume-from DIR: accelerator.load_state(DIR) in the first
block.
--project-dir DIR: the accelerator's project directory, with automatic checkpoint naming;
accelerator.save_state() after training.
--seedable: DataLoaderConfiguration(use_seedable_sampler=True): prepare() gives the loader a
SeedableRandomSampler holding the script's seed.
--scaler --inf-at STEP: a GradScaler (accelerate has none on the CPU: the script gives it one)
with a fused AdamW, and the gradients of optimizer step STEP (1-based) made infinite, so that
the scaler skips that step.
"""

import argparse
import atexit
import json

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration

from platoon import DiLoCo
from platoon.integrations.accelerate import LocalSGD


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--rule", default=None)
    parser.add_argument("--scaler", action="store_true")
    parser.add_argument("--inf-at", type=int, default=0)
    parser.add_argument("--save-to", default=None)
    parser.add_argument("--resume-from", default=None)
    parser.add_argument("--project-dir", default=None)
    parser.add_argument("--seedable", action="store_true")
    opts = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x[:, :1] - 2 * x[:, 1:2]).clone()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=opts.scaler)
    dataset = torch.utils.data.TensorDataset(x, y)
    data = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)
    plain = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)  # not prepared
    project = ProjectConfiguration(project_dir=opts.project_dir,
                                   automatic_checkpoint_naming=True) if opts.project_dir else None
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=opts.accum, project_config=project,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=opts.seedable))
    if opts.scaler:  # accelerator.backward scales the loss, the optimizer steps through it
        accelerator.scaler = torch.amp.GradScaler("cpu")
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    real_steps = [0]

    def poison(grad):  # during optimizer step inf_at, an infinite gradient
        return grad * float("inf") if real_steps[0] == opts.inf_at - 1 else grad
    if opts.inf_at:
        next(model.parameters()).register_hook(poison)

    def evaluate(m):
        m.eval()
        with torch.no_grad():
            return {"loss": float(torch.nn.functional.mse_loss(m(x), y))}

    seen = {"jobs": [], "workers": [], "first_batch": None, "first_plain": None}
    blocks = []

    @atexit.register  # before LocalSGD's: runs after the worker's training ended at exit
    def dump():
        local_sgd = blocks[-1]
        seen.update(
            num_steps=local_sgd.num_steps, platoon_steps=local_sgd.sync.steps,
            syncs=local_sgd.worker.syncs, shared=local_sgd.sync.shared_names,
            rule=repr(local_sgd.sync.rule), final_result=local_sgd.final_result,
            project_dir=accelerator.project_dir, worker_path=local_sgd.worker_path("ckpt"),
            logging_dir=accelerator.logging_dir)
        with open(opts.out, "w") as f:
            json.dump(seen, f)

    rule = DiLoCo(outer_lr=0.7) if opts.rule == "diloco" else None
    for epoch in range(opts.epochs):
        model.train()
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=opts.every,
                      rule=rule, evaluate=evaluate) as local_sgd:
            blocks.append(local_sgd)
            seen["jobs"].append(local_sgd.worker.job_id)
            seen["workers"].append(local_sgd.worker.worker_id)
            if epoch == 0:
                accelerator.register_for_checkpointing(local_sgd)
                if opts.resume_from:
                    accelerator.load_state(opts.resume_from)
                seen["first_plain"] = next(iter(plain))[0][:4, 0].tolist()
            for k, (xb, yb) in enumerate(data):
                if k == opts.batches:
                    break
                if seen["first_batch"] is None:
                    seen["first_batch"] = xb[:4, 0].tolist()
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.mse_loss(model(xb), yb)
                    accelerator.backward(loss)
                    optimizer.step()
                    if accelerator.sync_gradients:
                        real_steps[0] += 1
                    optimizer.zero_grad()
                    local_sgd.step()
    if opts.save_to:
        accelerator.save_state(opts.save_to)
    if opts.project_dir:
        accelerator.save_state()


if __name__ == "__main__":
    main()
