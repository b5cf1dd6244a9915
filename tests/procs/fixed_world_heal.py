"""A fixed world heals a member whose anchor differs (mpiexec -n 2).

Drives the fixed world's tie rounds by hand (see outer_round.py), DiLoCo over int8, a float32
and a float64 array (300 + 20 values: 1360 bytes; the anchor and its momentum, 2720). After the
first anchor and two outer rounds, rank 1's anchor is made to differ (as a member's would after
missing a round, or a flipped bit): the next round must be a heal, rank 0 sending its anchor
and momentum losslessly (2720 bytes to the one member that differs), rank 1 taking them
(keeping what its workers added since its old anchor: its move), then, in the same round, an
outer round of both; the rounds after are outer rounds again, and after both hand over, the
final agreement leaves both centres the same bits.

Prints "OK rank R healed, sent B" on success.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outer_round import by_hand, check  # noqa: E402

from platoon.mpi.tie import CentreTie  # noqa: E402


def main():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank)
    arrays = [rng.normal(size=300).astype(np.float32), rng.normal(size=(4, 5))]
    tie = by_hand(comm, CentreTie(every_s=1.0, compress="int8", outer="diloco"), arrays)
    for _ in range(3):  # the first anchor, two outer rounds
        tie._round()
    check(tie.round_no == 2, "three rounds made round_no %d" % tie.round_no)
    lossless_before, sent_rounds = tie.lossless_bytes, tie.sent_rounds
    if rank == 1:  # its anchor differs; its workers' work since then must stay
        tie.anchor[0][5] += 1.0
        tie._digest = None
        arrays[0][7] += 0.5
    tie._round()  # the heal, and an outer round with it
    anchors = comm.allgather([a.tobytes() for a in tie.anchor + tie.velocity])
    check(anchors[0] == anchors[1], "the heal left the anchors different")
    check(tie.heals == (1 if rank == 1 else 0), "heals %d" % tie.heals)
    check(tie.round_no == 3 and tie.sent_rounds == sent_rounds + 1,
          "the heal's round made no outer round with both moves (round_no %d)" % tie.round_no)
    healed = tie.lossless_bytes - lossless_before
    check(healed == (2720 if rank == 0 else 0), "the heal sent %d bytes" % healed)
    tie._round()  # an outer round again
    check(tie.round_no == 4, "after the heal, round_no %d" % tie.round_no)
    tie.node_done()
    tie._round()  # both hand their centres over
    check(tie._handed_over, "not handed over")
    check(tie._round() is True, "no final agreement")
    centres = comm.allgather([a.tobytes() for a in arrays])
    check(centres[0] == centres[1], "the final centres differ")
    print("OK rank %d healed, sent %d" % (rank, healed), flush=True)


if __name__ == "__main__":
    sys.exit(main())
