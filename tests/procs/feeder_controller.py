"""A controller script run by hand (no launcher) whose feeder thread fails while serve() runs:
it sends one minibatch, then one of object dtype. Prints PORTS <control> <data>, then
SERVE RAISED <type>: <message> and THREAD FRAMES <whether the traceback holds the feeder's>.
"""

import threading
import traceback

import numpy as np

from platoon import Controller


def feed(ctl):
    ctl.send_mb([np.zeros(1)], timeout_s=30)  # waits for the worker to ask
    ctl.send_mb([np.array([None], dtype=object)])


with Controller(control_port=0, data_port=0, num_workers=1) as ctl:
    print("PORTS %d %d" % (ctl.control_port, ctl.data_port), flush=True)
    threading.Thread(target=feed, args=(ctl,), name="feeder", daemon=True).start()
    try:
        ctl.serve(timeout_s=60)
        print("SERVE RETURNED", flush=True)
    except Exception as exc:
        frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        print("SERVE RAISED %s: %s" % (type(exc).__name__, str(exc).splitlines()[0]), flush=True)
        print("THREAD FRAMES %s" % ("feed" in frames and "serve" in frames), flush=True)
