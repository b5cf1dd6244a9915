"""Attach to a centre segment, take its lock, say so, and wait to be killed.

usage: hold_lock.py SEGMENT_NAME [fork]
With "fork", it first forks a child that lives on (as a data-loader process would).
"""

import os
import signal
import sys

import numpy as np

from platoon._centre.shmem import SharedCentre
from platoon.protocol import layout_of

centre = SharedCentre.attach(sys.argv[1], layout_of([np.zeros(4)]))
centre.lock.acquire()
centre.arrays[0][:2] = 7.0  # half-way through an update when it dies
if sys.argv[2:] == ["fork"] and os.fork() == 0:
    signal.pause()  # the child outlives its parent; the test kills the group at teardown
print("LOCKED", flush=True)
signal.pause()  # until the test kills us
