"""A worker written for the original Platoon (numpy in place of Theano)."""

import sys

import numpy

from platoon.compat.channel import Worker
from platoon.compat.param_sync import EASGD

worker = Worker(control_port=int(sys.argv[1]), socket_timeout=20000)
params = [numpy.zeros((3, 4), dtype="float32")]
worker.init_shared_params(params, param_sync_rule=EASGD(0.5))
while True:
    step = worker.send_req("next")
    if step != "train":
        break
    params[0] += 1.0
    worker.sync_params(synchronous=True)
    assert worker.send_req(dict(done=10)) == "ok"
worker.close()
print("CLOSED", flush=True)
