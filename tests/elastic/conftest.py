"""Fixtures of the tests of platoon.elastic: `job` (a lighthouse and nodes sharing one secret,
killed at teardown) and `switch` (three hosts in network namespaces on a bridge, deleted at
teardown)."""

import os
import shutil
import signal
import subprocess

import pytest

from platoon.elastic import generate_secret

from elastic_helpers import (
    GRACE_S,
    MPI_RANK_VARIABLES,
    NODE,
    SWITCH_IP,
    TIMEOUT_S,
    WORKER,
    _in_netns,
)
from helpers import Proc


@pytest.fixture
def job(tmp_path):
    """Starts a lighthouse and nodes sharing one secret; kills them all at teardown."""
    started = []
    env = {"PLATOON_ELASTIC_SECRET_FILE": generate_secret(str(tmp_path / "secret"))}

    class Job:
        address = None

        def lighthouse(self, min_nodes, port=0, host="127.0.0.1", netns=None,
                       status_file=None, heartbeat_timeout_s=TIMEOUT_S):
            proc = Proc(_in_netns(netns) + [
                "-m", "platoon.elastic.lighthouse", "--min-nodes", str(min_nodes),
                "--heartbeat-timeout-s", str(heartbeat_timeout_s),
                "--join-grace-s", str(GRACE_S),
                "--bind", "%s:%d" % (host, port)]
                + (["--status-file", str(status_file)] if status_file else []), env=env)
            started.append(proc)
            match, _ = proc.wait_for_match(r"lighthouse: serving on tcp://(\S+) ")
            self.address = match.group(1)
            return proc

        def node(self, name, *args, secret_file=None, script=NODE):
            node_env = dict(env, PLATOON_ELASTIC_SECRET_FILE=secret_file) if secret_file \
                else env
            proc = Proc([script, self.address, name] + [str(a) for a in args], env=node_env)
            started.append(proc)
            return proc

        def runner(self, name, *worker_args, checkpoint=None, host="127.0.0.1", netns=None,
                   node_args=(), node_env=None):
            """python -m platoon.elastic.node with one worker of elastic_worker.py (in network
            namespace `netns`, on its address `host`, if given; `node_args`: more options of
            the node), started as if by srun or mpiexec (MPI's and torchrun's rank variables
            set: its workers must not see them; `node_env`: more of its environment)."""
            node_env = dict(env, **MPI_RANK_VARIABLES, **(node_env or {}))
            if checkpoint:
                node_env["PLATOON_CHECKPOINT_PATH"] = str(checkpoint)
            proc = Proc(_in_netns(netns) + [
                "-m", "platoon.elastic.node", "--join", self.address, "--name", name,
                "--host", host, "--tie-every-s", "0.2", "--tie-timeout-s", "3"]
                + [str(a) for a in node_args] + ["--", WORKER]
                + [str(a) for a in worker_args], env=node_env)
            started.append(proc)
            return proc

    yield Job()
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped process dies only once continued
        except ProcessLookupError:
            pass
        proc.kill()


@pytest.fixture
def switch():
    """Three "hosts" (network namespaces, 10.219.7.1-3) each joined by a veth pair to a
    bridge in a fourth (the switch, 10.219.7.254, where the lighthouse runs); returns
    (namespaces by host name, the switch's namespace, cut(host, up=False)). Every process left
    in them is killed and they are deleted at teardown."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and ip")
    tag = "pel%d" % os.getpid()
    sw, hosts = tag + "s", {n: "%s%s" % (tag, n) for n in "abc"}
    made = []

    def ip(*args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=10)

    def cut(host, up=False):  # the host's port on the switch
        ip("-n", sw, "link", "set", "p" + host, "up" if up else "down")

    try:
        for ns in [sw] + list(hosts.values()):
            ip("netns", "add", ns)
            made.append(ns)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "addr", "add", SWITCH_IP + "/24", "dev", "br0")
        for index, (host, ns) in enumerate(sorted(hosts.items()), 1):
            ip("link", "add", "p" + tag + host, "type", "veth", "peer", "name", "e" + tag + host)
            ip("link", "set", "p" + tag + host, "netns", sw)
            ip("-n", sw, "link", "set", "p" + tag + host, "name", "p" + host)
            ip("-n", sw, "link", "set", "p" + host, "master", "br0")
            ip("-n", sw, "link", "set", "p" + host, "up")
            ip("link", "set", "e" + tag + host, "netns", ns)
            ip("-n", ns, "link", "set", "e" + tag + host, "name", "eth0")
            ip("-n", ns, "addr", "add", "10.219.7.%d/24" % index, "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        for ns in (sw,):
            ip("-n", ns, "link", "set", "br0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts, sw, cut
    except subprocess.CalledProcessError as exc:
        pytest.skip("cannot make network namespaces here: %s" % exc.stderr.decode().strip())
    finally:
        for ns in made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                  timeout=10).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
