"""What the kernel can tell about a peer on this machine: does a process hold a TCP
connection to one of our ports. Used to check a worker's claimed pid at registration.
Asks the kernel's socket-diagnostics netlink (a fraction of a millisecond), else reads
/proc/net/tcp (several milliseconds on a machine with a large connection hash table);
no numpy."""

import ipaddress
import os
import socket
import struct

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


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): a dump of TCP sockets in one state.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_ESTABLISHED = 1
_DPORT_AT, _INODE_AT = 16 + 6, 16 + 68  # in a reply: nlmsghdr, then inet_diag_msg fields


def _diag_inodes(port):
    """As `_established_inodes`, from the kernel's sock_diag netlink; None if it refuses."""
    inodes = set()
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(5.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0,
                                  1 << _TCP_ESTABLISHED) + bytes(48)  # any socket id
                sock.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY,
                                      _NLM_F_REQUEST_DUMP, seq, 0) + req)
                done = False
                while not done:
                    data = sock.recv(65536)
                    offset = 0
                    while offset + 16 <= len(data):
                        length, kind = struct.unpack_from("=IH", data, offset)
                        if kind == _NLMSG_ERROR or length < 16:
                            return None
                        if kind == _NLMSG_DONE:
                            done = True
                            break
                        if length >= _INODE_AT + 4 and struct.unpack_from(
                                ">H", data, offset + _DPORT_AT)[0] == port:
                            inodes.add(str(struct.unpack_from("=I", data,
                                                              offset + _INODE_AT)[0]))
                        offset += (length + 3) & ~3
    except (OSError, AttributeError):  # no netlink (not Linux, or filtered): use /proc
        return None
    return inodes


def _established_inodes(port):
    """Inodes of this network namespace's established TCP sockets whose remote port is `port`
    (the client ends of connections to it); None when the kernel cannot tell."""
    inodes = _diag_inodes(port)
    return inodes if inodes is not None else _proc_inodes(port)


def _proc_inodes(port):
    """As `_established_inodes`, from /proc/net/tcp and tcp6; None if they cannot be read."""
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
