"""A worker for the stop-signal tests; prints ID <id> once registered.

usage: stop_worker.py CONTROL_PORT MODE [DATA_PORT]
  sync:     syncs until it sees the stop (never sends a request of its own), then prints
            SAW <syncs> <reason>
  ask:      syncs 5 times, asks to stop ("target reached"), then syncs until it sees it
  request:  shares its parameters, then sends "ping" requests until it sees the stop (never
            syncs), then prints SAW
  barrier:  prints WAITING, waits at a barrier, then prints PASSED <stop_requested> <reason>
  leave:    asks to stop ("target reached") and leaves at once
  mb:       takes minibatches (printing GOT <index>) until recv_mb ends the with block
            through StopRequested; then prints LEFT <stop_requested> <reason>
"""

import sys

import numpy as np

from platoon import EASGD, Worker

port, mode = int(sys.argv[1]), sys.argv[2]
data_port = int(sys.argv[3]) if len(sys.argv) > 3 else None
params = [np.zeros(1000)]
with Worker(port, data_port=data_port, timeout_s=30) as w:
    print("ID %d" % w.worker_id, flush=True)
    if mode in ("sync", "ask"):
        w.init_shared_params(params, EASGD(0.5))
        print("SYNCING", flush=True)
        while not w.stop_requested:
            params[0] += 1.0
            w.sync_params()
            if mode == "ask" and w.syncs == 5:
                w.request_stop("target reached")
        print("SAW %d %s" % (w.syncs, w.stop_reason), flush=True)
    elif mode == "request":
        w.init_shared_params(params, EASGD(0.5))
        pings = 0
        while not w.stop_requested:
            assert w.send_req("ping") == "pong"
            pings += 1
            if pings == 1:
                print("REQUESTING", flush=True)
        print("SAW %d %s" % (pings, w.stop_reason), flush=True)
    elif mode == "barrier":
        print("WAITING", flush=True)
        w.barrier()
        print("PASSED %s %s" % (w.stop_requested, w.stop_reason), flush=True)
    elif mode == "leave":
        w.request_stop("target reached")
    elif mode == "mb":
        while True:
            index, = w.recv_mb()
            print("GOT %d" % index[0], flush=True)
print("LEFT %s %s" % (w.stop_requested, w.stop_reason), flush=True)
