"""The centre tie's final round, its bytes (mpiexec -n 2).

Drives `TieThread._final_round` by hand on stand-ins for the controller's centre (see
outer_round.py), a float32 and a float64 array (300 + 20 values: 1360 bytes as they are):

- "equal": both ranks' centres the same bits (one seed). The round must send no centre, only
  its hash (sha256, 32 bytes to the other rank), and leave both centres as they were.
- "unequal": seeds of their own. Hash and centres (32 + 1360 bytes from each rank), both end
  with their exact mean.
- "handover": rank 0 handed its centre over earlier (its centre differs): rank 1's centre is
  copied to rank 0 (32 + 1360 bytes from rank 1, 32 from rank 0).
- "nan": equal centres holding a NaN. Both ranks must raise NonFiniteValues naming both.

Prints "OK rank R CASE sent B" for each case.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outer_round import ByHand, Controller, check  # noqa: E402

from platoon.errors import NonFiniteValues  # noqa: E402
from platoon.mpi.tie import CentreTie  # noqa: E402


def final_round(comm, case):
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank if case in ("unequal", "handover") else 7)
    arrays = [rng.normal(size=300).astype(np.float32), rng.normal(size=(4, 5))]
    if case == "nan":
        arrays[0][3] = np.nan
    start = comm.allgather([a.copy() for a in arrays])
    tie = ByHand(CentreTie(every_s=1.0, compress="int8"), comm, Controller(arrays),
                 lambda code: None)
    tie._handed_over = case == "handover" and rank == 0
    try:
        tie._final_round()
    except NonFiniteValues as exc:
        check(case == "nan" and exc.ranks == [0, 1], "refused: %s %s" % (exc, exc.ranks))
        return tie
    check(case != "nan", "a NaN in both centres was not refused")
    for a, x, y in zip(arrays, *start):
        exact = y if case == "handover" else ((x.astype(np.float64) + y) / 2).astype(a.dtype)
        check(np.array_equal(a, exact), "%s: the final round is not the mean" % case)
    got = comm.allgather([a.tobytes() for a in arrays])
    check(got[0] == got[1], "%s: the ranks' centres differ" % case)
    return tie


def main():
    comm = MPI.COMM_WORLD
    for case in ("equal", "unequal", "handover", "nan"):
        tie = final_round(comm, case)
        print("OK rank %d %s sent %d" % (comm.Get_rank(), case, tie.bytes_sent), flush=True)


if __name__ == "__main__":
    sys.exit(main())
