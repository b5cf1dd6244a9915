"""A DDP process of the language-model fault runs (run by torchrun; see faults.py).

As DDP's users do: rank 0 checkpoints model, optimizer and step at every evaluation, and a
process started again by `torchrun --max-restarts` resumes from the last checkpoint. Rank 0
evaluates, keeps the clock (on across restarts) and decides stopping; rank 1 SIGKILLs itself
once at `kill_at` steps when asked to.
faults.py runs it with the repository on PYTHONPATH.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from benchmarks.language_model.faults import Progress, kill_self_once, problem_of, read_config


def main():
    config = read_config(sys.argv)
    cfg, problem = config["cfg"], problem_of(config)
    torch.set_num_threads(1)
    data = problem.load()
    # A file store per attempt: with torchrun's own store a restarted rank could read the
    # dead attempt's gloo address before the new rank 0 replaced it (seen here: "Gloo
    # connectFullMesh failed ... Connection refused").
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60),
                            init_method="file://" + os.path.join(config["dir"],
                                                                 "store." + attempt),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    model = problem.model(config["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg.get("momentum", 0.0))
    checkpoint = os.path.join(config["dir"], "checkpoint.pt")
    steps = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        steps = state["steps"]
    ddp = DistributedDataParallel(model)
    step, evaluate = problem.trainer(data, 1000 * config["seed"] + rank)
    progress = Progress(config["progress"]) if rank == 0 else None
    marker = os.path.join(config["dir"], "killed")
    dist.barrier()
    if progress:
        progress.start()
    while True:
        step(ddp, opt, steps)
        steps += 1
        if rank:
            kill_self_once(config, steps, marker)
        if steps % problem.eval_every:
            continue
        start = time.monotonic()
        stop = 0.0
        if progress:
            metric = evaluate(model)
            clock = progress.add(steps, metric, time.monotonic() - start)
            tmp = checkpoint + ".tmp"  # on the clock: users pay for their checkpoints
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "steps": steps}, tmp)
            os.replace(tmp, checkpoint)
            stop = float(problem.reached(metric) or clock > config["cap_s"])
        else:
            evaluate(model)
        flag = torch.tensor([stop])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
