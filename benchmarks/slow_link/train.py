"""One training process of a slow-link run: one process alone, a DDP or local-SGD rank, or a
platoon worker under `python -m platoon.mpi` (see `jobs`).

usage: python -m benchmarks.slow_link.train CONFIG [RANK]     (RANK: gloo's; platoon's comes
                                                               from its controller)

Trains the language model's byte-level LSTM with SGD(lr, momentum), or the transformer
benchmark's GPT with AdamW and its schedule (until its horizon at most); a barrier with the other
process after start-up and a warm-up, then the clock runs. Every `eval_every` steps each
process evaluates (rank 0 platoon's node centre, the others their own model; evaluation time
is off the clock); rank 0 stops the job at the target or the cap. Writes RESULT_DIR/rank-R.json:
steps, clock, the training thread's CPU time while the clock ran, the warm step's compute
time, the trace (rank 0), and its host's veth tx_bytes at the clock's start and end (when the
process runs in a namespace with the veth).
"""

import json
import os
import statistics
import sys
import time
from types import SimpleNamespace


def tx_bytes(device):
    """Bytes sent by `device` in this process's network namespace (None without it)."""
    try:
        with open("/sys/class/net/%s/statistics/tx_bytes" % device) as f:
            return int(f.read())
    except (OSError, TypeError):
        return None


class PlatoonNode:
    """A platoon worker of one node of a `python -m platoon.mpi` job (its settings from the
    environment platoon.mpi gives it): syncs every `tau` steps; rank 0 evaluates its node's
    centre and asks the whole job to stop."""

    def __init__(self, config, model):
        from benchmarks.time_to_accuracy.methods import RULES
        from platoon import Worker
        self.cfg, self.model = config["cfg"], model
        self.worker = Worker(timeout_s=120)
        self.rank = self.worker.global_rank
        self.worker.init_shared_params([p.detach().numpy() for p in model.parameters()],
                                       RULES[self.cfg["rule"]](self.cfg))
        self.centre = None
        self.sync_s = 0.0

    def setup(self):
        return self.model

    def barrier(self):
        self.worker.barrier(timeout_s=120)

    def after_step(self, step):
        if step % self.cfg["tau"] == 0:
            start = time.perf_counter()
            self.worker.sync_params()
            self.sync_s += time.perf_counter() - start
        return not self.worker.stop_requested

    def eval_model(self, problem):
        if self.rank:
            return self.model
        import torch
        if self.centre is None:
            self.centre = problem.model(0)
        with self.worker.lock(timeout_s=60), torch.no_grad():
            for p, c in zip(self.centre.parameters(), self.worker.shared_params):
                p.copy_(torch.from_numpy(c))
        return self.centre

    def agree_stop(self, stop):
        if stop:
            self.worker.request_stop("rank 0 reached the target or the cap")
        return stop or self.worker.stop_requested

    def stats(self):
        s = self.worker.sync_stats
        return {"sync_s": self.sync_s, "syncs": s.syncs, "node": self.worker.node_rank}

    def close(self):
        self.worker.close()


class Torch:
    """One process alone, or a DDP / local SGD rank: time_to_accuracy's members, given the
    gloo rendezvous (`address`) and the world size of the config."""

    def __init__(self, config, model, rank):
        from benchmarks.time_to_accuracy.methods import DDP, LocalSGD, Member
        cls = {"single": Member, "ddp": DDP, "local_sgd": LocalSGD}[config["kind"]]
        job = SimpleNamespace(address=config.get("address"), world=config["world"],
                              cfg=config["cfg"])
        self.rank, self.kind = rank, config["kind"]
        self.member = cls(job, rank, model)

    def setup(self):
        return self.member.setup()

    def barrier(self):
        if self.kind != "single":
            import torch.distributed as dist
            dist.barrier()

    def after_step(self, step):
        return self.member.after_step(step)

    def eval_model(self, problem):
        return self.member.eval_model()

    def agree_stop(self, stop):
        return self.member.agree_stop(stop)

    def stats(self):
        return self.member.stats()

    def close(self):
        self.member.close()


def main(argv):
    with open(argv[1]) as f:
        config = json.load(f)
    import torch

    from benchmarks.language_model.problem import Text
    from benchmarks.time_to_accuracy.harness import make_optimizer, make_schedule
    from benchmarks.transformer.problem import GPTText
    torch.set_num_threads(1)
    problem = {"Text": Text, "GPTText": GPTText}[config.get("problem_class", "Text")](
        **config["problem"])
    cfg, seed, device = config["cfg"], config["seed"], config.get("device")
    data = problem.load()
    model = problem.model(seed)
    if config["kind"] == "platoon":
        member = PlatoonNode(config, model)
    else:
        member = Torch(config, model, int(argv[2]) if len(argv) > 2 else 0)
    rank = member.rank
    trained = member.setup()

    def optimizer(params):
        return make_optimizer(torch, cfg, params)
    opt = optimizer(trained.parameters())
    schedule = make_schedule(torch, cfg, opt)
    step, evaluate = problem.trainer(data, 1000 * seed + rank)
    # Warm up on a throwaway copy and measure the compute time of one step (no sync).
    spare = problem.model(seed + 1)
    spare_opt, times = optimizer(spare.parameters()), []
    for k in range(8):
        start = time.perf_counter()
        step(spare, spare_opt, k)
        times.append(time.perf_counter() - start)
    evaluate(spare)
    step_s = statistics.median(times[3:])
    member.barrier()
    tx_start, t0, cpu0 = tx_bytes(device), time.monotonic(), time.thread_time()
    eval_s, eval_cpu_s, steps, trace, reached, last = 0.0, 0.0, 0, [], None, None
    while True:
        step(trained, opt, steps)
        steps += 1
        if schedule is not None:
            schedule.step()
        if not member.after_step(steps):
            break  # platoon: another worker stopped the job
        if steps % problem.eval_every:
            continue
        start, start_cpu = time.monotonic(), time.thread_time()
        metric = evaluate(member.eval_model(problem))
        clock = start - t0 - eval_s
        if rank == 0:
            trace.append((round(clock, 3), steps, round(metric, 4)))
            last = metric
            if reached is None and problem.reached(metric):
                reached = (clock, steps)
        ended = schedule is not None and steps >= cfg["horizon"]  # the lr is 0 from here
        stop = member.agree_stop(rank == 0 and (reached is not None
                                                or clock >= config["cap_s"] or ended))
        eval_s += time.monotonic() - start
        eval_cpu_s += time.thread_time() - start_cpu
        if stop:
            break
    clock = time.monotonic() - t0 - eval_s
    # what this (the training) thread computed while the clock ran: steps and syncs; waiting
    # for the network (gloo's threads, platoon's controller) takes none of it
    cpu_s = time.thread_time() - cpu0 - eval_cpu_s
    out = {"rank": rank, "steps": steps, "clock_s": clock, "cpu_s": cpu_s, "step_s": step_s,
           "eval_s": eval_s,
           "reached": reached, "last_metric": last, "trace": trace, "tx_start": tx_start,
           "tx_end": tx_bytes(device), "pid": os.getpid()}
    out.update(member.stats())
    path = os.path.join(config["result_dir"], "rank-%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    member.close()
    if config["kind"] != "platoon":
        sys.stdout.flush()
        os._exit(0)  # skip torch's destructors: a gloo group's teardown once hung


if __name__ == "__main__":
    main(sys.argv)
