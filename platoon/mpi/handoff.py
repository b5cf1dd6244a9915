"""How a rank's controller gets its `NodeLink` from `run_node`.

A controller class is created by `run_node` itself, which passes the link
(``cls(host=..., node_link=link)``). A controller script creates its Controller
itself, so `run_node` offers the link for as long as the script runs (`offered`,
a context variable set in run_node's thread and reset when the script returns), and
the Controller, seeing PLATOON_MPI_NODE, takes it (`node_link_for`). Nothing here
imports the runner or the controller.
"""

import contextlib
import contextvars
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ..errors import PlatoonError

if TYPE_CHECKING:
    from .link import NodeLink

_OFFERED: "contextvars.ContextVar[Optional[NodeLink]]" = contextvars.ContextVar(
    "platoon_node_link", default=None)


@contextlib.contextmanager
def offered(link: "NodeLink") -> Iterator[None]:
    """Offer `link` to the Controller created in this block (by a controller script)."""
    token = _OFFERED.set(link)
    try:
        yield
    finally:
        _OFFERED.reset(token)


def node_link_for(controller: Any, link: "Optional[NodeLink]" = None) -> "NodeLink":
    """The NodeLink of this rank for `controller` (created under `python -m platoon.mpi`,
    which sets PLATOON_MPI_NODE): `link` if given, else the one `run_node` offers.
    Raises PlatoonError where there is none, or where the controller expects another
    number of workers than the link."""
    if link is None:
        link = _OFFERED.get()
    if link is None:
        raise PlatoonError("PLATOON_MPI_NODE is set but this process was not started by "
                           "python -m platoon.mpi (or platoon.mpi.run_node); unset it")
    if controller.num_workers != link.num_workers:
        raise PlatoonError("the controller expects %s workers but platoon.mpi starts %d on this "
                           "node; leave num_workers to the environment (PLATOON_NUM_WORKERS)"
                           % (controller.num_workers, link.num_workers))
    return link
