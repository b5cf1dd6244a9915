"""A redo journal in shared memory: block updates of several arrays, all or nothing under SIGKILL.

A rule that changes several shared arrays per element (the centre, a momentum, a
counter) cannot write them all at once: a worker killed part-way through a block
would leave elements with some arrays moved and not others, which no order of
whole pushes explains. So a block's new values go first into the journal slot of
the lock being held (one slot per stripe), then a committed flag is set with one
aligned 8-byte store, then the values are copied to their places and the flag is
cleared. Whoever takes the lock next calls `recover`: a committed slot is copied
again (the copy is idempotent), one not committed is ignored. Killed before the
flag, the block keeps its old values; after it, the next holder completes it.
"""

from typing import Any, Callable, List, Sequence

import numpy as np

_FLAG, _INDEX, _START, _COUNT = range(4)


def journal_layout(slots: int, block: int, dtypes: Sequence[Any]) -> List[dict]:
    """The shared-state layout of a journal: a header per slot, then one row of `block`
    elements per slot for each of `dtypes` (one per array a record updates)."""
    return [{"dtype": "<i8", "shape": [slots, 4]}] + [
        {"dtype": np.dtype(d).str, "shape": [slots, block]} for d in dtypes]


class Journal:
    """Journal slots over `arrays` (laid out by `journal_layout`); `targets(index)` gives
    parameter `index`'s flat destination arrays, one per row, in the rows' order."""

    def __init__(self, arrays: List[np.ndarray], targets: Callable[[int], List[np.ndarray]]):
        self._header, self._rows = arrays[0], arrays[1:]
        self._targets = targets

    def staging(self, slot: int, n: int) -> List[np.ndarray]:
        """The rows of `slot` to write a block's new values into (n elements each)."""
        return [row[slot, :n] for row in self._rows]

    def commit(self, slot: int, index: int, start: int, n: int) -> None:
        """The staged values are the new ``[start, start+n)`` of parameter `index`: commit
        them, then copy them to their places."""
        header = self._header[slot]
        header[_INDEX], header[_START], header[_COUNT] = index, start, n
        header[_FLAG] = 1  # the commit point: one store, after the record it validates
        self.recover(slot)

    def recover(self, slot: int) -> None:
        """Finish `slot`'s committed record, if any (the caller holds the slot's lock)."""
        header = self._header[slot]
        if not header[_FLAG]:
            return
        index, start, n = int(header[_INDEX]), int(header[_START]), int(header[_COUNT])
        for dst, row in zip(self._targets(index), self._rows):
            dst[start:start + n] = row[slot, :n]
        header[_FLAG] = 0
