"""A worker with a momentum rule that dies part-way through its second push, at a chosen moment.

usage: momentum_pusher.py PORT RULE
  RULE  a name in RULES below
Pushes g = STEP once, then makes one page of its own mapping of the centre read-only
(mprotect; other processes' mappings keep writing), prints READY and pushes again. The
push's first write to that page kills the process (SIGSEGV: as abrupt as SIGKILL, no
Python code or handler runs, and no core is dumped): whatever the rule wrote before that
write stays, nothing after it happens. Prints SURVIVED if the push finished (the test then
fails).
"""

import ctypes
import mmap
import resource
import sys

import numpy as np

from platoon import SGD, Adam, DiLoCo, Downpour, Worker

SHAPE = (1 << 20,)  # 8 MB of float64: 8 stripes of 2 blocks
STEP = 0.015625  # 2**-6
WATCHED = 200_000  # an element in the middle of the second block of the second stripe
RULES = {
    "diloco": lambda: DiLoCo(0.7, 0.9, workers=2),
    "momentum": lambda: Downpour(SGD(0.5, 0.9)),
    "nesterov": lambda: Downpour(SGD(0.5, 0.9, nesterov=True)),
    "adam": lambda: Downpour(Adam(0.01, 0.9, 0.99)),
}


def protect_page_of(array, index):
    """Make the page holding ``array[index]`` read-only in this process."""
    address = array.ctypes.data + index * array.itemsize
    page = address - address % mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(ctypes.c_void_p(page), mmap.PAGESIZE, mmap.PROT_READ) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")


def main():
    port, name = int(sys.argv[1]), sys.argv[2]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    params = [np.zeros(SHAPE)]
    with Worker(control_port=port, timeout_s=30) as w:
        w.init_shared_params(params, RULES[name]())
        params[0] -= STEP
        w.sync_params()
        protect_page_of(w.shared_params[0], WATCHED)
        print("READY", flush=True)
        params[0] -= STEP
        w.sync_params()
        print("SURVIVED", flush=True)


if __name__ == "__main__":
    main()
