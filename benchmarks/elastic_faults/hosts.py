"""Three "hosts" on one machine: network namespaces a, b and c, each joined by a veth pair to
a bridge in a fourth namespace (the switch, where the lighthouses run). Every host's link is
shaped by `tc` tbf to one rate both ways (its own end and the switch's port toward it): one
shaped link per host, as three machines on a slow network.

`Hosts` is a context manager; `close()` (also at exit) kills every process left in the
namespaces and deletes them. Namespaces of an earlier run whose process is gone are removed
by `benchmarks.slow_link.link.remove_stale` (they share its prefix).
"""

import os
import signal

from ..slow_link import link as slow_link
from .schedule import NODES

SUBNET = "10.218.5."
SWITCH_IP = SUBNET + "254"
DEVICE = "eth0"  # each host's end of its link
# MPICH over the links, not shared memory (see ../shared/FACTS.md)
MPI_TCP_ENV = dict(slow_link.MPI_TCP_ENV, UCX_NET_DEVICES=DEVICE)
LAUNCHER = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
case $1 in
%s
*) echo "no host $1" >&2; exit 2 ;;
esac
shift
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && exec $*"
"""


def ip_of(node):
    return SUBNET + str(NODES.index(node) + 1)


class Hosts(slow_link.Namespaces):
    """The switch and one namespace per node of `NODES`, links shaped to `rate_bits_s`.
    Raises RuntimeError (with `ip`'s or `tc`'s message) when they cannot be made."""

    def __init__(self, rate_bits_s, tag=""):
        super().__init__()
        self.rate = rate_bits_s
        base = "%s%d%s" % (slow_link.PREFIX, os.getpid(), tag)
        self.switch = base + "s"
        self.names = {n: base + n for n in NODES}

    def make(self):
        ip, sw = slow_link.ip, self.switch
        for ns in [sw] + list(self.names.values()):
            self.add(ns)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "addr", "add", SWITCH_IP + "/24", "dev", "br0")
        ip("-n", sw, "link", "set", "br0", "up")
        ip("-n", sw, "link", "set", "lo", "up")
        for node, ns in self.names.items():
            port, end = "p" + ns, "e" + ns  # unique names in the root namespace
            ip("link", "add", port, "type", "veth", "peer", "name", end)
            ip("link", "set", port, "netns", sw)
            ip("-n", sw, "link", "set", port, "name", "p" + node)
            ip("-n", sw, "link", "set", "p" + node, "master", "br0")
            ip("-n", sw, "link", "set", "p" + node, "up")
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "link", "set", end, "name", DEVICE)
            ip("-n", ns, "addr", "add", ip_of(node) + "/24", "dev", DEVICE)
            ip("-n", ns, "link", "set", DEVICE, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            if self.rate:
                slow_link.shape(ns, DEVICE, self.rate)
                slow_link.shape(sw, "p" + node, self.rate)
        cases = "\n".join('%s) ns=%s; name=node%s ;;' % (ip_of(n), ns, n)
                          for n, ns in self.names.items())
        self.write_launcher(self.switch, LAUNCHER % cases)

    def prefix(self, node):
        """The command prefix that runs a command on `node` under its own hostname (the same
        pid: `ip netns exec` and `unshare` exec)."""
        return slow_link.host_prefix(self.names[node], "node" + node)

    def switch_prefix(self):
        """The command prefix that runs a command on the switch (the lighthouses)."""
        return ["ip", "netns", "exec", self.switch]

    def mpiexec(self, mpiexec):
        """mpiexec on node a with one rank on each node (hydra reaching the others through
        the launcher script); give it `MPI_TCP_ENV` in its environment."""
        return slow_link.mpiexec_over(self.prefix(NODES[0]), mpiexec, self.launcher,
                                      [ip_of(n) for n in NODES], device=DEVICE)

    def pids(self, node):
        """The processes running on `node` (in its namespace)."""
        return slow_link.namespace_pids(self.names[node])

    def tx_bytes(self):
        """{node: bytes its end of its link has sent}, from the kernel's counters."""
        return {node: slow_link.tx_bytes_of(ns, DEVICE) for node, ns in self.names.items()}

    def kill_node(self, node):
        """kill -9 every process on `node`, by pid (and again any it forked meanwhile);
        returns the pids."""
        killed = []
        for _ in range(3):
            pids = [p for p in self.pids(node) if p not in killed]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed += pids
        return killed

    def stop_processes(self):
        """kill -9 what still runs on every node made (at close)."""
        for node in self.names:
            if self.names[node] in self.made:
                self.kill_node(node)
