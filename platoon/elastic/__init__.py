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

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client import LighthouseClient
    from .dataplane import QuorumGroup
    from .quorum import MembershipSettings, Quorum
    from .secret import generate_secret, load_secret
    from .store import StoreServer

# each name from its module when first used: a node starts its workers before it loads pyzmq
# and numpy (the client, the tie), torch only when the data plane is used
_HOMES = {"LighthouseClient": "client", "MembershipSettings": "quorum", "Quorum": "quorum",
          "QuorumGroup": "dataplane", "StoreServer": "store", "generate_secret": "secret",
          "load_secret": "secret"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError("module 'platoon.elastic' has no attribute %r" % name)
    return getattr(importlib.import_module("." + home, __name__), name)


__all__ = ["LighthouseClient", "MembershipSettings", "Quorum", "QuorumGroup", "StoreServer",
           "generate_secret", "load_secret"]
