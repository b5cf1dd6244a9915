"""What the kernel can tell about a peer on this machine: does a process hold the other end
of one of our TCP connections, or connections to one of our ports. Used to check a worker's
claimed pid at registration. Asks the kernel's socket-diagnostics netlink: for one
connection, a lookup by its addresses (tens of microseconds); for a port, a dump that walks
the kernel's whole connection table (about 150 us per address family here, with 262,144
buckets); else reads /proc/net/tcp (several milliseconds on such a machine); no numpy."""

import errno
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


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): TCP sockets in one state, a dump of all
# or a lookup of one by its addresses.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_REQUEST_DUMP = _NLM_F_REQUEST | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_ESTABLISHED = 1
_ANY_SOCKET = bytes(48)  # an inet_diag_sockid that matches every socket (in a dump)
_NO_COOKIE = b"\xff" * 8  # INET_DIAG_NOCOOKIE: do not check the socket's cookie
# in a reply: nlmsghdr, then inet_diag_msg fields
_STATE_AT, _DPORT_AT, _UID_AT, _INODE_AT = 16 + 1, 16 + 6, 16 + 64, 16 + 68


def _diag_socket():
    """A netlink socket to the kernel's sock_diag (OSError or AttributeError where none)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    sock.settimeout(5.0)
    return sock


def _diag_request(family, flags, seq, sockid):
    """A SOCK_DIAG_BY_FAMILY message asking for established TCP sockets of `family` that
    match `sockid` (an inet_diag_sockid, or _ANY_SOCKET)."""
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_ESTABLISHED)
    return struct.pack("=IHHII", 16 + len(req) + len(sockid), _SOCK_DIAG_BY_FAMILY, flags,
                       seq, 0) + req + sockid


def _diag_inodes(port):
    """As `_established_inodes`, from the kernel's sock_diag netlink; None if it refuses."""
    inodes = set()
    try:
        with _diag_socket() as sock:
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                sock.send(_diag_request(family, _NLM_F_REQUEST_DUMP, seq, _ANY_SOCKET))
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


def open_diag():
    """A netlink socket to the kernel's sock_diag for `other_end`, to keep and close; None
    where there is none (not Linux, or filtered)."""
    try:
        return _diag_socket()
    except (OSError, AttributeError):
        return None


def other_end(fd, diag=None):
    """(inode, uid) of the socket at the other end of our TCP connection on descriptor `fd`,
    when that end is in this network namespace (on this machine); None when the kernel
    finds no such socket or cannot be asked. One sock_diag lookup by the connection's
    addresses, on `diag` (from `open_diag`) if given, else on a netlink socket of its own:
    with `diag` it opens no descriptor, so it works when the process has none left."""
    try:
        family, local, remote = _ends(fd)
        if family not in (socket.AF_INET, socket.AF_INET6):
            return None

        def address(end):
            return socket.inet_pton(family, end[0]).ljust(16, b"\0")
        # The other end's socket: its source is our remote end, its destination our local one.
        sockid = (struct.pack(">HH", remote[1], local[1]) + address(remote) + address(local)
                  + bytes(4) + _NO_COOKIE)
        if diag is not None:
            data = _ask(diag, _diag_request(family, _NLM_F_REQUEST, 1, sockid))
        else:
            with _diag_socket() as sock:
                data = _ask(sock, _diag_request(family, _NLM_F_REQUEST, 1, sockid))
    except (OSError, AttributeError, ValueError):  # no netlink, not a socket, closed since
        return None
    if len(data) < _INODE_AT + 4 or struct.unpack_from("=H", data, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: ENOENT (not on this machine), or refused
    if data[_STATE_AT] != _TCP_ESTABLISHED or struct.unpack_from(
            ">H", data, _DPORT_AT)[0] != local[1]:
        return None  # (a listening socket on that port, say: not a connection to us)
    return (str(struct.unpack_from("=I", data, _INODE_AT)[0]),
            struct.unpack_from("=I", data, _UID_AT)[0])


def _ask(sock, request):
    """The kernel's answer to one sock_diag `request` (a lookup: one message)."""
    sock.send(request)
    return sock.recv(65536)


def other_end_inode(fd):
    """Inode of the socket at the other end of our TCP connection on descriptor `fd` (see
    `other_end`); None when the kernel finds no such socket or cannot be asked."""
    end = other_end(fd)
    return None if end is None else end[0]


def _ends(fd):
    """(family, our address, the remote address) of the connected socket `fd`, borrowed: no
    descriptor is opened or closed."""
    ours = socket.socket(fileno=fd)
    try:
        return ours.family, ours.getsockname(), ours.getpeername()
    finally:
        ours.detach()


def hang_up(fd):
    """Shut down both directions of the TCP connection on descriptor `fd`, which ZeroMQ owns:
    ZeroMQ then sees it closed, and closes and forgets it. No descriptor is opened."""
    ours = socket.socket(fileno=fd)
    try:
        ours.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile, or not connected (any more)
    finally:
        ours.detach()


def holds_other_end(pid, fd):
    """True if process `pid` holds the other end of our TCP connection on descriptor `fd`;
    False if it does not, or if that cannot be told (no such process, no netlink, ...)."""
    inode = other_end_inode(fd)
    if inode is None:
        return False
    target = "socket:[%s]" % inode
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    # newest first: a registering worker opened its connection just before (each readlink
    # of /proc costs microseconds)
    for entry in sorted(fds, key=int, reverse=True):
        try:
            if os.readlink("%s/%s" % (fd_dir, entry)) == target:
                return True
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # (closed meanwhile: look on)
                return False
    return False


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
