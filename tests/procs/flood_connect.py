"""Another local user flooding a controller's port with idle TCP connections: as uid 65534
(nobody; the test runs as root), opens COUNT connections to PORT and holds them for SECONDS
(with MODE "reconnect", opening a new one for each the controller drops); prints FLOODING
once COUNT connection attempts are made, then DROPPED N (connections the controller closed).

usage: flood_connect.py PORT COUNT SECONDS MODE
  MODE  hold or reconnect
"""

import errno
import os
import selectors
import socket
import sys
import time

port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
reconnect = sys.argv[4] == "reconnect"
os.setgid(65534)
os.setuid(65534)
selector = selectors.DefaultSelector()
attempts = dropped = 0


def connect():
    global attempts
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    code = sock.connect_ex(("127.0.0.1", port))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        return
    attempts += 1
    selector.register(sock, selectors.EVENT_READ)


for _ in range(count):
    connect()
print("FLOODING", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for key, _ in selector.select(timeout=0.05):
        sock = key.fileobj
        try:
            data = sock.recv(4096)  # the controller's ZMTP greeting, or its close
        except OSError:
            data = b""
        if not data:
            selector.unregister(sock)
            sock.close()
            dropped += 1
            if reconnect:
                connect()
print("DROPPED %d of %d" % (dropped, attempts), flush=True)
