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
the others; a `platoon.launch.reaper` per rank then stops that rank's workers and
unlinks its shared memory.

The controller's MPI calls run in its serve thread (collectives, which block
it only while all of the node's workers wait in that collective anyway) and
in the tie thread, on separate duplicated communicators; this needs
MPI_THREAD_MULTIPLE, which mpi4py requests by default.

Modules: `link` (NodeLink), `tie` (CentreTie and its rounds), `handoff` (how the
controller gets its link), `runner` (run_node, main; loaded on first use, so the
controller, which imports `handoff`, and the runner, which imports the controller,
make no circle); this one only re-exports them.
"""

import importlib
from typing import TYPE_CHECKING

from ._comm import ABORT_GRACE_S, import_mpi
from .handoff import node_link_for
from .link import NodeLink
from .tie import CentreTie

if TYPE_CHECKING:
    from .runner import load_controller_class, main, run_node

_RUNNER_NAMES = ("load_controller_class", "main", "run_node")  # loaded on first use (PEP 562)


def __getattr__(name):
    if name in _RUNNER_NAMES:
        value = getattr(importlib.import_module(".runner", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError("module 'platoon.mpi' has no attribute %r" % name)


__all__ = ["CentreTie", "NodeLink", "node_link_for", "run_node", "main", "import_mpi",
           "load_controller_class", "ABORT_GRACE_S"]
