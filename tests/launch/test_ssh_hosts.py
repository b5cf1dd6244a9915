"""platoon-launcher --hosts H1 H2 H3 --elastic across machines for real: over ssh, to sshd.

Three hosts are network namespaces on a switch (a bridge in a fourth namespace), each with its
own hostname and a real sshd on port 22 of its address, with host keys and an authorized key
made for the test. The launcher runs on the switch (its own host, where the lighthouse runs),
as a user runs it on a cluster: the ssh client set up by an ssh config (identity, known
hosts), given to mpiexec's ssh through HYDRA_LAUNCHER_EXTRA_ARGS; HYDRA_IFACE names the
interface the hosts reach the launcher's mpiexec on. The namespaces share the filesystem: the
same paths on every host, the job's secret readable on each. See docs/multi-node.md, "Across
machines".
"""

import os
import re
import shutil
import signal
import subprocess
import time
import types

import numpy as np
import pytest

from platoon._os.process import find_mpiexec

from helpers import PROCS, launcher_cmd, wait_until

SUBNET = "10.216.3."
SWITCH_IP = SUBNET + "254"
HOSTS = [SUBNET + str(i) for i in (1, 2, 3)]
WORKER = os.path.join(PROCS, "where_worker.py")
SBIN = "/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", "")
SSHD_CONFIG = """\
ListenAddress {address}:22
HostKey {tmp}/host-{index}
AuthorizedKeysFile {tmp}/authorized_keys
PidFile none
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
# the test's keys live under /tmp, which is world-writable
StrictModes no
LogLevel VERBOSE
"""
SSH_CONFIG = """\
Host {subnet}*
  IdentityFile {tmp}/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile {tmp}/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
"""


def _missing():
    """Why the test cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and sshd need root"
    tools = {"ip": shutil.which("ip"), "unshare": shutil.which("unshare"),
             "ssh": shutil.which("ssh"), "ssh-keygen": shutil.which("ssh-keygen"),
             "sshd": shutil.which("sshd", path=SBIN)}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        return "not installed: %s (sshd: apt-get install openssh-server, as .ci/run does)" \
            % ", ".join(missing)
    if find_mpiexec() is None:
        return "no mpiexec (pip install -e '.[mpi]')"
    return None


def _run(*args):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=10)


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def ssh_hosts(tmp_path):
    """Three hosts (namespaces with hostnames plt-host1..3, addresses HOSTS) on a switch
    (SWITCH_IP), each running sshd. Returns their `switch` (its namespace), `spaces` and
    `sshd_logs` ({host: its namespace, its sshd's log}), `sshd_pids`, the client's
    `ssh_config` and its key's `fingerprint`. At teardown every sshd is stopped by its pid,
    whatever still runs in the namespaces is killed, and they are deleted."""
    why = _missing()
    if why:
        pytest.skip(why)
    sshd = shutil.which("sshd", path=SBIN)
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    tag = "pss%d" % os.getpid()
    switch, spaces = tag + "s", {host: "%s%d" % (tag, i) for i, host in enumerate(HOSTS, 1)}
    made, daemons, logs = [], [], {}
    try:
        for ns in [switch] + list(spaces.values()):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _run("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", switch, "addr", "add", SWITCH_IP + "/24", "dev", "br0")
        for dev in ("br0", "lo"):
            _run("ip", "-n", switch, "link", "set", dev, "up")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519"))
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        known = []
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        for index, (host, ns) in enumerate(spaces.items(), 1):
            port, end = "p" + ns, "e" + ns  # unique in the root namespace while moved
            _run("ip", "link", "add", port, "type", "veth", "peer", "name", end)
            _run("ip", "link", "set", port, "netns", switch)
            _run("ip", "-n", switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", switch, "link", "set", port, "up")
            _run("ip", "link", "set", end, "netns", ns)
            _run("ip", "-n", ns, "link", "set", end, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", host + "/24", "dev", "eth0")
            for dev in ("eth0", "lo"):
                _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                 str(keys / ("host-%d" % index)))
            known.append("%s %s" % (host, (keys / ("host-%d.pub" % index)).read_text()))
            config = keys / ("sshd-%d.conf" % index)
            config.write_text(SSHD_CONFIG.format(address=host, tmp=keys, index=index))
            logs[host] = keys / ("sshd-%d.log" % index)
            # sshd in the host's namespace, under its own hostname (ip netns exec, unshare
            # and sh exec: the pid is sshd's)
            daemons.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                 'hostname plt-host%d && exec "$@"' % index, "sh", sshd, "-D", "-f",
                 str(config), "-E", str(logs[host])], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        (keys / "known_hosts").write_text("".join(known))
        ssh_config = keys / "ssh_config"
        ssh_config.write_text(SSH_CONFIG.format(subnet=SUBNET, tmp=keys))
        for daemon, (host, log) in zip(daemons, logs.items()):
            _wait_listening(daemon, host, log)
        fingerprint = _run("ssh-keygen", "-l", "-f",
                           str(keys / "id_ed25519.pub")).stdout.split()[1]
        yield types.SimpleNamespace(switch=switch, spaces=spaces, sshd_logs=logs,
                                    sshd_pids={d.pid for d in daemons},
                                    ssh_config=ssh_config, fingerprint=fingerprint)
    except subprocess.CalledProcessError as exc:
        pytest.skip("cannot make the hosts here: %s: %s" % (exc.cmd, exc.stderr.strip()))
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(5)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(5)
        for ns in made:
            for _ in range(3):  # and what they forked meanwhile
                _kill(_pids(ns))
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _wait_listening(daemon, host, log, timeout_s=10.0):
    """Wait until `daemon` (sshd) listens on `host` (its log says so); fail if it exits."""
    line = "Server listening on %s port 22" % host
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and line in log.read_text()):
        if daemon.poll() is not None or time.monotonic() > deadline:
            pytest.fail("sshd on %s %s; its log:\n%s" % (
                host, "exited (code %s)" % daemon.returncode if daemon.poll() is not None
                else "does not listen after %g s" % timeout_s,
                log.read_text() if log.exists() else "(none)"))
        time.sleep(0.05)


def test_launcher_elastic_job_over_ssh_to_three_hosts_ends_on_one_centre(ssh_hosts, tmp_path):
    """platoon-launcher WORKER --hosts H1 H2 H3 --elastic -n 1, run on the switch: each node's
    mpiexec reaches its host through sshd with the test's key; the three nodes train in their
    own namespaces (each worker's hostname and network namespace are its host's, and it
    descends from an ssh session from the switch), form one quorum, and end on one centre,
    saved by every node; the launcher exits 0."""
    from platoon import load_centre
    hosts = ssh_hosts
    logs = tmp_path / "logs"
    code, out = _launch(hosts, logs, ssh_config=hosts.ssh_config)
    assert code == 0, out
    assert "job finished: 3 of 3 node(s) finished" in out, out
    assert "lighthouse at %s:" % SWITCH_IP in out, out
    assert re.search(r"lighthouse: quorum \d+: %s$" % re.escape(", ".join(HOSTS)), out, re.M), out
    for index, host in enumerate(HOSTS, 1):
        assert "node-%s on %s: finished" % (host, host) in out, out
        assert re.search(r"^\[node-%s/worker0\] DIST [\d.]+ node %s$" % (re.escape(host),
                                                                          re.escape(host)),
                         out, re.M), out
        # where its worker ran: its host's hostname and namespace, under an ssh session
        # from the switch to the host's port 22
        where = re.search(r"^\[node-%s/worker0\] WHERE host (\S+) netns net:\[(\d+)\] ssh (\S+)$"
                          % re.escape(host), out, re.M)
        assert where, out
        assert where.group(1) == "plt-host%d" % index, where.group(0)
        assert int(where.group(2)) == os.stat("/run/netns/" + hosts.spaces[host]).st_ino, \
            where.group(0)
        assert re.match(r"%s,\d+,%s,22$" % (re.escape(SWITCH_IP), re.escape(host)),
                        where.group(3)), where.group(0)
        # and sshd let the launcher's mpiexec in with the test's key
        accepted = "Accepted publickey for root from %s port" % SWITCH_IP
        sshd_log = hosts.sshd_logs[host].read_text()
        assert accepted in sshd_log and hosts.fingerprint in sshd_log, sshd_log
    centres = [load_centre(str(logs / ("centre-%s.npz" % host)))["param_0"] for host in HOSTS]
    assert np.isfinite(centres[0]).all()
    assert all(np.array_equal(centres[0], other) for other in centres[1:])
    assert "the nodes alive at the end saved the same agreed centre" in out, out
    # every node's processes ended with the job (the sshd sessions too): only sshd listens
    wait_until(lambda: not [pid for ns in hosts.spaces.values() for pid in _pids(ns)
                            if pid not in hosts.sshd_pids], 10, "the nodes' processes to end")


def _pids(ns):
    """The pids of the processes in namespace `ns`."""
    return [int(pid) for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                               text=True, timeout=10).stdout.split()]


def test_a_host_ssh_does_not_know_fails_its_node_saying_what_to_set_up(ssh_hosts, tmp_path):
    """The same job with an ssh config whose known hosts file is empty: ssh refuses every
    host (BatchMode: no prompt), each node fails at once, and the launcher says for each host
    what to do (add its key to the known hosts, or give ssh a config) and where the docs say
    more; it exits 1."""
    hosts = ssh_hosts
    (tmp_path / "empty_known_hosts").write_text("")
    config = tmp_path / "ssh_config_no_known_hosts"
    config.write_text(hosts.ssh_config.read_text().replace(
        str(hosts.ssh_config.parent / "known_hosts"), str(tmp_path / "empty_known_hosts")))
    code, out = _launch(hosts, tmp_path / "logs", ssh_config=config)
    assert code == 1 and "job failed: every node failed" in out, out
    for host in HOSTS:
        assert "node %s failed (exit code 255): ssh does not know host %s's key: add it to " \
            "your known hosts" % (host, host) in out, out
    assert 'see docs/multi-node.md, "Across machines (over ssh)"' in out, out
    for log in hosts.sshd_logs.values():
        assert "Accepted publickey" not in log.read_text()


@pytest.mark.parametrize("said, advice", [
    ("Host key verification failed.", "ssh does not know host h1's key"),
    ("root@h1: Permission denied (publickey).", "ssh to host h1 was refused"),
    ("[proxy:0@h1] main (pmip.c:100): unable to connect to server vm at port 36801 (check for "
     "firewalls!)", "host h1 could not connect back to this machine's mpiexec"),
    ("ValueError: Permission to train denied", None)])
def test_remote_start_advice_names_what_to_set_up(said, advice):
    from platoon.launch.elastic import remote_start_advice
    got = remote_start_advice("h1", "[mpiexec@vm] launching\n%s\n" % said)
    assert (got is None) if advice is None else got.startswith(advice), got


def _launch(hosts, logs, ssh_config):
    """(exit code, output) of the test's platoon-launcher command run on the switch, mpiexec's
    ssh given `ssh_config`."""
    # what a user sets when ~/.ssh/config is not theirs to change, and when the hosts cannot
    # reach this machine at its hostname (here it resolves to 127.0.0.1)
    env = dict(os.environ, HYDRA_LAUNCHER_EXTRA_ARGS="-F %s" % ssh_config, HYDRA_IFACE="br0")
    command = ["ip", "netns", "exec", hosts.switch] + launcher_cmd(
        WORKER, "--hosts", *HOSTS, "--elastic", "-n", "1", "--min-nodes", "3",
        "--tie-every-s", "0.5", "--lighthouse", SWITCH_IP + ":0", "--log-dir", str(logs),
        "--", "2")
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=str(logs.parent))
    try:
        out, _ = launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.send_signal(signal.SIGINT)  # its orderly end: the nodes, the lighthouse
        out, _ = launcher.communicate(timeout=30)
        pytest.fail("the job did not end within 60 s:\n%s" % out)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    return launcher.returncode, out
