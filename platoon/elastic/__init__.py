"""Elastic jobs across nodes: nodes that come and go (docs/multi-node.md).

- `node`: one node's controller and workers (``python -m platoon.elastic.node --join``);
  `nodestatus`: its status file (its state, quorum and final result, for the launcher).
- `link`, `tie`: the node controller's link (`ElasticLink`) and its centre tie
  (`ElasticTie`: DiLoCo's outer step per quorum, healing, the final agreement).

- `lighthouse`: the small process that nodes register and heartbeat with, and that numbers
  their quorums (``python -m platoon.elastic.lighthouse``); pyzmq only.
- `client`: a node's side of it (`LighthouseClient`).
- `quorum`: what a quorum is and the membership rule (pure logic).
- `secret`: the job's secret and the signatures on every message.
- `store`: each node's rendezvous store, served to the job's nodes only (`StoreServer`).
- `dataplane`: a torch.distributed gloo group per quorum for the outer round's compressed
  messages (`QuorumGroup`); the only module that imports torch, on first use.
"""

from typing import TYPE_CHECKING

from .client import LighthouseClient
from .quorum import MembershipSettings, Quorum
from .secret import generate_secret, load_secret
from .store import StoreServer

if TYPE_CHECKING:
    from .dataplane import QuorumGroup


def __getattr__(name: str) -> object:
    if name == "QuorumGroup":  # torch only when the data plane is used
        from . import dataplane
        return getattr(dataplane, name)
    raise AttributeError("module 'platoon.elastic' has no attribute %r" % name)


__all__ = ["LighthouseClient", "MembershipSettings", "Quorum", "QuorumGroup", "StoreServer",
           "generate_secret", "load_secret"]
