"""``platoon-launcher --hosts H1 H2 ... --elastic``: an elastic job's lighthouse and nodes.

The launcher starts the job's lighthouse (``python -m platoon.elastic.lighthouse``, with a new
secret written 0600 to the log directory), or joins a running one (``--join``), then one node
runner per host (``python -m platoon.elastic.node``), each under an ``mpiexec`` of its own
(``-hosts H -n 1``): one failure domain per host, so a node that dies ends only its own
mpiexec, and the other nodes go on. A node that fails is reported and, with ``--restart N``,
started again under its name: it rejoins and is healed from a live node. The job ends when
every node has ended; the lighthouse, the nodes and the job's shared memory are stopped and
removed however it ends. Each process's command line is made from its settings object
(`LighthouseSettings`, `ElasticNodeSettings`); each tells the launcher how it is doing through
a status file in the log directory (``LABEL.status.json``: the lighthouse's quorum, each node's
state and final result), which the status line and the summary are made from. A node on another
machine writes its file there; the lighthouse's file also holds what each node last told it
(its state, its final result), which the summary takes for a node whose own file is not here.
"""

import dataclasses
import datetime
import ipaddress
import os
import socket
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .._os.elasticsettings import ElasticNodeSettings, LighthouseSettings
from .._os.environment import JobEnvironment, without_job_variables
from .._os.jobsecret import generate_secret
from .._os.nodesettings import EXIT_REFUSED
from .._os.process import find_mpiexec, read_announcement, stop, unlink_job_segments
from .._os.statusfile import final_result_text, quorum_text, read_status
from .supervision import EXIT_FAILED, EXIT_OK, Launch, Process, UsageError, make_private_dirs

SECRET_FILE = "elastic.secret"  # the job's new secret, in the log directory
ACROSS_MACHINES = "docs/multi-node.md, \"Across machines (over ssh)\""
# What mpiexec (its ssh, its proxy) says in a node's log when it cannot start the node on its
# host, and what to do: (text in the log, advice for host %s)
REMOTE_START_TROUBLE = (
    ("Host key verification failed", "ssh does not know host %s's key: add it to your known "
     "hosts (ssh to it once by hand), or give ssh a config of the job's own through "
     "HYDRA_LAUNCHER_EXTRA_ARGS=\"-F PATH\""),
    ("Permission denied", "ssh to host %s was refused: put your public key in its authorized "
     "keys (mpiexec's ssh cannot ask for a password or a passphrase)"),
    ("unable to connect to server", "host %s could not connect back to this machine's mpiexec "
     "at this machine's hostname: set HYDRA_IFACE to the interface whose address the hosts "
     "reach (and give --lighthouse ADDRESS:0)"),
)


def node_names(hosts: Sequence[str]) -> List[str]:
    """Each node's name (its stable slot: its data shard, the name it rejoins under): its
    host, or HOST-1, HOST-2, ... for a host given more than once."""
    return [host if hosts.count(host) == 1 else "%s-%d" % (host, hosts[:i + 1].count(host))
            for i, host in enumerate(hosts)]


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.")


def lighthouse_address(given: Optional[str], hosts: Sequence[str]) -> Tuple[str, str]:
    """(where the lighthouse binds, the address the nodes join) for --lighthouse `given`
    ("HOST:PORT"; port 0 picks a free one). Without it: 127.0.0.1 when every host is this
    machine, else this machine's hostname, on a free port. A HOST that is not an IP address
    is joined by name and bound on every interface."""
    if given is None:
        given = "127.0.0.1:0" if all(is_loopback(h) for h in hosts) \
            else "%s:0" % socket.gethostname()
    host, _, port = given.rpartition(":")
    try:
        ipaddress.ip_address(host)
        bind = given
    except ValueError:
        bind = "0.0.0.0:" + port
    return bind, given


def elastic_node_arguments(host: str, settings: ElasticNodeSettings,
                           worker_command: Sequence[str],
                           python: str = sys.executable) -> List[str]:
    """mpiexec's arguments for an elastic job's node: one rank on `host` runs
    ``python -m platoon.elastic.node`` with `settings` (`ElasticNodeSettings.to_argv`), then
    ``--`` and `worker_command`."""
    return (["-hosts", host, "-n", "1", python, "-m", "platoon.elastic.node"]
            + settings.to_argv() + ["--"] + list(worker_command))


def remote_start_advice(host: str, log_text: str) -> Optional[str]:
    """What to do about node on `host` whose log `log_text` says mpiexec could not start it
    there (ssh refused, or the host could not connect back); None if it says no such thing."""
    for said, advice in REMOTE_START_TROUBLE:
        if said in log_text:
            return "%s; see %s" % (advice % host, ACROSS_MACHINES)
    return None


class ElasticLaunch(Launch):
    """An elastic job across `args.hosts`: its lighthouse (unless --join) and one node runner
    per host, watched, restarted (--restart), summed up and torn down."""

    def __init__(self, args, out=sys.stdout):
        super().__init__(args, out)
        self.lighthouse: Optional[Process] = None  # the latest of `lighthouses`
        self.lighthouses: List[Process] = []  # every lighthouse process, restarts included
        self.names = node_names(args.hosts)
        self.nodes: Dict[str, Process] = {}  # each node's latest process
        self.started_nodes: List[Process] = []  # every node process, restarts included
        self._ended: Dict[Process, str] = {}  # node process -> how it ended, as said
        self._lighthouse_port: Optional[str] = None
        self.join = ""  # the lighthouse's address, as the nodes join it

    def started(self):
        return self.lighthouse is not None or bool(self.started_nodes)

    # -- starting ------------------------------------------------------------------------
    def run_elastic(self, worker_script, controller_script):
        """Start the lighthouse (or join one) and the nodes; supervise; the exit code."""
        args = self.args
        mpiexec = find_mpiexec()
        if mpiexec is None:
            raise UsageError("--hosts needs mpiexec: pip install mpi4py mpich (in platoon's "
                             "clone: pip install -e '.[mpi]')")
        self.mpiexec = mpiexec
        self.log_dir_fd = make_private_dirs(self.log_dir)
        if args.secret_file:
            self.secret_file = os.path.abspath(args.secret_file)
        else:
            try:
                self.secret_file = generate_secret(os.path.abspath(
                    os.path.join(self.log_dir, SECRET_FILE)))
            except FileExistsError:
                raise UsageError("log directory %s already holds a job's secret; choose "
                                 "another --log-dir or remove it" % self.log_dir) from None
        self.say("job %s: logs in %s" % (self.job_id, self.log_dir))
        if args.join:
            self.join = args.join
            self.say("joining the lighthouse at %s" % self.join)
        else:
            bind, self.join = lighthouse_address(args.lighthouse, args.hosts)
            address = self.start_lighthouse(bind)
            if address is None:
                return self._not_started()
            self._lighthouse_port = address.rpartition(":")[2]
            self.join = "%s:%s" % (self.join.rpartition(":")[0], self._lighthouse_port)
            self.say("lighthouse at %s (min nodes %d, heartbeat timeout %g s), secret %s"
                     % (self.join, args.membership.min_nodes,
                        args.membership.heartbeat_timeout_s, self.secret_file))
        self.node = dataclasses.replace(
            args.node, controller=controller_script,
            controller_args=args.controller_args if controller_script else "")
        self.worker_command = [worker_script] + args.worker_argv
        for name, host in zip(self.names, args.hosts):
            self.start_node(name, host)
        tie = self.node.tie
        self.say("%d node(s) (%s), %d worker(s) each, an outer round every %g s in %s%s"
                 % (len(self.names), ", ".join(
                     name if name == host else "%s on %s" % (name, host)
                     for name, host in zip(self.names, args.hosts)), args.workers,
                    tie.every_s, tie.compress,
                    "; up to %d restart(s)" % self.restarts_left if self.restarts_left else ""))
        return self.supervise()

    def start_lighthouse(self, bind):
        """Start the lighthouse binding `bind`; the address it announced, or None."""
        args = self.args
        read_fd, write_fd = os.pipe()
        env = self.child_env(ready_fd=write_fd)
        restarts = len(self.lighthouses)
        label = "lighthouse" + (".restart%d" % restarts if restarts else "")
        try:
            self.lighthouse = Process(
                label, "-m:platoon.elastic.lighthouse",
                self.lighthouse_settings(bind, label).to_argv(), env,
                os.path.join(self.log_dir, label + ".log"), pass_fds=(write_fd,))
            self.lighthouses.append(self.lighthouse)
        finally:
            os.close(write_fd)
        try:
            ready = read_announcement(read_fd, args.ready_timeout_s)
        finally:
            os.close(read_fd)
        return None if ready is None else ready["address"]

    def start_node(self, name, host):
        """Start (or start again) node `name` on `host`: an mpiexec of its own."""
        attempt = sum(1 for p in self.started_nodes if p.index == name)
        label = "node-%s" % name + (".restart%d" % attempt if attempt else "")
        env = without_job_variables(os.environ)
        env.update(JobEnvironment(
            launcher_pid=os.getpid(), log_level=self.args.log_level, job_id=self.job_id,
            checkpoint_path=os.path.abspath(self.centre_of(name))).to_env())
        proc = Process(label, "-x:" + self.mpiexec,
                       elastic_node_arguments(host, self.node_settings(name, host, label),
                                              self.worker_command),
                       env, os.path.join(self.log_dir, label + ".log"), index=name,
                       device=host)
        self.nodes[name] = proc
        self.started_nodes.append(proc)

    def lighthouse_settings(self, bind, label):
        """The settings of the lighthouse `label` binding `bind`: the job's membership rule,
        its secret, its status file in the log directory."""
        return LighthouseSettings(self.args.membership, bind, self.secret_file,
                                  status_file=self.status_path(label))

    def node_settings(self, name, host, label):
        """The settings of node `name` on `host` (its process `label`): the lighthouse it
        joins, the job's secret and node settings (its data plane at `host`), its slot, its
        status file in the log directory."""
        # its place among the job's hosts, for its workers' data (not when joining a job
        # another launcher started: its slots are not this launcher's to give)
        slot = None if self.args.join else (self.names.index(name), len(self.names))
        return ElasticNodeSettings(self.join, name, dataclasses.replace(self.node, host=host),
                                   self.secret_file, slot, status_file=self.status_path(label))

    def centre_of(self, name):
        """Where node `name` saves its final centre (on its own machine)."""
        return os.path.join(self.log_dir, "centre-%s.npz" % name)

    def status_path(self, label):
        """Where the process `label` (the lighthouse, or a node) writes its status file (a
        node: on its own machine; the launcher sees it where the log directory is shared)."""
        return os.path.abspath(os.path.join(self.log_dir, label + ".status.json"))

    def status_of(self, proc):
        """What process `proc`'s status file says ({} before it wrote one)."""
        return read_status(self.status_path(proc.label))

    def node_status(self, proc):
        """What node process `proc` says of itself: its status file, or where that is not here
        (its machine's log directory is not this one), what it last told the lighthouses this
        launcher started (the latest that heard of it; for a node's latest process only)."""
        status, name = self.status_of(proc), proc.index
        if status or self.nodes.get(name) is not proc:
            return status
        started = self.lighthouses or [p for p in [self.lighthouse] if p is not None]
        for lighthouse in reversed(started):
            told = self.status_of(lighthouse).get("nodes")
            told = told.get(name) if isinstance(told, dict) else None
            if isinstance(told, dict):
                return dict(told, name=name)
        return {}

    # -- supervision ---------------------------------------------------------------------
    def _supervision_pass(self):
        self.echo_output()
        lighthouse = self.lighthouse
        if lighthouse is not None and lighthouse.poll() is not None:
            code = self._lighthouse_failed(lighthouse)
            if code is not None:
                return code
        finished = [n for n, p in self.nodes.items() if p.poll() == 0]
        for name, proc in list(self.nodes.items()):
            if proc in self._ended or proc.poll() is None:
                continue
            if proc.returncode == 0:
                self._ended[proc] = "finished"
                self.say("node %s finished" % name)
                continue
            self._ended[proc] = "failed (%s)" % proc.describe_exit()
            reason = "node %s failed (%s)" % (name, proc.describe_exit())
            advice = remote_start_advice(proc.device, proc.tail(20))
            if advice:
                reason += ": " + advice
            if proc.returncode == EXIT_REFUSED:
                self.say("node %s was refused by the job's other nodes: a tie setting or its "
                         "model differs from theirs (its log says which); it is not started "
                         "again. Last lines of %s:\n%s" % (name, proc.log_path,
                                                            proc.tail(5).rstrip()))
            elif self.restarts_left > 0 and not finished:
                self.restarts_left -= 1
                self.say("%s; starting it again (%d restart(s) left): it rejoins under its "
                         "name and is healed from a live node. Last lines of %s:\n%s"
                         % (reason, self.restarts_left, proc.log_path,
                            proc.tail(5).rstrip()))
                self.start_node(name, proc.device)
            else:
                others = any(p.poll() is None for n, p in self.nodes.items() if n != name)
                self.say("%s; %s%s. Last lines of %s:\n%s"
                         % (reason, "the other nodes go on without it" if others
                            else "no other node runs", " (no restart left: --restart N starts "
                            "a failed node again)" if not finished else " (the job is ending)",
                            proc.log_path, proc.tail(5).rstrip()))
        # Ended once each node's end is recorded above: a node that exits after its look in
        # this pass is recorded (finished or failed) in the next, not taken as stopped.
        if all(p in self._ended for p in self.nodes.values()):
            self.echo_output(final=True)
            self.stop_all()
            if finished:
                self._finished_ok = True
                self.say("job finished: %d of %d node(s) finished; logs in %s"
                         % (len(finished), len(self.nodes), self.log_dir))
                return EXIT_OK
            self.say("job failed: every node failed; logs in %s" % self.log_dir)
            return EXIT_FAILED
        self.show_status()
        return None

    def _lighthouse_failed(self, proc):
        """A dead lighthouse: started again on its port (it keeps no state; the nodes move
        to its new quorums), using a restart; else the job fails. None to go on."""
        reason = "the lighthouse failed (%s)" % proc.describe_exit()
        if self.restarts_left <= 0:
            return self.fail(proc, reason + " and no restart is left (--restart N)")
        self.restarts_left -= 1
        self.say("%s; starting it again on port %s (%d restart(s) left): the nodes train on "
                 "meanwhile and rejoin it" % (reason, self._lighthouse_port,
                                               self.restarts_left))
        bind, _ = lighthouse_address(self.join, self.args.hosts)
        if self.start_lighthouse(bind) is None:
            return self._not_started()
        return None

    def _not_started(self):
        """Fail the job: the lighthouse just started announced no address."""
        proc = self.lighthouse
        assert proc is not None
        return self.fail(proc, "the lighthouse did not start (%s)" % (
            proc.describe_exit() if proc.poll() is not None
            else "no answer within %.3g s" % self.args.ready_timeout_s))

    def latest_quorum(self):
        """``quorum ID: A, B`` of the job's latest quorum, from the status file of the
        lighthouse this launcher started (joined to another's: the newest any node has
        heard of); None before there is one."""
        if self.lighthouse is not None:
            return quorum_text(self.status_of(self.lighthouse).get("quorum"))
        heard = [self.status_of(p).get("quorum") for p in self.nodes.values()]
        heard = [q for q in heard if quorum_text(q) is not None]
        return quorum_text(max(heard, key=lambda q: q["id"])) if heard else None

    def show_status(self, force=False):
        if not self.status.due(force):
            return
        running = sum(p.poll() is None for p in self.nodes.values())
        elapsed = datetime.timedelta(seconds=int(time.monotonic() - self._started))
        parts = ["nodes running %d/%d" % (running, len(self.nodes)), "elapsed %s" % elapsed]
        quorum = self.latest_quorum()
        if quorum is not None:
            parts.append(quorum)
        elif self.lighthouse is not None:
            parts.append("no quorum yet")
        restarted = len(self.started_nodes) - len(self.nodes)
        if restarted:
            parts.append("%d restart(s)" % restarted)
        self.status.draw(parts)

    def shows_output(self, proc):
        """Every node's output and the lighthouse's (its quorums), unless --quiet."""
        return not getattr(self.args, "quiet", False) and proc in self.everyone()

    # -- the end -------------------------------------------------------------------------
    def everyone(self):
        """The nodes started so far (restarts too), then the lighthouse."""
        return self.started_nodes + [p for p in [self.lighthouse] if p is not None]

    def stop_all(self):
        """Stop the nodes (SIGTERM to each mpiexec, which passes it to its node; SIGKILL at
        the deadline), then the lighthouse; reap them all; remove the job's shared memory on
        this machine (each node's reaper removes its own)."""
        for proc in self.everyone():
            proc.end_shown_output()
        stop([p.popen for p in self.started_nodes], self.args.stop_timeout_s)
        if self.lighthouse is not None:
            stop([self.lighthouse.popen], self.args.stop_timeout_s)
        for proc in self.everyone():
            proc.poll()
        unlink_job_segments(self.job_id)

    def summary(self):
        lines = ["job summary: wall time %.1f s, %d node(s), %d restart(s)" % (
            time.monotonic() - self._started, len(self.nodes),
            len(self.started_nodes) - len(self.nodes))]
        for proc in self.started_nodes:
            lines.append("  %s on %s: %s" % (proc.label, proc.device, self._ended.get(
                proc, "stopped" if proc.returncode is not None else "still running")))
        final, kept_own = None, []
        for proc in self.started_nodes:
            status = self.node_status(proc)
            result = status.get("final_result")
            if isinstance(result, dict) and isinstance(result.get("metrics"), dict):
                final = final_result_text(str(status.get("name", proc.index)),
                                          result["metrics"])
            if status.get("kept_own_centre"):
                kept_own.append(proc.index)
        if final:
            lines.append("  " + final)
        saved = [self.centre_of(n) for n in self.names
                 if self._saved_during_job(self.centre_of(n))]
        if saved:
            if not self._finished_ok:
                how = ("the job ended before its final round: each node saved its own "
                       "centre, and they may differ")
            elif kept_own:
                how = ("node(s) %s gave the final round up and kept their own centre: the "
                       "centres may differ" % ", ".join(sorted(set(kept_own))))
            else:
                how = "the nodes alive at the end saved the same agreed centre"
            lines.append("  centre saved by each node that ended, on its own machine: %s "
                         "(load one with platoon.load_centre); %s" % (", ".join(saved), how))
        else:
            lines.append("  no centre saved here%s: each node saves its own to %s on its "
                         "machine once it has one" % (
                             "" if self._finished_ok else
                             " (the job ended before its final round)",
                             self.centre_of("NAME")))
        return lines


__all__ = ["ElasticLaunch", "elastic_node_arguments", "lighthouse_address", "node_names",
           "remote_start_advice"]
