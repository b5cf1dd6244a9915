"""A worker script that never calls close(): platoon closes it at exit."""

import numpy as np

from platoon import EASGD, Worker

w = Worker()
w.init_shared_params([np.zeros(10)], EASGD(0.5))
w.sync_params()
