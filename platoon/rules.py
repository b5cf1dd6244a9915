"""Parameter synchronisation rules: how a worker's parameters and the centre move together.

A rule updates numpy arrays in place and knows nothing of sockets or locks; the
worker calls it while holding the centre's lock. Built-in rules walk the arrays
in cache-sized blocks with one preallocated scratch buffer, so a sync reads and
writes each byte of local and central parameters once, with no temporaries,
and gives bit-for-bit the result of the plain formula.
"""

import numpy as np

BLOCK_ELEMENTS = 1 << 16  # 256 KiB of float32: stays in L2 while a block is updated


class ParamSyncRule:
    """Base class of sync rules. Subclass it and override `update` (and `setup` for state).

    One instance belongs to one worker; `Worker.init_shared_params` calls
    `check` before sharing, `setup` once the worker's parameters equal the centre, then every
    `sync_params` calls `update_params` under the centre's lock.
    """

    def check(self, local_params):
        """Raise TypeError or ValueError if this rule cannot sync these arrays."""

    def setup(self, local_params):
        """Prepare per-worker state; `local_params` already equal the centre."""

    def update_params(self, local_params, central_params):
        """Apply the rule to every (local, central) pair of arrays, in place."""
        for index, (local, central) in enumerate(zip(local_params, central_params)):
            self.update(index, local, central)

    def update(self, index, local, central):
        """Update parameter number `index`: `local` and `central` are same-shaped arrays."""
        raise NotImplementedError("%s must implement update(index, local, central)"
                                  % type(self).__name__)

    # -- helpers for block-wise kernels --

    def _scratch(self, dtype):
        cache = self.__dict__.setdefault("_scratch_buffers", {})
        buf = cache.get(dtype)
        if buf is None:
            buf = cache[dtype] = np.empty(BLOCK_ELEMENTS, dtype)
        return buf

    def _blocks(self, *arrays):
        """Yield aligned 1-D blocks of same-shaped C-contiguous arrays plus a scratch block."""
        flats = [a.reshape(-1) for a in arrays]
        scratch = self._scratch(arrays[0].dtype)
        n = flats[0].size
        for start in range(0, n, BLOCK_ELEMENTS):
            stop = min(start + BLOCK_ELEMENTS, n)
            yield [f[start:stop] for f in flats] + [scratch[:stop - start]]


def _require_float(rule, params):
    for i, p in enumerate(params):
        if p.dtype.kind not in "fc":
            raise TypeError("%s needs floating-point parameters, but parameter %d is %s"
                            % (type(rule).__name__, i, p.dtype))


def _all_contiguous(*arrays):
    return all(a.flags.c_contiguous for a in arrays)


class EASGD(ParamSyncRule):
    """Elastic averaging SGD (Zhang, Choromanska, LeCun 2015).

    With ``d = alpha * (x - c)``: ``x -= d; c += d``. `alpha` in (0, 1] is the
    elastic force; 0.5 moves both halfway. Raises ValueError for other values.
    """

    def __init__(self, alpha):
        alpha = float(alpha)
        if not 0.0 < alpha <= 1.0:
            raise ValueError("EASGD alpha must be in (0, 1], got %r; a common choice is "
                             "0.9 / number_of_workers" % alpha)
        self.alpha = alpha

    def check(self, local_params):
        _require_float(self, local_params)

    def update(self, index, local, central):
        alpha = self.alpha
        if not _all_contiguous(local, central):
            diff = alpha * (local - central)
            local -= diff
            central += diff
            return
        for x, c, d in self._blocks(local, central):
            np.subtract(x, c, out=d)
            d *= alpha
            x -= d
            c += d

    def __repr__(self):
        return "EASGD(alpha=%r)" % self.alpha


class ASGD(ParamSyncRule):
    """Asynchronous SGD: the centre receives the worker's change since its last sync,
    then the worker takes the centre (``c += x - x_last; x = c; x_last = c``)."""

    def check(self, local_params):
        _require_float(self, local_params)

    def setup(self, local_params):
        self._last = [np.array(p, copy=True, order="C") for p in local_params]

    def update(self, index, local, central):
        last = self._last[index]
        if not _all_contiguous(local, central):
            central += local - last
            local[...] = central
            last[...] = central
            return
        for x, c, x_last, d in self._blocks(local, central, last):
            np.subtract(x, x_last, out=d)
            c += d
            x[...] = c
            x_last[...] = c

    def __repr__(self):
        return "ASGD()"
