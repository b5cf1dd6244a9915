"""Data sharding: disjoint, complete, deterministic, reshuffled per epoch."""

import types

import numpy as np
import pytest

from platoon.sharding import shard


@pytest.mark.parametrize("n,size", [(10, 3), (7, 7), (3, 5), (0, 2), (1000, 4)])
def test_shards_are_disjoint_and_cover_everything(n, size):
    files = ["part-%05d" % i for i in range(n)]
    for epoch in range(3):
        parts = [shard(files, r, size, epoch=epoch, seed=1) for r in range(size)]
        flat = [f for p in parts for f in p]
        assert sorted(flat) == sorted(files) and len(set(flat)) == n
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_deterministic_per_epoch_and_different_across_epochs():
    a = shard(100, 1, 4, epoch=3, seed=7)
    assert np.array_equal(a, shard(100, 1, 4, epoch=3, seed=7))
    assert not np.array_equal(a, shard(100, 1, 4, epoch=4, seed=7))
    assert list(shard(10, 1, 3, shuffle=False)) == [1, 4, 7]


def test_drop_last_gives_equal_shards():
    parts = [shard(10, r, 3, drop_last=True) for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert len(set(np.concatenate(parts))) == 9


def test_bad_rank_or_size():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        shard(10, 2, 2)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        shard(10, 0, 0)


def test_a_worker_gives_its_place_in_the_whole_job():
    """shard(items, w): the worker's global rank and size (every node's workers count)."""
    from platoon.placement import Placement
    node1 = types.SimpleNamespace(worker_id=0, num_workers=2,
                                  placement=Placement(0, 2, global_rank=2, global_size=4))
    assert list(shard(10, node1, shuffle=False)) == [2, 6]
    unknown = types.SimpleNamespace(worker_id=1, num_workers=None, placement=Placement(1, 1, 1, 1))
    with pytest.raises(ValueError, match="not told how many workers.*num_workers"):
        shard(10, unknown)
    with pytest.raises(ValueError, match="give the size too, or pass the platoon.Worker"):
        shard(10, 1)


def test_a_placement_names_a_worker_and_its_seed_once_for_the_whole_job():
    """`Placement`: ``workerK`` and K in a fixed world; ``NODE/workerK`` and a number made from
    it in an elastic job (stable across a node's restarts, distinct for two nodes' worker 0);
    alone, nothing to change."""
    from platoon.placement import Placement
    fixed = Placement.from_registration(1, {"num_workers": 2, "global_rank": 3,
                                            "global_size": 4, "node_rank": 1, "num_nodes": 2})
    assert (fixed.label, fixed.seed_offset, fixed.node_rank) == ("worker3", 3, 1)
    a = Placement.from_registration(0, {"num_workers": 1, "elastic_node": "a",
                                        "placed_in_job": False})
    b = Placement.from_registration(0, {"num_workers": 1, "elastic_node": "b",
                                        "placed_in_job": False})
    assert a.files_and_seed() == ("a/worker0", a.seed_offset) and a.seed_offset != b.seed_offset
    assert not a.placed_in_job and a.global_rank == 0 and a.global_size == 1
    assert Placement.from_registration(0, {}).files_and_seed() is None
