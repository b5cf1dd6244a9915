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
    node1 = types.SimpleNamespace(worker_id=0, num_workers=2, global_rank=2, global_size=4)
    assert list(shard(10, node1, shuffle=False)) == [2, 6]
    unknown = types.SimpleNamespace(worker_id=1, num_workers=None, global_rank=1, global_size=1)
    with pytest.raises(ValueError, match="not told how many workers.*num_workers"):
        shard(10, unknown)
    with pytest.raises(ValueError, match="give the size too, or pass the platoon.Worker"):
        shard(10, 1)
