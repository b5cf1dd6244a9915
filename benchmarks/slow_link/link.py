"""Two "hosts" on one machine: network namespaces joined by a veth pair, the link shaped by
`tc` tbf on both ends (each direction gets the rate; this kernel has no netem, so no delay).

`TwoHosts` is a context manager; `close()` (also run at exit) stops every process left in
either namespace and deletes both (which removes the veth pair). Namespaces of an earlier run
whose process is gone are removed when the next one starts.
"""

import atexit
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

IPS = ("10.217.1.1", "10.217.1.2")
DEVICE = "slk0"  # the veth end's name in both namespaces
HOSTNAMES = ("nodea", "nodeb")
PREFIX = "slk"  # namespaces: slk<pid>a, slk<pid>b
# MPICH over the veth, not shared memory (see ../shared/FACTS.md)
MPI_TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp",
               "UCX_NET_DEVICES": DEVICE}
# An ssh stand-in for mpiexec (hydra's -launcher-exec): "[-x] HOST COMMAND" runs COMMAND in
# HOST's namespace under HOST's own hostname (as tests/mpi/test_mpi.py's two_hosts does).
LAUNCHER = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
case $1 in %s) ns=%s; name=%s ;; %s) ns=%s; name=%s ;; *) echo "no host $1" >&2; exit 2 ;; esac
shift
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && exec $*"
"""
RATES = {"10mbit": 10e6, "100mbit": 100e6, "1gbit": 1e9}  # bits per second


def missing():
    """Why two hosts cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    for tool in ("ip", "tc", "unshare"):
        if not shutil.which(tool):
            return "no `%s` on PATH" % tool
    return None


def rate_bits(link):
    """The rate of a link name ("10mbit", "100mbit", "1gbit") in bits per second; None for
    "none" (no link: one host)."""
    if link == "none":
        return None
    if link not in RATES:
        raise ValueError("unknown link %r: choose from none, %s" % (link, ", ".join(RATES)))
    return RATES[link]


def run_command(args, timeout_s=10.0, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=timeout_s)


def ip(*args):
    """`ip ARGS`; RuntimeError with ip's message when it fails."""
    try:
        run_command(["ip"] + list(args))
    except subprocess.CalledProcessError as exc:
        raise RuntimeError("`ip %s` failed: %s" % (" ".join(args), exc.stderr.strip())) from None


def shape(namespace, device, rate_bits_s):
    """Shape what `device` in `namespace` sends to `rate_bits_s` by tbf: a burst of at least 64
    KiB (a GSO packet) and 5 ms at the rate, a queue of 100 ms. RuntimeError with tc's message
    when it fails."""
    burst = max(64 * 1024, int(rate_bits_s / 8 * 0.005))
    cmd = ["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf",
           "rate", "%dbit" % rate_bits_s, "burst", str(burst), "latency", "100ms"]
    try:
        run_command(cmd)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError("`%s` failed: %s" % (" ".join(cmd), exc.stderr.strip())) from None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale():
    """Delete the namespaces, and the temporary files, of earlier runs whose process is
    gone; returns the namespaces' names."""
    out = run_command(["ip", "netns", "list"], check=False).stdout
    gone = []
    for name in re.findall(r"^(%s(\d+)\w*)" % PREFIX, out, re.M):
        if not _pid_alive(int(name[1])):
            _kill_all_in(name[0])
            run_command(["ip", "netns", "del", name[0]], check=False)
            gone.append(name[0])
    for path in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "[0-9]*")):
        pid = re.match(r"%s(\d+)" % PREFIX, os.path.basename(path))
        if pid and not _pid_alive(int(pid.group(1))):
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    return gone


def namespace_pids(namespace):
    """The processes running in `namespace` (this one left out)."""
    out = run_command(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def _kill_all_in(namespace, grace_s=3.0):
    """SIGTERM every process in `namespace`, then SIGKILL those left after `grace_s`."""
    left = namespace_pids(namespace)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if _pid_alive(p)]
        if not left:
            return
        left = namespace_pids(namespace)


class Namespaces:
    """Network namespaces made one by one (`add`), an ssh stand-in script for mpiexec
    (`write_launcher`), all deleted on `close()` (idempotent, also at exit) after the
    processes in them are stopped (`stop_processes`). A context manager: `make()`, which
    subclasses write, runs on entering, and a failure in it closes what was made."""

    def __init__(self):
        self.made = []
        self.launcher = None
        self._closed = False

    def __enter__(self):
        atexit.register(self.close)
        try:
            self.make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def make(self):
        raise NotImplementedError

    def add(self, name):
        """`ip netns add NAME`, deleted on close."""
        ip("netns", "add", name)
        self.made.append(name)

    def write_launcher(self, name, script):
        """The executable mpiexec launcher script (`LAUNCHER`'s shape) in the temporary
        directory, named after `name`, removed on close."""
        self.launcher = os.path.join(tempfile.gettempdir(), name + "-launcher.sh")
        with open(self.launcher, "w") as f:
            f.write(script)
        os.chmod(self.launcher, 0o755)

    def stop_processes(self):
        """Stop every process still in the namespaces (SIGTERM, then SIGKILL)."""
        for name in self.made:
            _kill_all_in(name)

    def close(self):
        """Stop what runs in the namespaces and delete them (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop_processes()
        finally:
            for name in self.made:
                run_command(["ip", "netns", "del", name], check=False)
            if self.launcher and os.path.exists(self.launcher):
                os.unlink(self.launcher)
            atexit.unregister(self.close)


def host_prefix(namespace, hostname):
    """The command prefix that runs a command in `namespace` under `hostname` (the same pid:
    `ip netns exec` and `unshare` exec)."""
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
            'hostname %s && exec "$@"' % hostname, "sh"]


def mpiexec_over(prefix, mpiexec, launcher, hosts, device=DEVICE):
    """`mpiexec` run behind `prefix`, one rank on each of `hosts` (hydra reaching the others
    through the `launcher` script, over `device`)."""
    return prefix + [mpiexec, "-launcher", "ssh", "-launcher-exec", launcher, "-iface",
                     device, "-hosts", ",".join(hosts), "-n", str(len(hosts)), "-ppn", "1"]


def tx_bytes_of(namespace, device=DEVICE):
    """The bytes `device` in `namespace` has sent, from the kernel's counters."""
    text = run_command(["ip", "-n", namespace, "-s", "-j", "link", "show", "dev",
                        device]).stdout
    return int(json.loads(text)[0]["stats64"]["tx"]["bytes"])


class TwoHosts(Namespaces):
    """Namespaces A and B joined by a veth pair (`DEVICE` in both, `IPS`), loopback up, both
    ends shaped to `rate_bits_s` by tbf (None: unshaped). Raises RuntimeError (with `ip`'s or
    `tc`'s message) when they cannot be made."""

    def __init__(self, rate_bits_s=None, tag=""):
        super().__init__()
        self.rate = rate_bits_s
        self.names = ["%s%d%s%s" % (PREFIX, os.getpid(), tag, side) for side in "ab"]

    def make(self):
        for name in self.names:
            self.add(name)
        ip("link", "add", self.names[0], "type", "veth", "peer", "name", self.names[1])
        for name, address in zip(self.names, IPS):
            ip("link", "set", name, "netns", name)
            ip("-n", name, "link", "set", name, "name", DEVICE)
            ip("-n", name, "addr", "add", address + "/24", "dev", DEVICE)
            ip("-n", name, "link", "set", DEVICE, "up")
            ip("-n", name, "link", "set", "lo", "up")
            if self.rate:
                shape(name, DEVICE, self.rate)
        self.write_launcher(self.names[0], LAUNCHER % (IPS[0], self.names[0], HOSTNAMES[0],
                                                       IPS[1], self.names[1], HOSTNAMES[1]))

    def prefix(self, side):
        """The command prefix that runs a command in host `side` (0 or 1) under its hostname."""
        return host_prefix(self.names[side], HOSTNAMES[side])

    def mpiexec(self, mpiexec):
        """mpiexec on host 0 with one rank on each host (hydra reaching host 1 through the
        launcher script); give it `MPI_TCP_ENV` in its environment."""
        return mpiexec_over(self.prefix(0), mpiexec, self.launcher, IPS)

    def tx_bytes(self):
        """[bytes sent by host 0's veth end, by host 1's], from the kernel's counters."""
        return [tx_bytes_of(name) for name in self.names]

    def shaping(self):
        """[{rate_bits_s, bytes, drops, overlimits}] of each end's tbf since it was made
        (None when unshaped): drops and overlimits show the link was the bottleneck."""
        if not self.rate:
            return None
        out = []
        for name in self.names:
            text = run_command(["tc", "-n", name, "-s", "-j", "qdisc", "show", "dev",
                                DEVICE]).stdout
            tbf = [q for q in json.loads(text) if q.get("kind") == "tbf"][0]
            out.append({"rate_bits_s": 8 * tbf["options"]["rate"], "bytes": tbf["bytes"],
                        "drops": tbf["drops"], "overlimits": tbf["overlimits"]})
        return out

