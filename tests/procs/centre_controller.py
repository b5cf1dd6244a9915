"""A node's controller script for multi-node tests: serves, then saves the centre it ends with.

usage: python -m platoon.mpi --controller centre_controller.py --controller-args "OUT_DIR" ...
Node R checkpoints to OUT_DIR/final-nodeR.npz (the final checkpoint of serve()), saves
`ctl.centre` after serve() to OUT_DIR/centre-nodeR.npz and prints "CENTRE node R rounds N bytes B"
(B: the bytes its centre tie sent, from the controller's progress totals). A worker's request
"tie_rounds" is answered with the rounds its node's tie has run so far.
"""

import os
import sys

import numpy as np
from mpi4py import MPI

from platoon import Controller


class CentreController(Controller):
    def handle_control(self, req, worker_id, req_info):
        if req == "tie_rounds":
            return self.node_link.tie_rounds
        return super().handle_control(req, worker_id, req_info)


def main():
    out_dir = sys.argv[1]
    rank = MPI.COMM_WORLD.Get_rank()
    with CentreController(checkpoint_path=os.path.join(out_dir, "final-node%d.npz" % rank)) as ctl:
        ctl.serve(timeout_s=60)
        np.savez(os.path.join(out_dir, "centre-node%d.npz" % rank), *ctl.centre)
        print("CENTRE node %d rounds %d bytes %s" % (rank, ctl.node_link.tie_rounds,
                                                     ctl.progress.get("tie_bytes_sent")),
              flush=True)


if __name__ == "__main__":
    main()
