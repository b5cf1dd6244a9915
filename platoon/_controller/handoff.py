"""How a node runner hands its controller the link to the other nodes (a
`services.NodeLinkProtocol`: `platoon.mpi.NodeLink`, an elastic node's `ElasticLink`).

A controller class is created by its node runner (`platoon.node.runner.run_controller`),
which passes the link (``cls(host=..., node_link=link)``). A controller script creates its
Controller itself, so the runner offers the link for as long as the script runs (`offered`,
a context variable set in the runner's thread and reset when the script returns), and the
Controller, seeing PLATOON_MPI_NODE, takes it (`node_link_for`). Nothing here imports a
runner or the controller.
"""

import contextlib
import contextvars
from typing import Any, Iterator, Optional

from ..errors import PlatoonError
from .services import NodeLinkProtocol

_OFFERED: "contextvars.ContextVar[Optional[NodeLinkProtocol]]" = contextvars.ContextVar(
    "platoon_node_link", default=None)


@contextlib.contextmanager
def offered(link: NodeLinkProtocol) -> Iterator[None]:
    """Offer `link` to the Controller created in this block (by a controller script)."""
    token = _OFFERED.set(link)
    try:
        yield
    finally:
        _OFFERED.reset(token)


def node_link_for(controller: Any, link: Optional[NodeLinkProtocol] = None) -> NodeLinkProtocol:
    """The node link of this process for `controller` (created by a node runner, which sets
    PLATOON_MPI_NODE: ``python -m platoon.mpi``, ``python -m platoon.elastic.node``): `link`
    if given, else the one the runner offers. Raises PlatoonError where there is none, or
    where the controller expects another number of workers than the link."""
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
