"""Where a worker stands in its job, as one object (`Placement`), given at registration: what
`platoon.shard`, the integrations' output directories, seeds and checkpoint names all read."""

import os
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Placement:
    """A worker's place: `local_rank` of `local_size` on its node; `global_rank` of
    `global_size` among every worker of the job where `placed_in_job` (False on an elastic
    node started without ``--slot``: they are then its node's own); `node_rank` of
    `num_nodes`; `elastic_node`, its node's name in an elastic job (else None)."""

    local_rank: int
    local_size: int
    global_rank: int
    global_size: int
    node_rank: int = 0
    num_nodes: int = 1
    elastic_node: Optional[str] = None
    placed_in_job: bool = True

    @classmethod
    def from_registration(cls, worker_id: int, info: Mapping[str, Any]) -> "Placement":
        """The placement the controller's registration answer `info` gives worker `worker_id`
        (its node link's topology; on one node, the node's own numbers)."""
        local_size = info.get("num_workers") or 1
        return cls(worker_id, local_size, info.get("global_rank", worker_id),
                   info.get("global_size", local_size), info.get("node_rank", 0),
                   info.get("num_nodes", 1), info.get("elastic_node"),
                   info.get("placed_in_job", True))

    @property
    def label(self) -> str:
        """``NODE/workerK`` in an elastic job (its node's name, its local rank: stable across a
        node's restarts), else ``workerK`` (its global rank): whole-job unique."""
        if self.elastic_node is not None:
            return os.path.join(self.elastic_node, "worker%d" % self.local_rank)
        return "worker%d" % self.global_rank

    @property
    def seed_offset(self) -> int:
        """What this worker adds to its script's seed so that no two workers of the job draw
        alike: its global rank, or in an elastic job a number made from `label`."""
        if self.elastic_node is not None:
            return zlib.crc32(self.label.encode())
        return self.global_rank

    @property
    def alone(self) -> bool:
        """Whether this worker is the whole job (it keeps its script's files and seed)."""
        return self.elastic_node is None and self.global_size == 1

    def files_and_seed(self) -> Optional[Tuple[str, int]]:
        """(`label`, `seed_offset`): this worker's directory under an output directory and its
        seed offset; None when it is the whole job."""
        return None if self.alone else (self.label, self.seed_offset)
