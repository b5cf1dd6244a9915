"""Deterministic data sharding: each worker of the job gets a disjoint part of the inputs."""

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from .worker import Worker


def shard(items: Union[int, Sequence[Any]], rank: Union[int, "Worker"],
          size: Optional[int] = None, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
          drop_last: bool = False) -> Union[List[Any], np.ndarray]:
    """The part of `items` that worker `rank` of `size` reads in `epoch`.

    ``shard(items, w)`` with a `platoon.Worker` `w` (and no `size`) takes its place in the
    whole job, ``w.global_rank`` of ``w.global_size``: every worker of every node gets its
    own part, on one node or many (in an elastic job, by the node's slot: each slot its own
    part, whoever holds it now), and the whole of `items` when the script runs alone.

    `items` is a sequence (file names, ...) or an int n meaning ``range(n)``.
    With shuffle=True the items are permuted by a generator seeded with
    (`seed`, `epoch`), the same on every worker, then dealt round-robin, so
    the shards of one epoch are disjoint and cover every item; each epoch
    deals a new permutation. drop_last=True drops the remainder so every
    worker gets exactly ``len(items) // size`` items (equal step counts for
    synchronous SGD). Pass the worker itself (or ``worker.global_rank,
    worker.global_size``) to split across every worker of every node. Returns a list (an int array
    for an int `items`). Raises ValueError for a bad rank or size, for a worker whose
    controller was not told its number of workers (the job's size is then unknown), or for a
    worker of an elastic node started without a slot (``--slot I --slots N``).
    """
    if size is None:
        rank, size = _place_in_job(rank)
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError("shard size must be a positive integer, got %r" % (size,))
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise ValueError("shard rank must be in [0, %d), got %r" % (size, rank))
    if isinstance(items, (int, np.integer)):
        if items < 0:
            raise ValueError("shard of a negative number of items: %r" % (items,))
        n, pick = int(items), None
    else:
        items = list(items)
        n, pick = len(items), items
    order = np.arange(n)
    if shuffle:
        order = np.random.default_rng([int(seed), int(epoch)]).permutation(n)
    if drop_last:
        order = order[:n - n % size]
    mine = order[rank::size]
    return mine if pick is None else [pick[i] for i in mine]


def _place_in_job(worker):
    """(global rank, global size) of a Worker, for `shard(items, worker)`: its placement's."""
    placement = getattr(worker, "placement", None)
    if placement is None:
        raise ValueError("shard(items, rank, size): give the size too, or pass the "
                         "platoon.Worker itself (shard(items, w)), got rank %r and no size"
                         % (worker,))
    if not placement.placed_in_job:
        raise ValueError("shard(items, w): worker %s is on elastic node %s, started without "
                         "--slot I --slots N, so its place among the job's workers is unknown "
                         "and every node would read the same part; give each node its slot "
                         "(platoon-launcher --elastic does), or split by the node's name "
                         "yourself (w.elastic_node)" % (worker.worker_id, worker.elastic_node))
    if worker.num_workers is None:
        raise ValueError("shard(items, w): worker %s's controller was not told how many "
                         "workers the job has, so its shards are unknown; give the "
                         "Controller num_workers (platoon-launcher and platoon.mpi do)"
                         % worker.worker_id)
    return placement.global_rank, placement.global_size
