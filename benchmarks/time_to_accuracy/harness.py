"""One run of one method in fresh forked processes, timed alike for every method."""

import os
import queue
import shutil
import signal
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass

from platoon import Controller

from .methods import WORLD, Collective, Dataset, member_class, mlp


class StopOnRequest(Controller):
    """A platoon controller answering "next" with "train" until a worker asks to "stop"."""

    stopped = False

    def handle_control(self, req, worker_id, req_info):
        if req == "stop":
            self.stopped = True
            return None
        if req == "next":
            return "stop" if self.stopped else "train"
        raise ValueError("unknown request %r" % (req,))


@dataclass
class Job:
    """One training run of one method, as every process of it sees it."""
    method: str
    cfg: dict
    seed: int
    straggler: bool
    cap_s: float
    dataset: Dataset
    world: int
    address: str = ""  # DDP / local SGD: the tcp:// rendezvous; platoon: the controller



def _own_session(stacks_after_s):
    """Make this forked child die with the benchmark and run in a session of its own: with
    the kernel's autogroup scheduling, CPU is shared fairly between sessions, so under load
    from elsewhere two processes of one session would get the CPU of one. Print every
    thread's stack to stderr if still running after `stacks_after_s` (a hang's diagnosis)."""
    import faulthandler

    from platoon._os.process import die_with_parent
    die_with_parent(signal.SIGKILL)
    os.setsid()
    if stacks_after_s:
        faulthandler.dump_traceback_later(stacks_after_s, exit=False)


def _member_main(job, rank, data, shared_model, barrier, results, stop_event):
    """Body of one forked process: train until rank 0 reaches the target or the cap."""
    forked = time.monotonic()
    _own_session(job.cap_s + 60)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        import torch
        torch.set_num_threads(1)
        problem = job.dataset
        net = shared_model if shared_model is not None else problem.model(job.seed)
        member = member_class(job.method)(job, rank, net)
        member.stop_event, member.barrier = stop_event, barrier
        trained = member.setup()
        optimizer = lambda params: make_optimizer(torch, job.cfg, params)  # noqa: E731
        opt = optimizer(trained.parameters())
        member.use_optimizer(opt)
        schedule = make_schedule(torch, job.cfg, opt)
        step, evaluate = problem.trainer(data, 1000 * job.seed + rank)

        # Warm up on a throwaway copy and measure the compute time of one step.
        spare = problem.model(job.seed + 1)
        spare_opt = optimizer(spare.parameters())
        times = []
        for k in range(8):
            start = time.perf_counter()
            step(spare, spare_opt, k)
            times.append(time.perf_counter() - start)
        evaluate(spare)
        step_s = statistics.median(times[3:])
        delay = step_s if job.straggler and rank == 1 else 0.0
        ready = time.monotonic()
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        eval_s, steps, trace, reached = 0.0, 0, [], None
        every, cap = problem.eval_every, job.cap_s
        while True:
            step(trained, opt, steps)
            steps += 1
            if schedule is not None:
                schedule.step()
            if delay:
                time.sleep(delay)
            go_on = member.after_step(steps)
            if steps % every == 0 or not go_on:
                start = time.monotonic()
                acc = evaluate(member.eval_model())
                clock = start - t0 - eval_s
                if rank == 0:
                    trace.append((round(clock, 4), steps, round(acc, 4)))
                    if reached is None and problem.reached(acc):
                        reached = (clock, steps)
                ended = schedule is not None and steps >= job.cfg["horizon"]  # lr 0 from here
                stop = member.agree_stop(rank == 0 and (reached is not None or clock >= cap
                                                        or ended))
                eval_s += time.monotonic() - start
                if stop or not go_on:
                    break
        clock = time.monotonic() - t0 - eval_s
        out = {"rank": rank, "steps": steps, "clock_s": clock, "step_s": step_s,
               "setup_s": ready - forked, "eval_s": eval_s, "trace": trace,
               "reached": reached}
        out.update(member.stats())
        results.put(("ok", rank, out))
        member.close()
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
    # Exit without running torch's destructors: a gloo group's teardown once hung past its
    # peer's exit. What was put is flushed first.
    results.close()
    results.join_thread()
    os._exit(0)


def make_optimizer(torch, cfg, params):
    """The workers' optimizer: torch SGD(lr, momentum) or, with ``"optimizer": "adamw"``,
    AdamW(lr, weight_decay) (default weight decay 0.01)."""
    if cfg.get("optimizer") == "adamw":
        return torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg.get("weight_decay", 0.01))
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0.0))


def make_schedule(torch, cfg, optimizer):
    """With ``"horizon": N`` in `cfg`, the schedule a transformer is trained with: the lr warms
    up linearly over the first 5% of N steps, then decays linearly to 0 at step N; else None
    (a constant lr)."""
    horizon = cfg.get("horizon")
    if not horizon:
        return None
    warmup = max(1, horizon // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min((k + 1) / warmup, max(0.0, (horizon - k) / (horizon - warmup))))


def _controller_main(conn):
    """A platoon controller (`StopOnRequest`) for one run, in its own session."""
    _own_session(None)
    with StopOnRequest(control_port=0, num_workers=WORLD, transport="ipc") as ctl:
        conn.send(ctl.control_address)
        ctl.serve(timeout_s=300)



def prewarm():
    """Import and initialise in this process what every child would otherwise load lazily
    (torch's first optimizer step imports its compiler stack: seconds), so children start
    in milliseconds."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.functional as F
    from torch.distributed.algorithms.model_averaging import averagers  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401

    import platoon
    for name in ("Controller", "Worker", "EASGD", "Downpour", "SGD", "DiLoCo"):
        getattr(platoon, name)
    torch.set_num_threads(1)
    net = mlp((4, 8, 8, 2), 0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    F.cross_entropy(net(torch.zeros(2, 4)), torch.zeros(2, dtype=torch.int64)).backward()
    opt.step()


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def run_one(ctx, job, data):
    """Run `job` in fresh processes; returns rank 0's result with every rank's stats, or
    {"error": ...}. Start-up is outside the timed window."""
    procs, extra = [], []
    results = ctx.Queue()
    barrier = ctx.Barrier(job.world)
    stop_event = ctx.Event()
    shared = rendezvous = lighthouse = None
    try:
        if job.method == "hogwild":
            shared = job.dataset.model(job.seed)
            shared.share_memory()
        elif issubclass(member_class(job.method), Collective):  # a file store: no port race
            rendezvous = tempfile.mkdtemp(prefix="tta-")
            job.address = "file://" + os.path.join(rendezvous, "store")
        elif job.method == "torchft_diloco":
            from .torchft_diloco import start_lighthouse
            lighthouse, job.address = start_lighthouse(job.world)
        elif job.method.startswith("platoon_"):
            mine, theirs = ctx.Pipe()
            ctl = ctx.Process(target=_controller_main, args=(theirs,), daemon=True)
            ctl.start()
            extra.append(ctl)
            if not mine.poll(60):
                raise RuntimeError("the platoon controller did not start within 60 s")
            job.address = mine.recv()
        for rank in range(job.world):
            p = ctx.Process(target=_member_main, daemon=True,
                            args=(job, rank, data, shared, barrier, results, stop_event))
            p.start()
            procs.append(p)
        got = {}
        deadline = time.monotonic() + job.cap_s + 120
        while len(got) < job.world:
            try:
                kind, rank, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if r not in got and p.exitcode is not None]
                if dead:
                    raise RuntimeError("%s rank %d exited with code %s without a result" % (
                        job.method, dead[0][0], dead[0][1])) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("%s did not finish within %.0f s of its %.0f s cap "
                                       "(stacks on stderr)" % (job.method, 120, job.cap_s)
                                       ) from None
                continue
            if kind == "error":
                raise RuntimeError("%s rank %d failed:\n%s" % (job.method, rank, value))
            got[rank] = value
        end = time.monotonic() + 10  # then _stop ends whatever still runs
        for p in procs + extra:
            p.join(max(0.1, end - time.monotonic()))
    except RuntimeError as exc:
        return {"error": str(exc)}
    finally:
        _stop(procs + extra)
        if lighthouse is not None:
            lighthouse.kill()
            lighthouse.wait(10)
        if rendezvous:
            shutil.rmtree(rendezvous, ignore_errors=True)
    out = dict(got[0])
    out["ranks"] = [{k: v for k, v in got[r].items() if k != "trace"} for r in sorted(got)]
    return out

