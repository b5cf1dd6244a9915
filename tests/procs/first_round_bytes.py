"""DiLoCo's first round of the centre tie, its bytes (mpiexec -n 2).

Drives the fixed world's first tie round by hand on stand-ins for the controller's centre (see
outer_round.py), float32 codec, for three pairs of starting centres (a float32 and a float64
array, 300 + 20 values: 1360 bytes as they are):

- "equal": both ranks from the same seed. The round must send no centre (their sha256s in the
  round's headers are equal) and leave both centres as they were.
- "unequal": seeds of their own. The round must send the centres losslessly (1360 bytes) and
  make both centres their exact mean.
- "nan": equal centres holding a NaN. Both ranks must raise NonFiniteValues naming both.

Prints "OK rank R CASE sent B lossless L" for each case.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outer_round import by_hand, check  # noqa: E402

from platoon.errors import NonFiniteValues  # noqa: E402
from platoon.mpi.tie import CentreTie  # noqa: E402


def first_round(comm, case):
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank if case == "unequal" else 7)
    arrays = [rng.normal(size=300).astype(np.float32), rng.normal(size=(4, 5))]
    if case == "nan":
        arrays[0][3] = np.nan
    start = comm.allgather([a.copy() for a in arrays])
    tie = by_hand(comm, CentreTie(every_s=1.0, compress="float32", outer="diloco"), arrays)
    try:
        tie._round()
    except NonFiniteValues as exc:
        check(case == "nan" and exc.ranks == [0, 1], "refused: %s %s" % (exc, exc.ranks))
        return "refused", tie
    check(case != "nan", "a NaN in both centres was not refused")
    for a, x, y in zip(arrays, *start):
        exact = ((x.astype(np.float64) + y) / 2).astype(a.dtype)
        check(np.array_equal(a, exact), "%s: the first round is not the mean" % case)
    got = comm.allgather([a.tobytes() for a in arrays])
    check(got[0] == got[1], "%s: the ranks' centres differ" % case)
    return "ok", tie


def main():
    comm = MPI.COMM_WORLD
    for case in ("equal", "unequal", "nan"):
        _, tie = first_round(comm, case)
        print("OK rank %d %s sent %d lossless %d" % (comm.Get_rank(), case, tie.bytes_sent,
                                                      tie.lossless_bytes), flush=True)


if __name__ == "__main__":
    sys.exit(main())
