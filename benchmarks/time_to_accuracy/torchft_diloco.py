"""torchft's DiLoCo as a benchmark member: each process is one replica group (its own
TCPStore, world size 1) of a torchft job whose lighthouse `run_one` starts; the inner
optimizer is the method's own (AdamW or SGD), the outer one SGD(outer_lr, momentum 0.9,
Nesterov), a sync every `sync_every` inner steps over gloo. Needs `pip install torchft`."""

import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta

from .member import Member


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lighthouse_command(port, replicas):
    """The torchft lighthouse for a fault-free race: a quorum of every replica group, a tick
    every 100 ms, its default 5 s heartbeat timeout."""
    exe = shutil.which("torchft_lighthouse", path=sys.exec_prefix + "/bin") or shutil.which(
        "torchft_lighthouse")
    if exe is None:
        raise RuntimeError("torchft is not installed: pip install torchft==0.2.0")
    return [exe, "--min_replicas", str(replicas), "--quorum_tick_ms", "100",
            "--join_timeout_ms", "10000", "--bind", "127.0.0.1:%d" % port]


def start_lighthouse(replicas):
    """(the lighthouse's Popen, its http address); it answers once it listens."""
    port = free_port()
    proc = subprocess.Popen(lighthouse_command(port, replicas), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the torchft lighthouse exited with code %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, "http://127.0.0.1:%d" % port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the torchft lighthouse did not listen within 30 s")


class TorchftReplica:
    """What the benchmarks' torchft members share: the state torchft heals a replica group
    with (`model`, `opt`) and its DiLoCo around the inner optimizer (`manager` set first)."""

    model = opt = manager = diloco = None

    def _state(self):
        return {"model": self.model.state_dict(),
                "optimizer": self.opt.state_dict() if self.opt is not None else {}}

    def _load(self, state):
        self.model.load_state_dict(state["model"])
        if self.opt is not None and state["optimizer"]:
            self.opt.load_state_dict(state["optimizer"])

    def start_diloco(self, optimizer, outer_lr, outer_momentum, sync_every):
        """DiLoCo over `optimizer`, its outer step SGD(outer_lr, Nesterov outer_momentum)."""
        import torch
        from torchft.local_sgd import DiLoCo
        self.opt = optimizer
        outer = torch.optim.SGD(self.model.parameters(), lr=outer_lr,
                                momentum=outer_momentum, nesterov=True)
        self.diloco = DiLoCo(self.manager, [self.model], optimizer, outer,
                             sync_every=sync_every, pin_memory=False).__enter__()


class TorchftDiLoCo(TorchftReplica, Member):
    """One replica group of torchft's DiLoCo. Stopping: rank 0's decision is shared through
    the run's event and a barrier at every evaluation (both ranks evaluate at the same steps,
    right after a sync when `eval_every` is a multiple of `sync_every`)."""

    def setup(self):
        import torch.distributed as dist
        from torchft import Manager, ProcessGroupGloo
        self.store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True,
                                   timeout=timedelta(seconds=60))
        self.pg = ProcessGroupGloo(timeout=timedelta(seconds=30))
        self.manager = Manager(
            pg=self.pg, min_replica_size=self.job.world, use_async_quorum=False,
            load_state_dict=self._load, state_dict=self._state, replica_id=str(self.rank),
            store_addr="127.0.0.1", store_port=self.store.port, rank=0, world_size=1,
            lighthouse_addr=self.job.address, timeout=timedelta(seconds=30),
            quorum_timeout=timedelta(seconds=60), connect_timeout=timedelta(seconds=30))
        self.diloco = self.opt = None
        return self.model

    def use_optimizer(self, optimizer):
        cfg = self.job.cfg
        self.start_diloco(optimizer, cfg.get("outer_lr", 0.7), 0.9, cfg["sync_every"])

    def agree_stop(self, stop):
        if stop:
            self.stop_event.set()
        self.barrier.wait(timeout=120)
        return self.stop_event.is_set()

    def stats(self):
        return {"outer_steps": self.manager.current_step()}

    def close(self):
        if self.diloco is not None:
            self.diloco.__exit__(None, None, None)
        self.manager.shutdown(wait=False)
