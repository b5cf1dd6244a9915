"""A platoon worker of the language-model fault runs (run by platoon-launcher; see faults.py).

Trains the byte-level LSTM with the rule and settings in --config, syncing every `tau` steps.
Worker 0 evaluates the centre every `eval_every` steps, keeps the clock and says "stop" at the
target; worker 1 SIGKILLs itself once at `kill_at` steps when asked to.
faults.py runs it with the repository on PYTHONPATH.
"""

import os
import sys
import time

import torch

from benchmarks.language_model.faults import Progress, kill_self_once, problem_of, read_config
from benchmarks.time_to_accuracy.methods import RULES
from platoon import Worker


def main():
    config = read_config(sys.argv)
    cfg, problem = config["cfg"], problem_of(config)
    torch.set_num_threads(1)
    data = problem.load()
    model = problem.model(config["seed"])
    with Worker() as w:
        rank = w.worker_id
        w.init_shared_params([p.detach().numpy() for p in model.parameters()],
                             RULES[cfg["rule"]](cfg))
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"],
                              momentum=cfg.get("momentum", 0.0))
        marker = os.path.join(config["dir"], "killed")
        incarnation = 1 if os.path.exists(marker) else 0
        step, evaluate = problem.trainer(data, 1000 * config["seed"] + rank + 7 * incarnation)
        centre = problem.model(0)
        progress = Progress(config["progress"]) if rank == 0 else None
        w.send_req("ready")
        deadline = time.monotonic() + 120
        while not w.send_req("go"):  # the barrier: every worker ready (a replacement: at once)
            if time.monotonic() > deadline:
                raise TimeoutError("the other worker did not get ready within 120 s")
            time.sleep(0.01)
        if progress:
            progress.start()
        steps = 0
        while True:
            step(model, opt, steps)
            steps += 1
            if rank:
                kill_self_once(config, steps, marker)
            if steps % cfg["tau"] == 0:
                w.sync_params()
            if steps % problem.eval_every:
                continue
            start = time.monotonic()
            if progress:
                with w.lock(timeout_s=30), torch.no_grad():
                    for p, c in zip(centre.parameters(), w.shared_params):
                        p.copy_(torch.from_numpy(c))
                metric = evaluate(centre)
            else:
                metric = evaluate(model)
            if progress:
                clock = progress.add(steps, metric, time.monotonic() - start)
                if problem.reached(metric) or clock > config["cap_s"]:
                    w.send_req("stop")
            if w.send_req("next") == "stop":
                break


if __name__ == "__main__":
    main()
