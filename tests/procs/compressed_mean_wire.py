"""compressed_mean over a real network device: each rank (one per network namespace, see
`two_hosts` in tests/mpi/test_mpi.py) counts the bytes it sent by compressed_mean's count and by its
device's tx_bytes, for every codec: prints "WIRE rank R CODEC counted C wire W".

usage: mpiexec ... python compressed_mean_wire.py DEVICE
"""

import sys

import numpy as np
from mpi4py import MPI

from platoon.mpi.compress import compressed_mean
from platoon.node.compress import ErrorFeedback, make_codec


def main():
    device = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def tx_bytes():
        with open("/sys/class/net/%s/statistics/tx_bytes" % device) as f:
            return int(f.read())

    n = 1 << 18
    x = np.random.default_rng(rank).normal(size=n).astype(np.float32)
    for name in ("float32", "int8", "int4"):
        codec = make_codec(name)
        feedback = None if name == "float32" else ErrorFeedback(n)
        compressed_mean(comm, x, codec, feedback)  # connections made, buffers warm
        comm.Barrier()
        before, counted = tx_bytes(), 0
        for _ in range(8):
            counted += compressed_mean(comm, x, codec, feedback)[1]
        comm.Barrier()
        print("WIRE rank %d %s counted %d wire %d" % (rank, name, counted, tx_bytes() - before),
              flush=True)


if __name__ == "__main__":
    main()
