"""Jobs across nodes: one controller per MPI rank, linked through mpi4py.

platoon works without mpi4py on one node: it is imported only when a link is
made. Run one controller per node with::

    mpiexec -n NODES python -m platoon.mpi --workers N [--controller SCRIPT.py | MOD:CLASS]
        [--tie-every-s S] [--tie-every-syncs K] [--tie-beta B] [--tie-compress C]
        [--tie-outer easgd|diloco [--tie-outer-lr L] [--tie-outer-momentum M]]
        -- WORKER_COMMAND...

Each rank (`run_node`) sets the ``PLATOON_*`` environment and runs the
controller (a script as platoon-launcher runs it, or a class); the Controller
sees PLATOON_MPI_NODE and takes this rank's `NodeLink` (`node_link_for`).
Once it serves, the rank starts N workers running WORKER_COMMAND. Through the
link, all_reduce and barrier span the job, every worker learns its global
rank, and an optional `CentreTie` keeps the node centres tied (hierarchical
EASGD, or DiLoCo's outer step).

A failure anywhere ends the job: a worker that exits non-zero or a controller
error makes the rank call MPI_Abort; a rank that dies makes ``mpiexec`` kill
the others; a `platoon.node.reaper` per rank then stops that rank's workers and
unlinks its shared memory.

The controller's MPI calls run in its serve thread (collectives, which block
it only while all of the node's workers wait in that collective anyway) and
in the tie thread, on separate duplicated communicators; this needs
MPI_THREAD_MULTIPLE, which mpi4py requests by default.

Modules: `link` (NodeLink), `tie` (the tie thread's rounds over MPI), `compress`
(`compressed_mean` over MPI), `runner` (run_node, main), `_comm` (mpi4py's import, patient
waits, abort); this one only re-exports them. What an elastic node runs too lives in the node
layer, `platoon.node` (the codecs, the outer step, the node runner's parts, the reaper); how a
controller gets its link, in `platoon._controller.handoff`.
"""

from .._controller.handoff import node_link_for
from ._comm import ABORT_GRACE_S, import_mpi
from .link import NodeLink
from .runner import load_controller_class, main, run_node
from .tie import CentreTie

__all__ = ["CentreTie", "NodeLink", "node_link_for", "run_node", "main", "import_mpi",
           "load_controller_class", "ABORT_GRACE_S"]
