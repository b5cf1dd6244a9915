"""One worker of the fault race, on one node: a platoon worker (under an elastic node or a
fixed-world `python -m platoon.mpi` rank) or one torchft replica group (its own process).

usage: python -m benchmarks.elastic_faults.worker CONFIG INCARNATION

The node is the host's name ("nodea" -> "a"). Trains the slow-link language model (its LSTM,
SGD with momentum) until the config's deadline or until the race kills it, and appends its
events to EVENTS_DIR/NODE-INCARNATION-worker.jsonl as it goes (one write a line, so a kill -9
loses none it wrote). A node named in the config's "slowdown" ({node: factor}) is throttled:
its worker sleeps after each step (factor - 1)x as long as the step took (a slower machine,
whatever the load). Events: "loaded" (imports, corpus and model done), "start" (its centre or
torchft's state in place), "steps" (every sync, with the CPU seconds this thread spent in
steps and syncs so far), "eval" (the metric
of the node's centre, or of torchft's model, every `eval_every` steps; its time is when the
evaluation began), "commit" (torchft: a committed outer step).
"""

import json
import os
import socket
import sys
import time
from datetime import timedelta

from benchmarks.time_to_accuracy.torchft_diloco import TorchftReplica


class Events:
    """Appends JSON lines to a file, each in one write."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, ev, **fields):
        fields.update(ev=ev, t=time.time())
        os.write(self.fd, (json.dumps(fields) + "\n").encode())


class PlatoonMember:
    """A platoon worker: EAMSGD into its node's centre every `tau` steps; evaluates the node
    centre."""

    def __init__(self, config, model, problem, events):
        from benchmarks.time_to_accuracy.methods import RULES
        from platoon import Worker
        self.cfg, self.model, self.problem = config["cfg"], model, problem
        self.worker = Worker(timeout_s=120)
        self.worker.init_shared_params([p.detach().numpy() for p in model.parameters()],
                                       RULES[self.cfg["rule"]](self.cfg))
        self.centre = problem.model(0)

    def use_optimizer(self, optimizer):
        pass

    def after_step(self, step):
        if step % self.cfg["tau"]:
            return False
        self.worker.sync_params()
        return True

    def eval_model(self):
        import torch
        with self.worker.lock(timeout_s=60), torch.no_grad():
            for p, c in zip(self.centre.parameters(), self.worker.shared_params):
                p.copy_(torch.from_numpy(c))
        return self.centre

    def stopped(self):
        return self.worker.stop_requested


class TorchftMember(TorchftReplica):
    """One torchft replica group (world size 1): DiLoCo over gloo with the torchft
    lighthouse of the config, its TCPStore hosted here (torchft connects to one)."""

    def __init__(self, config, model, problem, events):
        import torch.distributed as dist
        from torchft import Manager, ProcessGroupGloo
        self.cfg, self.model, self.events = config["cfg"], model, events
        host = config["node_ip"]
        # torchft's checkpoint server (healing) advertises the host's name, which only the
        # host itself resolves here: advertise its address
        socket.gethostname = lambda: host
        self.store = dist.TCPStore(host, 0, 1, is_master=True, timeout=timedelta(seconds=60))
        self.pg = ProcessGroupGloo(timeout=timedelta(seconds=config["timeout_s"]))
        self.opt = None
        self.manager = Manager(
            pg=self.pg, min_replica_size=config["min_nodes"], use_async_quorum=False,
            load_state_dict=self._load, state_dict=self._state, replica_id=config["node"],
            store_addr=host, store_port=self.store.port, rank=0, world_size=1,
            hostname=host, lighthouse_addr=config["lighthouse"],
            timeout=timedelta(seconds=config["timeout_s"]),
            quorum_timeout=timedelta(seconds=60), connect_timeout=timedelta(seconds=30))
        should_commit = self.manager.should_commit

        def counted(*args, **kwargs):  # a committed outer step: this group contributed
            ok = should_commit(*args, **kwargs)
            if ok:
                events("commit", outer=self.manager.current_step())
            return ok
        self.manager.should_commit = counted
        self.diloco = None

    def use_optimizer(self, optimizer):
        self.start_diloco(optimizer, self.cfg["outer_lr"], self.cfg["outer_momentum"],
                          self.cfg["sync_every"])

    def after_step(self, step):
        return step % 4 == 0

    def eval_model(self):
        return self.model

    def stopped(self):
        return False


def main(argv):
    with open(argv[1]) as f:
        config = json.load(f)
    incarnation = int(argv[2])
    node = socket.gethostname().replace("node", "", 1)
    config["node"] = node
    config["node_ip"] = config.get("node_ips", {}).get(node, "127.0.0.1")
    events = Events(os.path.join(config["events_dir"], "%s-%d-worker.jsonl" % (node, incarnation)))
    import torch

    from benchmarks.language_model.problem import Text
    from benchmarks.time_to_accuracy.harness import make_optimizer
    torch.set_num_threads(1)
    problem = Text(**config["problem"])
    cfg = config["cfg"]
    data = problem.load()
    model = problem.model(config["seed"])
    kind = {"torchft": TorchftMember}.get(config["kind"], PlatoonMember)
    from platoon.elastic.node import process_start_time
    # imports, corpus and model done; and when this process started (under a node or mpiexec:
    # after their own start-up)
    events("loaded", process_started=process_start_time())
    member = kind(config, model, problem, events)
    opt = make_optimizer(torch, cfg, model.parameters())
    member.use_optimizer(opt)
    # each node its own stream of minibatches; a restarted node a fresh one
    step, evaluate = problem.trainer(data, 1000 * config["seed"] + 10 * incarnation
                                     + "abc".index(node))
    throttle = config.get("slowdown", {}).get(node, 1.0) - 1.0
    events("start", pid=os.getpid(), slowdown=throttle + 1.0)
    steps, eval_cpu, cpu0 = 0, 0.0, time.thread_time()
    while time.time() < config["deadline"] and not member.stopped():
        began = time.perf_counter()
        step(model, opt, steps)
        if throttle > 0:  # a slower machine (a sleep: not in thread_time, not in "cpu")
            time.sleep(throttle * (time.perf_counter() - began))
        steps += 1
        if member.after_step(steps):  # cpu: this thread's CPU seconds in steps and syncs
            events("steps", n=steps, cpu=time.thread_time() - cpu0 - eval_cpu)
        if steps % problem.eval_every == 0:
            start, start_cpu = time.time(), time.thread_time()
            metric = evaluate(member.eval_model())
            events("eval", n=steps, metric=metric, began=start)
            eval_cpu += time.thread_time() - start_cpu
    sys.stdout.flush()
    os._exit(0)  # the race ends its processes; skip torch's and gloo's teardown


if __name__ == "__main__":
    main(sys.argv)
