"""One run of one member of the fault race: three nodes on three shaped links, the fault
schedule applied (kill -9 of a node's processes, its start again), until a node's evaluation
reaches the target or the cap; then its events are read, accounted and everything is removed.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .._util import ROOT, SINGLE_THREAD_ENV
from ..slow_link.jobs import clean_shm, stop_session
from . import hosts as net
from .schedule import NODES, Incarnation, account

CONTROLLER = os.path.join(ROOT, "benchmarks", "elastic_faults", "controller.py")
LIGHTHOUSE_PORT = 29510
READY_TIMEOUT_S = 30.0
POLL_S = 0.1
FIRST_CONTRIBUTION = re.compile(r"node \w+: first contributing round ([\d.]+) s after its start")
HEALED = re.compile(r"node \w+: healed from \w+ in quorum \d+ \(outer round \d+\), ([\d.]+) s")
ON_THE_WAY = re.compile(r"node \w+: first contributing round ([\d.]+) s after its start "
                        r"\(.*on the way: ([^)]*)\)")


def on_the_way(log_text):
    """(seconds from the node's start to its first contributing round, {milestone: seconds
    from its start} on the way there: centre, heartbeating, group, healed), from an elastic
    node's log; (None, {}) when it made none."""
    found = ON_THE_WAY.search(log_text or "")
    if not found:
        return None, {}
    steps = {}
    for item in found.group(2).split(", "):
        name, _, value = item.partition(" ")
        try:
            steps[name] = float(value.split()[0])
        except (IndexError, ValueError):
            pass
    return float(found.group(1)), steps


SLOWDOWN = 2.0  # a throttled node's worker: its steps take this many times as long


@dataclass(frozen=True)
class Member:
    """`kind`: "elastic" (python -m platoon.elastic.node per node, its lighthouse on the
    switch), "mpi" (one fixed-world python -m platoon.mpi job across the three nodes, restarted
    whole from its nodes' checkpoints after each fault) or "torchft" (one replica group per
    node, torchft's lighthouse on the switch); `faults`: whether the schedule is applied;
    `outer`: platoon's tie across nodes, "diloco" (its outer step) or "easgd"; `slow`: the
    node whose worker is throttled `SLOWDOWN`x (it sleeps after each step (SLOWDOWN - 1)x as
    long as the step took: a slower machine, whatever the load), "" for equal nodes;
    `equal`: the all-equal member its report compares it against."""
    kind: str
    faults: bool
    note: str = ""
    outer: str = "diloco"
    slow: str = ""
    equal: str = ""

    def slowdown(self):
        """{node: factor} for the workers' config (empty for equal nodes)."""
        return {self.slow: SLOWDOWN} if self.slow else {}



MEMBERS = {
    "elastic": Member("elastic", False, "platoon elastic, no faults"),
    "elastic_faults": Member("elastic", True, "platoon elastic, faults"),
    "elastic_slow": Member("elastic", False, "platoon elastic, no faults, node c's worker "
                           "%gx slower" % SLOWDOWN, slow="c", equal="elastic"),
    "mpi": Member("mpi", False, "fixed-world python -m platoon.mpi, no faults"),
    "mpi_slow": Member("mpi", False, "fixed-world python -m platoon.mpi, no faults, node c's "
                       "worker %gx slower" % SLOWDOWN, slow="c", equal="mpi"),
    "mpi_faults": Member("mpi", True, "fixed-world python -m platoon.mpi, faults, each time "
                         "restarted whole from its nodes' last checkpoints"),
    "torchft_faults": Member("torchft", True, "torchft DiLoCo (0.2.0), faults"),
    "elastic_easgd": Member("elastic", False, "platoon elastic, EASGD across nodes, no faults",
                            "easgd"),
    "elastic_easgd_faults": Member("elastic", True, "platoon elastic, EASGD across nodes, "
                                   "faults", "easgd"),
    "mpi_easgd_faults": Member("mpi", True, "fixed-world python -m platoon.mpi, EASGD across "
                               "nodes, faults, each time restarted whole from its nodes' last "
                               "checkpoints", "easgd"),
}


@dataclass(frozen=True)
class Settings:
    """What every member shares: the tie (platoon's DiLoCo outer step, `tie_every_s`,
    `compress`; torchft: a sync every `sync_every` steps, the same outer SGD), the
    heartbeat timeout of both lighthouses, the fixed-world job's checkpoint period."""
    tie_every_s: float = 1.0
    compress: str = "int8"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    beta: float = 0.5
    sync_every: int = 20
    heartbeat_timeout_s: float = 5.0
    timeout_s: float = 30.0
    min_nodes: int = 2
    checkpoint_every_s: float = 5.0

    def platoon_tie(self, outer="diloco"):
        rule = ["--tie-outer-lr", "%g" % self.outer_lr, "--tie-outer-momentum",
                "%g" % self.outer_momentum] if outer == "diloco" \
            else ["--tie-beta", "%g" % self.beta]
        return ["--tie-every-s", "%g" % self.tie_every_s, "--tie-compress", self.compress,
                "--tie-outer", outer] + rule


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", **SINGLE_THREAD_ENV)
    env.update(extra)
    return env


def _worker(config_path, incarnation):
    return [sys.executable, "-m", "benchmarks.elastic_faults.worker", config_path,
            str(incarnation)]


def lighthouse_command(kind, settings, secret_file=None):
    """The lighthouse of an elastic or torchft run, on the switch (None for MPI)."""
    bind = "%s:%d" % (net.SWITCH_IP, LIGHTHOUSE_PORT)
    if kind == "elastic":
        return [sys.executable, "-m", "platoon.elastic.lighthouse", "--min-nodes",
                str(settings.min_nodes), "--heartbeat-timeout-s",
                "%g" % settings.heartbeat_timeout_s, "--bind", bind, "--secret-file", secret_file]
    if kind == "torchft":
        exe = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable)) \
            or shutil.which("torchft_lighthouse")
        if exe is None:
            raise RuntimeError("torchft is not installed: pip install torchft==0.2.0")
        return [exe, "--min_replicas", str(settings.min_nodes), "--quorum_tick_ms", "100",
                "--join_timeout_ms", "10000", "--heartbeat_timeout_ms",
                "%d" % (1000 * settings.heartbeat_timeout_s), "--bind", bind]
    return None


def node_commands(kind, settings, config_path, events_dir, checkpoint_dir, incarnation,
                  hosts, mpiexec, secret_file=None, nodes=NODES, outer="diloco", worker=None):
    """[(node or None for the whole job, argv, extra environment)] that start `nodes` (all
    three for MPI: its job restarts whole) at `incarnation`, platoon's nodes tied by
    `outer`; `worker(node, incarnation)`: an elastic node's worker command (default: the
    race's own worker), each node then given its slot."""
    controller = ["--controller", CONTROLLER, "--controller-args"]
    if kind == "mpi":
        argv = hosts.mpiexec(mpiexec) + [
            sys.executable, "-m", "platoon.mpi", "--workers", "1"] + controller + [
            "%s %d %s %g" % (events_dir, incarnation, checkpoint_dir,
                             settings.checkpoint_every_s)] + settings.platoon_tie(outer) + [
            "--"] + _worker(config_path, incarnation)
        return [(None, argv, dict(net.MPI_TCP_ENV))]
    out = []
    for node in nodes:
        if kind == "elastic":
            argv = hosts.prefix(node) + [
                sys.executable, "-m", "platoon.elastic.node", "--join",
                "%s:%d" % (net.SWITCH_IP, LIGHTHOUSE_PORT), "--name", node,
                "--host", net.ip_of(node), "--secret-file", secret_file,
                "--tie-timeout-s", "%g" % settings.timeout_s] + (
                # a script's data split by its node's slot (`platoon.shard`)
                ["--slot", str(NODES.index(node)), "--slots", str(len(NODES))] if worker
                else []) + controller + [
                "%s %d" % (events_dir, incarnation)] + settings.platoon_tie(outer) + [
                "--"] + (worker(node, incarnation) if worker else
                         _worker(config_path, incarnation))
            out.append((node, argv, {"GLOO_SOCKET_IFNAME": net.DEVICE}))
        else:
            out.append((node, hosts.prefix(node) + _worker(config_path, incarnation),
                        {"GLOO_SOCKET_IFNAME": net.DEVICE}))
    return out


def _read_events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except OSError:
        pass
    return out


def _wait_listening(hosts, deadline_s, proc):
    """Wait until the lighthouse on the switch accepts connections."""
    end = time.monotonic() + deadline_s
    probe = hosts.switch_prefix() + [sys.executable, "-c",
                                     "import socket; socket.create_connection((%r, %d), 1)"
                                     % (net.SWITCH_IP, LIGHTHOUSE_PORT)]
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("the lighthouse exited with code %s" % proc.returncode)
        if subprocess.run(probe, capture_output=True, timeout=10).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("the lighthouse did not listen within %.0f s" % deadline_s)


class Run:
    """The processes of one run and what is known about them."""

    def __init__(self, member, settings, hosts, workdir, config_path, mpiexec, secret_file,
                 worker=None):
        self.member, self.settings, self.hosts = member, settings, hosts
        self.worker = worker  # an elastic node's worker command (`node_commands`)
        self.workdir, self.config_path = workdir, config_path
        self.events_dir = os.path.join(workdir, "events")
        self.checkpoint_dir = os.path.join(workdir, "checkpoints")
        os.makedirs(self.events_dir)
        os.makedirs(self.checkpoint_dir)
        self.mpiexec, self.secret_file = mpiexec, secret_file
        self.procs = []  # (Popen, log file)
        self.incarnations = {}  # (node, index) -> Incarnation
        self.current = {n: -1 for n in NODES}

    def start(self, nodes):
        """Start `nodes` (MPI: the whole job) at their next incarnation."""
        if self.member.kind == "mpi":
            nodes = NODES
        index = max(self.current[n] for n in nodes) + 1
        for node in nodes:
            self.current[node] = index
        commands = node_commands(self.member.kind, self.settings, self.config_path,
                                 self.events_dir, self.checkpoint_dir, index, self.hosts,
                                 self.mpiexec, self.secret_file, nodes, self.member.outer,
                                 self.worker)
        now = time.time()
        for node in nodes:
            self.incarnations[node, index] = Incarnation(node, now)
        for node, argv, extra in commands:
            log = open(os.path.join(self.workdir, "%s-%d.log" % (node or "job", index)), "w")
            self.procs.append((subprocess.Popen(
                argv, cwd=ROOT, env=_env(PLATOON_JOB_ID="efr%d" % os.getpid(), **extra),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True), log))

    def kill(self, node):
        """kill -9 `node`'s processes (MPI: the job then ends; what is left of it is killed
        when it restarts)."""
        now = time.time()
        self.hosts.kill_node(node)
        ended = NODES if self.member.kind == "mpi" else (node,)
        for n in ended:
            self.incarnations[n, self.current[n]].ended = now

    def restart(self, node):
        if self.member.kind == "mpi":
            for n in NODES:  # what mpiexec left of the job
                self.hosts.kill_node(n)
        self.start([node])

    def reached(self, target):
        """(time, node, metric) of the first evaluation at or below `target`, or None."""
        best = None
        for path in glob.glob(os.path.join(self.events_dir, "*-worker.jsonl")):
            for ev in _read_events(path):
                if ev["ev"] == "eval" and ev["metric"] <= target:
                    if best is None or ev["began"] < best[0]:
                        best = (ev["began"], os.path.basename(path).split("-")[0], ev["metric"])
        return best

    def best_metric(self):
        metrics = [ev["metric"] for path in glob.glob(os.path.join(self.events_dir,
                                                                   "*-worker.jsonl"))
                   for ev in _read_events(path) if ev["ev"] == "eval"]
        return min(metrics, default=None)

    def collect(self):
        """The incarnations with their events."""
        for (node, index), inc in self.incarnations.items():
            worker = _read_events(os.path.join(self.events_dir, "%s-%d-worker.jsonl"
                                               % (node, index)))
            ctl = _read_events(os.path.join(self.events_dir, "%s-%d-controller.jsonl"
                                            % (node, index)))
            inc.steps = [(e["t"], e["n"]) for e in worker if e["ev"] == "steps"]
            loaded = next((e for e in worker if e["ev"] == "loaded"), {})
            inc.loaded, inc.worker_started = loaded.get("t"), loaded.get("process_started")
            inc.trained_from = next((e["t"] for e in worker if e["ev"] == "start"), None)
            progress = [e for e in worker if e["ev"] == "steps" and e["n"]]
            inc.step_s = progress[-1]["cpu"] / progress[-1]["n"] if progress else None
            if self.member.kind == "torchft":
                inc.rounds = [e["t"] for e in worker if e["ev"] == "commit"]
            else:
                inc.rounds = [e["t"] for e in ctl if e["ev"] == "round"]
            if self.member.kind == "mpi":
                inc.checkpoints = [e["mtime"] for e in ctl if e["ev"] == "checkpoint"]
            if self.member.kind == "elastic":
                path = os.path.join(self.workdir, "%s-%d.log" % (node, index))
                try:
                    with open(path) as f:
                        text = f.read()
                except OSError:
                    text = ""
                found, healed = FIRST_CONTRIBUTION.search(text), HEALED.search(text)
                inc.first_contribution_s = float(found.group(1)) if found else None
                inc.healed_s = float(healed.group(1)) if healed else None
                inc.on_the_way = on_the_way(text)[1] or None
        return list(self.incarnations.values())

    def stop_all(self):
        while self.procs:
            proc, log = self.procs.pop()
            stop_session(proc, grace_s=2.0)
            log.close()

    def tail(self, n=3000):
        out = []
        for path in sorted(glob.glob(os.path.join(self.workdir, "*.log"))):
            with open(path, errors="replace") as f:
                out.append("== %s\n%s" % (os.path.basename(path), f.read()[-n:]))
        return "\n".join(out)


def tear_down(run, lighthouse, lighthouse_log, hosts, shm_before, workdir, log):
    """Stop what a run started (its nodes, its lighthouse and log, its namespaces; each None
    where it was not started), remove its work directory (kept with ELASTIC_FAULTS_KEEP set);
    the /dev/shm entries it left (removed)."""
    if run is not None:
        run.stop_all()
    if lighthouse is not None:
        stop_session(lighthouse, grace_s=2.0)
    if lighthouse_log is not None:
        lighthouse_log.close()
    if hosts is not None:
        hosts.close()
    left = clean_shm(shm_before, "efr%d" % os.getpid())
    if os.environ.get("ELASTIC_FAULTS_KEEP"):
        log("kept %s" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return left


def run_member(name, problem, cfg, settings, schedule, seed, cap_s, rate_bits_s, mpiexec,
               log, tag=""):
    """Race member `name` once; returns its row (with "error" when it failed)."""
    from platoon.elastic import generate_secret
    member = MEMBERS[name]
    faults = list(schedule) if member.faults else []
    workdir = tempfile.mkdtemp(prefix="slk%d-efr-" % os.getpid())
    row = {"member": name, "kind": member.kind, "faults_on": member.faults, "seed": seed,
           "cap_s": cap_s, "slowdown": member.slowdown(), "equal": member.equal,
           "load_before": os.getloadavg()[0]}
    shm_before = set(glob.glob("/dev/shm/*"))
    hosts = run = lighthouse = lighthouse_log = None
    started = time.monotonic()
    try:
        hosts = net.Hosts(rate_bits_s, tag).__enter__()
        secret = generate_secret(os.path.join(workdir, "secret"))
        config = {"kind": member.kind, "problem": problem, "cfg": cfg, "seed": seed,
                  "events_dir": os.path.join(workdir, "events"),
                  "node_ips": {n: net.ip_of(n) for n in NODES},
                  "lighthouse": "http://%s:%d" % (net.SWITCH_IP, LIGHTHOUSE_PORT),
                  "min_nodes": settings.min_nodes, "timeout_s": settings.timeout_s,
                  "slowdown": member.slowdown(),
                  "deadline": time.time() + cap_s + 120}
        config_path = os.path.join(workdir, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        run = Run(member, settings, hosts, workdir, config_path, mpiexec, secret)
        command = lighthouse_command(member.kind, settings, secret)
        if command:
            lighthouse_log = open(os.path.join(workdir, "lighthouse.out"), "w")
            lighthouse = subprocess.Popen(hosts.switch_prefix() + command, cwd=ROOT,
                                          env=_env(), stdout=lighthouse_log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
            _wait_listening(hosts, READY_TIMEOUT_S, lighthouse)
        tx_before = hosts.tx_bytes()
        t0 = time.time()
        run.start(NODES)
        pending = sorted([(f.kill_s, "kill", f.node) for f in faults]
                         + [(f.restart_s, "restart", f.node) for f in faults])
        done, reached = [], None
        while time.time() - t0 < cap_s:
            now = time.time() - t0
            while pending and pending[0][0] <= now:
                _, what, node = pending.pop(0)
                (run.kill if what == "kill" else run.restart)(node)
                done.append((round(now, 2), what, node))
                log("  %.1f s: %s %s" % (now, what, node))
            reached = run.reached(problem["target"])
            if reached:
                break
            time.sleep(POLL_S)
        end = reached[0] if reached else t0 + cap_s
        tx_after = hosts.tx_bytes()
        run.stop_all()
        incarnations = run.collect()
        row.update(account(incarnations, t0, end, kills=[(t0 + at, node) for at, what, node
                                                          in done if what == "kill"]))
        row.update({
            "reached": reached is not None,
            "time_s": reached[0] - t0 if reached else None,
            "run_s": round(end - t0, 3),
            "reached_by": reached[1] if reached else None,
            "best_metric": run.best_metric(), "target": problem["target"],
            "faults": done,
            "bytes": {n: tx_after[n] - tx_before[n] for n in NODES},
            "incarnations": [{"node": i.node, "started_s": round(i.started - t0, 3),
                              "ended_s": None if i.ended is None else round(i.ended - t0, 3),
                              "steps": i.steps[-1][1] if i.steps else 0,
                              "rounds": len(i.rounds or ()),
                              "checkpoints": None if i.checkpoints is None
                              else len(i.checkpoints)}
                             for i in incarnations]})
        row["bytes_total"] = sum(row["bytes"].values())
        if not any(i["steps"] for i in row["incarnations"]):
            raise RuntimeError("no worker made a step")
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        row["error"] = "%s: %s" % (type(exc).__name__, exc)
        row["output_tail"] = run.tail() if run is not None else ""
        log("FAILED %s: %s\n%s" % (name, row["error"], row["output_tail"][-6000:]))
    finally:
        row["left_in_shm"] = tear_down(run, lighthouse, lighthouse_log, hosts, shm_before,
                                       workdir, log)
        row["wall_s"] = time.monotonic() - started
    return row
