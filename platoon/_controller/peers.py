"""What the kernel can tell about a peer on this machine: does a process hold a TCP
connection to one of our ports. Used to check a worker's claimed pid at registration.
Reads /proc only; no sockets, no numpy."""

import ipaddress
import os

_LOOPBACK_HINTS = ("127.", "::1", "::ffff:127.")
_ESTABLISHED = "01"


def is_loopback_address(address):
    """True for a peer address (as ZeroMQ's Peer-Address gives it) on this machine's loopback."""
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback or \
            (address.startswith("::ffff:") and ipaddress.ip_address(address[7:]).is_loopback)
    except ValueError:
        return address.startswith(_LOOPBACK_HINTS)


def _established_inodes(port):
    """Inodes of this network namespace's established TCP sockets whose remote port is `port`
    (the client ends of connections to it); None when /proc/net cannot be read."""
    inodes, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _ESTABLISHED:
                continue
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if readable else None


def count_connections(pid, port):
    """How many established TCP connections process `pid` holds to local port `port`.

    Raises LookupError with a sentence saying why when it cannot be told: no such
    process, no /proc, or the process belongs to another user.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise LookupError("pid %r is not a process id" % (pid,))
    if not os.path.exists("/proc/%d" % pid):
        raise LookupError("no process %d runs on this machine" % pid)
    inodes = _established_inodes(port)
    if inodes is None:
        raise LookupError("/proc/net/tcp cannot be read, so pid %d cannot be checked" % pid)
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except PermissionError:
        raise LookupError("process %d belongs to another user, so its connections cannot be "
                          "checked" % pid) from None
    except OSError:
        raise LookupError("process %d has exited" % pid) from None
    count = 0
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count
