"""An unauthenticated peer flooding a controller's data port with junk and forged requests;
prints FLOODING once it has sent 10,000 frames, stops after SECONDS.

usage: flood_data.py DATA_PORT SECONDS
"""

import sys
import time

import zmq

from platoon.protocol import encode_mb_request

port, seconds = int(sys.argv[1]), float(sys.argv[2])
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.linger = 0
sock.connect("tcp://127.0.0.1:%d" % port)
frames = [b"junk", encode_mb_request(0, "0" * 32, 0, 100)]  # garbage; worker 0 without token
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    try:
        sock.send(frames[sent % 2], zmq.NOBLOCK)
    except zmq.Again:  # the controller's queue for us is full: keep it full
        time.sleep(0.001)
        continue
    sent += 1
    if sent == 10000:
        print("FLOODING", flush=True)
print("SENT %d" % sent, flush=True)
ctx.destroy(linger=0)
