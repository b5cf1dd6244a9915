"""A controller whose feeder thread fails at once: send_mb of an object-dtype array."""

import threading

import numpy as np

from platoon import Controller

with Controller() as ctl:
    ctl.init_data()
    feeder = threading.Thread(target=ctl.send_mb, args=([np.array([None], dtype=object)],),
                              name="feeder", daemon=True)
    feeder.start()
    ctl.serve()
