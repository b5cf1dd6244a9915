"""A worker of the minibatch channel; prints ID, then GOT <index> for each minibatch taken.

usage: mb_worker.py CONTROL_PORT DATA_PORT MODE [COUNT | WINDOW_BYTES]
  idle:  connects to the data channel but never calls recv_mb; leaves after a barrier
  take:  takes minibatches until it has COUNT distinct indices, then a barrier
  hold:  with a window of WINDOW_BYTES (default: the default), takes one minibatch,
         prints HOLDING, and waits (to be killed)
  pause: with a window of 8 minibatches (one request per 2), takes one minibatch, prints
         HOLDING and waits for SIGUSR1 (its data connection is reset meanwhile); then
         takes minibatches until one holds index COUNT, prints HELD, and waits (to be
         killed)
  drain: takes minibatches until one holds index -1, then a barrier
  ackleave: takes COUNT minibatches, acknowledges them in a recv_mb that times out, and
         closes at once (no barrier): its data goodbye comes right after that request
"""

import signal
import sys
import threading

from platoon import MinibatchTimeout, Worker

control_port, data_port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode == "pause":  # blocked before ZeroMQ's threads start, so they inherit the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
with Worker(control_port, timeout_s=30) as w:
    if mode == "hold" and len(sys.argv) > 4:
        w.init_mb_sock(data_port, window_bytes=int(sys.argv[4]))
    elif mode == "pause":
        w.init_mb_sock(data_port, prefetch=7)
    else:
        w.init_mb_sock(data_port)
    print("ID %d" % w.worker_id, flush=True)
    if mode == "take":
        seen = set()
        while len(seen) < int(sys.argv[4]):
            index, = w.recv_mb()
            assert not index.flags.writeable
            seen.add(int(index[0]))
            print("GOT %d" % index[0], flush=True)
    elif mode == "hold":
        index, = w.recv_mb()
        print("HOLDING %d" % index[0], flush=True)
        threading.Event().wait(60)  # until killed
        raise SystemExit("not killed")
    elif mode == "pause":
        index, = w.recv_mb()
        print("GOT %d" % index[0], flush=True)
        print("HOLDING %d" % index[0], flush=True)
        if signal.sigtimedwait({signal.SIGUSR1}, 30) is None:
            raise SystemExit("no SIGUSR1 within 30 s")
        while index[0] != int(sys.argv[4]):
            index, = w.recv_mb()
            print("GOT %d" % index[0], flush=True)
        print("HELD", flush=True)
        threading.Event().wait(60)  # until killed
        raise SystemExit("not killed")
    elif mode == "drain":
        while True:
            index, = w.recv_mb()
            if index[0] == -1:
                break
            print("GOT %d" % index[0], flush=True)
    elif mode == "ackleave":
        for _ in range(int(sys.argv[4])):
            index, = w.recv_mb()
            print("GOT %d" % index[0], flush=True)
        try:  # waiting, it asks for more: a request acknowledging all it took
            w.recv_mb(timeout_s=0.05)
            raise SystemExit("a minibatch nobody sent")
        except MinibatchTimeout:
            pass
        print("LEAVING", flush=True)
    if mode != "ackleave":
        w.barrier()
