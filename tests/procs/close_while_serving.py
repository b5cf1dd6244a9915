"""Leaves `with Controller()` through an exception while serve() runs in another thread,
in ROUNDS rounds: once serve() has answered a request, and at once after the thread
started. Prints "ROUND i OK" when serve() returned before close() closed the sockets, and
"ALL OK" at the end (libzmq aborted the process, or it hung, before close() stopped serve)."""

import sys
import threading

import zmq

from platoon import Controller

ROUNDS = int(sys.argv[1])


class Leaving(Exception):
    pass


outcomes = []
for i in range(ROUNDS):
    ctx = zmq.Context()
    try:
        with Controller(control_port=0, num_workers=1) as ctl:
            serving = threading.Thread(target=lambda: outcomes.append(ctl.serve()),
                                       name="serve-%d" % i)
            serving.start()
            if i % 2 == 0:  # serve() is in its loop: it answered a (malformed) request
                sock = ctx.socket(zmq.DEALER)
                sock.linger = 0
                sock.rcvtimeo = 10000
                sock.connect(ctl.control_address)
                sock.send(b"not json")
                sock.recv()
                sock.close()
            raise Leaving()
    except Leaving:
        pass
    finally:
        ctx.term()
    serving.join(10)
    assert not serving.is_alive(), "serve() still running after close()"
    assert len(outcomes) == i + 1, "serve() raised instead of returning"
    print("ROUND %d OK" % i, flush=True)
print("ALL OK", flush=True)
