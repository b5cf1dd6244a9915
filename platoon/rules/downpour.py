"""Downpour: workers push their accumulated update, an optimizer next to the centre applies it.

The parameter server's "update on server" mode. At each sync a worker sends
``g = x_last - x`` (the descent it made since its last sync, the sum of its
local steps); the centre's optimizer applies ``g`` as a gradient, then the
worker takes the centre. The optimizer's state (momentum, Adam moments and
step count) lives in a shared-memory segment next to the centre, owned by the
controller (`Controller.shared_states`), so it persists across syncs and
workers and can be checkpointed with the centre. Updates run under the
centre's lock, so state and centre change together.

With an elementwise optimizer (SGD, with or without momentum) Downpour is
elementwise too: it syncs stripe by stripe, each under its stripe's lock with
the optimizer state sliced alike, and supports `Worker.start_sync`. With `SGD`
(or DiLoCo's SGD on g/p: an optimizer whose `kernel_settings` says so) on
C-contiguous float32 or float64 it runs a compiled one-pass kernel
(`platoon.rules.kernels`); otherwise the optimizer's `apply_block` in cache-sized
blocks with preallocated scratch. The result is bit-for-bit that of the
whole-parameter formulas either way. An elementwise optimizer with state (SGD with
momentum) writes each block of a push through a journal in shared memory
(`platoon.rules.journal`, the state `state_name + "-journal"`): a worker killed
mid-push leaves each block whole or untouched, centre and state together, never
a momentum that disagrees with its centre. Adam is not elementwise (its step
count is per parameter, and a sync of one parameter may interleave stripe by
stripe with another worker's), so Downpour(Adam) keeps one lock around the whole
centre; it too writes each block through a journal (one slot), and its step count
advances once all blocks of a parameter are committed: a push cut part-way by a
kill is not counted.

``Downpour(SGD(lr=1.0))`` is exactly ASGD.
"""

import bisect
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import kernels
from .base import (
    BLOCK_ELEMENTS,
    ParamSyncRule,
    RuleContext,
    SyncKernels,
    require_float,
    stripes_of,
    take_pull,
)
from .journal import Journal, journal_layout

Layout = List[Dict[str, Any]]  # [{"dtype": "<f4", "shape": [3, 4]}, ...], as protocol.layout_of


class SGD:
    """SGD with optional (Nesterov) momentum: ``v = momentum*v + g; c -= lr*v``
    (Nesterov: ``c -= lr*(g + momentum*v)``). Raises ValueError for lr <= 0 or
    momentum outside [0, 1)."""

    elementwise = True  # apply_block may update any slice of a parameter on its own

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False) -> None:
        self.lr, self.momentum, self.nesterov = float(lr), float(momentum), bool(nesterov)
        if not self.lr > 0:
            raise ValueError("SGD lr must be > 0, got %r" % lr)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError("SGD momentum must be in [0, 1), got %r" % momentum)
        if nesterov and not self.momentum:
            raise ValueError("Nesterov SGD needs momentum > 0")

    def state_layout(self, layout: Layout) -> Layout:
        """Layout of this optimizer's state for parameters of `layout`."""
        return [dict(e) for e in layout] if self.momentum else []

    def kernel_settings(self) -> Optional[Tuple[float, float, bool, float]]:
        """``(lr, momentum, nesterov, divisor)`` for the compiled kernel
        (`platoon.rules.kernels.sgd`), or None when a subclass changed the arithmetic."""
        cls = type(self)
        if cls.apply_block is not SGD.apply_block or cls.state_layout is not SGD.state_layout:
            return None
        return self.lr, self.momentum, self.nesterov, 1.0

    def apply(self, index: int, central: np.ndarray, g: np.ndarray,
              state: Sequence[np.ndarray]) -> None:
        """Apply descent `g` to `central` (parameter `index`), updating `state` in place;
        `g` is left as it was."""
        g = np.array(g, copy=True)
        scratch = np.empty_like(g) if self.momentum and self.nesterov else g
        self._step(central, g, state[index] if self.momentum else None, scratch, descend=True)

    def apply_block(self, central: np.ndarray, g: np.ndarray, state: Sequence[np.ndarray],
                    scratch: np.ndarray) -> None:
        """`apply` on one block: `g` (clobbered) and `scratch` are scratch of the block's
        size, `state` the blocks of this parameter's state arrays. Same operations in
        the same order as `apply`, so bit-identical."""
        self._step(central, g, state[0] if self.momentum else None, scratch, descend=True)

    def apply_move(self, central: np.ndarray, move: np.ndarray, velocity: np.ndarray) -> None:
        """The same step given a move ``d = -g`` (where the parameters went) and the momentum
        of moves ``u = -v``, in place: ``u = mu*u + d; central += lr*(d + mu*u)`` (Nesterov;
        ``lr*u`` without, ``lr*d`` with no momentum, `velocity` then untouched). Negation is
        exact, so these are the bits of `apply_block` on ``g = -d``; `move` (broadcast to
        `central`'s shape and dtype) is left as it was. DiLoCo's synchronous outer step
        (`DiLoCo.synchronous_step`) is this."""
        d = np.empty(central.shape, central.dtype)  # (a move may broadcast: one value)
        d[...] = move
        scratch = np.empty_like(d) if self.momentum and self.nesterov else d
        self._step(central, d, velocity if self.momentum else None, scratch, descend=False)

    def _step(self, central: np.ndarray, g: np.ndarray, v: Optional[np.ndarray],
              scratch: np.ndarray, descend: bool) -> None:
        """The one formula of the numpy path: `g` becomes the step, subtracted from
        `central` (added when not `descend`: `g` and `v` are then the negations)."""
        lr, mu = self.lr, self.momentum
        if not mu:
            g *= lr
        else:
            assert v is not None, "momentum needs its state"
            v *= mu
            v += g
            if self.nesterov:
                np.multiply(v, mu, out=scratch)
                g += scratch  # g + mu*v (addition commutes exactly)
                g *= lr
            else:
                np.multiply(v, lr, out=g)
        if descend:
            central -= g
        else:
            central += g

    def __repr__(self) -> str:
        return "SGD(lr=%r, momentum=%r, nesterov=%r)" % (self.lr, self.momentum, self.nesterov)


class Adam:
    """Adam (Kingma and Ba 2015) with bias correction; the step count `t` is kept per
    parameter in the shared state. Raises ValueError for out-of-range settings.

    Not elementwise: `t` must advance once per sync of a whole parameter, so
    Downpour(Adam) updates the whole centre under one lock. It does so block by block
    through a journal (`begin`, `apply_block_at`, `finish`), each block all or nothing."""

    elementwise = False
    per_parameter_arrays = 2  # m and v: the state arrays shaped like a parameter

    def __init__(self, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8) -> None:
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(beta1), float(beta2), \
            float(eps)
        if not self.lr > 0 or not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1 \
                or not self.eps > 0:
            raise ValueError("Adam needs lr > 0, 0 <= beta1, beta2 < 1 and eps > 0; got %r" % self)

    def state_layout(self, layout: Layout) -> Layout:
        """Layout of this optimizer's state: m and v like the parameters, then the step counts."""
        moments = [dict(e) for e in layout]
        return moments + [dict(e) for e in layout] + [{"dtype": "<f8", "shape": [len(layout)]}]

    def apply(self, index: int, central: np.ndarray, g: np.ndarray,
              state: Sequence[np.ndarray]) -> None:
        """Apply descent `g` to `central` (parameter `index`), updating m, v and t in `state`."""
        n = (len(state) - 1) // 2
        m, v, steps = state[index], state[n + index], state[-1]
        steps[index] += 1
        t = int(steps[index])  # Python scalars below keep the arithmetic in the parameters' dtype
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * (g * g)
        m_hat = m / (1.0 - self.beta1 ** t)
        v_hat = v / (1.0 - self.beta2 ** t)
        central -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def begin(self, index: int, state: Sequence[np.ndarray]) -> int:
        """The step count t of a push of parameter `index` (its blocks then take it)."""
        return int(state[-1][index]) + 1

    def apply_block_at(self, t: int, central: np.ndarray, g: np.ndarray,
                       state: Sequence[np.ndarray], out: Sequence[np.ndarray]) -> None:
        """`apply` with step count `t` on one block (`state`: its m and v blocks), writing the
        new centre, m and v to `out` and leaving the inputs as they were. The same
        operations as `apply`, so bit-identical."""
        (m, v), (c_out, m_out, v_out) = state, out
        np.multiply(m, self.beta1, out=m_out)
        m_out += (1 - self.beta1) * g
        np.multiply(v, self.beta2, out=v_out)
        v_out += (1 - self.beta2) * (g * g)
        m_hat = m_out / (1.0 - self.beta1 ** t)
        v_hat = v_out / (1.0 - self.beta2 ** t)
        np.subtract(central, self.lr * m_hat / (np.sqrt(v_hat) + self.eps), out=c_out)

    def finish(self, index: int, state: Sequence[np.ndarray], t: int) -> None:
        """Count the push of parameter `index`, once all its blocks are committed (one aligned
        8-byte store: a push cut part-way is not counted)."""
        state[-1][index] = t

    def __repr__(self) -> str:
        return "Adam(lr=%r, beta1=%r, beta2=%r, eps=%r)" % (self.lr, self.beta1, self.beta2,
                                                          self.eps)


class Downpour(ParamSyncRule):
    """Push ``g = x_last - x`` to the centre's `optimizer` (SGD or Adam), then take the centre.

    `state_name` names the optimizer's shared state; workers using the same
    name share one optimizer. The rule must be given to
    `Worker.init_shared_params`, which attaches the state.

    The class declares ``elementwise`` and ``supports_async``; an instance
    keeps them only when its optimizer is elementwise (declares
    ``elementwise = True`` and has ``apply_block``; its state is a whole number
    of parameter-shaped arrays per parameter, array ``j`` of parameter ``i``
    at ``state[j * len(params) + i]``). The exchange reads the instance's flags.
    """

    elementwise = True
    supports_async = True
    # sgd and sgd_staged where the optimizer's `kernel_settings` allows them (SGD, DiLoCo's)
    sync_kernels = SyncKernels(compiled=("sgd", "sgd_staged", "take_pull"))

    def __init__(self, optimizer: Any, state_name: str = "downpour") -> None:
        # `optimizer`: SGD, Adam, or any object with their `apply` and `state_layout` (and
        # `elementwise` with `apply_block`, or `apply_block_at`): checked here, used duck-typed
        if not hasattr(optimizer, "apply") or not hasattr(optimizer, "state_layout"):
            raise TypeError("Downpour needs an optimizer such as platoon.SGD(lr=0.1, "
                            "momentum=0.9) or platoon.Adam(lr=1e-3), got %r" % (optimizer,))
        self.optimizer = optimizer
        self.state_name = state_name
        self.state: Optional[List[np.ndarray]] = None  # attached by `attach`
        self._last: List[np.ndarray] = []  # the centre as this worker last saw it
        self._journal: Optional[Journal] = None  # attached with a stateful elementwise optimizer
        fast = getattr(optimizer, "elementwise", False) is True \
            and hasattr(optimizer, "apply_block")
        self.elementwise = self.supports_async = fast  # per instance: see the class docstring

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        require_float(self, local_params)
        self._layout = [{"dtype": p.dtype.str, "shape": list(p.shape)} for p in local_params]

    def attach(self, worker: RuleContext) -> None:
        """Attach the optimizer's state in shared memory (called by init_shared_params), and
        with an elementwise optimizer that has state, its journal (see `_descend_journaled`)."""
        layout = self.optimizer.state_layout(self._layout)
        self.state = worker.shared_state(self.state_name, layout) if layout else []
        self._journal = None
        count = len(self._layout)
        if self.elementwise and self.state:
            self._attach_journal(worker, layout, stripes_of(worker, self._layout),
                                 len(layout) // count)
        elif self.state and hasattr(self.optimizer, "apply_block_at"):  # one slot: whole lock
            sizes = [int(np.prod(e["shape"], dtype=np.int64)) for e in self._layout]
            self._attach_journal(worker, layout, [[(i, 0, n) for i, n in enumerate(sizes) if n]],
                                 self.optimizer.per_parameter_arrays)

    def _attach_journal(self, worker: RuleContext, state_layout: Layout,
                        stripes: List[List[Tuple[int, int, int]]], per_param: int) -> None:
        """One journal slot per stripe (`stripes` as the worker gives them: as its
        exchange cuts the centre), with a row for the centre and one for each of the first
        `per_param` state arrays of a parameter."""
        self._ranges = [sorted((a, b, k) for k, s in enumerate(stripes) for i, a, b in s
                               if i == index) for index in range(len(self._layout))]
        self._starts = [[a for a, _, _ in ranges] for ranges in self._ranges]
        self._block = min(BLOCK_ELEMENTS, max([b - a for s in stripes for _, a, b in s] + [1]))
        count = len(self._layout)
        rows = [[e["dtype"] for e in self._layout]] + [
            [e["dtype"] for e in state_layout[j * count:(j + 1) * count]]
            for j in range(per_param)]
        self._row_dtypes = [[np.dtype(d) for d in row] for row in rows]  # [row][param]
        wide = [np.result_type(*row) for row in self._row_dtypes]
        arrays = worker.shared_state(self.state_name + "-journal",
                                     journal_layout(len(stripes), self._block, wide))
        assert worker.shared_params is not None  # the centre is shared before attach
        centre = [c.reshape(-1) for c in worker.shared_params]
        assert self.state is not None
        state = [s.reshape(-1) for s in self.state]
        self._journal = Journal(arrays, lambda i: [centre[i]] + [
            state[j * count + i] for j in range(per_param)])
        # parameter index -> its rows' buffers, where the journal's are wider
        self._private: Dict[int, List[np.ndarray]] = {}
        for index in range(count):
            if any(row[index] != w for row, w in zip(self._row_dtypes, wide)):
                self._private[index] = [np.empty(self._block, row[index])
                                        for row in self._row_dtypes]

    def setup(self, local_params: Sequence[np.ndarray]) -> None:
        if self.state is None:
            raise RuntimeError("Downpour's optimizer state is not attached: pass the rule to "
                               "Worker.init_shared_params")
        self._last = [np.array(p, copy=True, order="C") for p in local_params]

    def _state_blocks(self, index: int, start: int, n: int) -> List[np.ndarray]:
        assert self.state is not None  # attached before any sync (setup checks)
        count = len(self._layout)
        per_param = len(self.state) // count if count else 0
        return [self.state[j * count + index].reshape(-1)[start:start + n]
                for j in range(per_param)]

    def _kernel_settings(self) -> Optional[Tuple[float, float, bool, float]]:
        settings = getattr(self.optimizer, "kernel_settings", None)
        return settings() if settings is not None else None

    def _descend(self, index: int, start: int, src: np.ndarray, central: np.ndarray,
                 take: bool) -> None:
        """Apply g = last - src to central[start:...]; last (and src when `take`) become
        the new centre. In one pass for SGD (platoon.rules.kernels), else block by block;
        with optimizer state, each block all or nothing (`_descend_journaled`)."""
        n = src.size
        last = self._last[index].reshape(-1)[start:start + n]
        state = self._state_blocks(index, start, n)
        if self._journal is not None:
            self._descend_journaled(index, start, src, central, last, state, take)
            return
        settings = None if state else self._kernel_settings()
        if settings is not None and kernels.sgd(src, central, last, None, settings[0],
                                                settings[1], settings[2], take, settings[3]):
            return
        k = len(state)
        apply_block = self.optimizer.apply_block
        for blocks in self._blocks(src, central, last, *state):
            s, c, x_last, g = blocks[0], blocks[1], blocks[2], blocks[-1]
            np.subtract(x_last, s, out=g)
            apply_block(c, g, blocks[3:3 + k], self._scratch2(src.dtype)[:g.size])
            if take:
                s[...] = c
            x_last[...] = c

    def _scratch2(self, dtype: np.dtype) -> np.ndarray:
        """A second block of scratch (the first is `_scratch`'s, for g)."""
        extra: Dict[np.dtype, np.ndarray] = self.__dict__.setdefault("_extra", {})
        scratch = extra.get(dtype)
        if scratch is None:
            scratch = extra[dtype] = np.empty_like(self._scratch(dtype))
        return scratch

    def _descend_journaled(self, index: int, start: int, src: np.ndarray, central: np.ndarray,
                           last: np.ndarray, state: List[np.ndarray], take: bool) -> None:
        """`_descend` for an optimizer with state: each block of the push is all or nothing
        when this worker is killed. Its new centre and state go first to the journal slot
        of the stripe (whose lock is held), are committed, then copied to their places; the
        next sync taking the stripe completes a committed block (platoon.rules.journal)."""
        if not src.size:
            return
        slot = self._ranges[index][bisect.bisect_right(self._starts[index], start) - 1][2]
        journal = self._journal
        assert journal is not None
        journal.recover(slot)  # a push cut by a killed worker: finish it first
        settings = self._kernel_settings()
        private = self._private.get(index)
        apply_to = getattr(self.optimizer, "apply_block_to", None)
        for a in range(0, src.size, self._block):
            b = min(a + self._block, src.size)
            staged = journal.staging(slot, b - a)
            out = staged if private is None else [p[:b - a] for p in private]
            if settings is None or len(state) != 1 or not kernels.sgd_staged(
                    src[a:b], central[a:b], last[a:b], state[0][a:b], out[0], out[1],
                    settings[0], settings[1], settings[2], take, settings[3]):
                g = self._scratch(src.dtype)[:b - a]
                np.subtract(last[a:b], src[a:b], out=g)
                blocks = [s[a:b] for s in state]
                scratch = self._scratch2(src.dtype)[:b - a]
                if apply_to is not None:
                    apply_to(central[a:b], g, blocks, scratch, out)
                else:  # the optimizer updates in place: on copies in the staging rows
                    for dst, value in zip(out, [central[a:b]] + blocks):
                        dst[...] = value
                    self.optimizer.apply_block(out[0], g, out[1:], scratch)
                if take:
                    src[a:b] = out[0]
                last[a:b] = out[0]
            if private is not None:
                for dst, value in zip(staged, out):
                    dst[...] = value  # to the journal's wider dtype: exact
            journal.commit(slot, index, start + a, b - a)

    def _update_journaled(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        """`update` of a whole parameter by an optimizer that is not elementwise (Adam, under
        the whole centre's lock), block by block through the journal's one slot: each block
        all or nothing, and the push counted (`finish`) once every block is committed."""
        journal, opt = self._journal, self.optimizer
        assert journal is not None and self.state is not None
        journal.recover(0)  # a push cut by a killed worker: finish its committed block first
        flat = local.reshape(-1) if local.flags.c_contiguous else \
            np.ascontiguousarray(local).reshape(-1)
        flat_central, last = central.reshape(-1), self._last[index].reshape(-1)
        count = len(self._layout)
        state = [self.state[j * count + index].reshape(-1) for j in range(opt.per_parameter_arrays)]
        private = self._private.get(index)
        t = opt.begin(index, self.state)
        for a in range(0, flat.size, self._block):
            b = min(a + self._block, flat.size)
            staged = journal.staging(0, b - a)
            out = staged if private is None else [p[:b - a] for p in private]
            g = np.subtract(last[a:b], flat[a:b], out=self._scratch(flat.dtype)[:b - a])
            opt.apply_block_at(t, flat_central[a:b], g, [s[a:b] for s in state], out)
            flat[a:b] = out[0]
            last[a:b] = out[0]
            if private is not None:
                for dst, value in zip(staged, out):
                    dst[...] = value  # to the journal's wider dtype: exact
            journal.commit(0, index, a, b - a)
        opt.finish(index, self.state, t)
        if not local.flags.c_contiguous:
            local[...] = flat.reshape(local.shape)

    def update_range(self, index: int, start: int, local: np.ndarray,
                     central: np.ndarray) -> None:
        self._descend(index, start, local, central, take=True)

    def push(self, index: int, start: int, snapshot: np.ndarray, central: np.ndarray) -> None:
        # c <- optimizer(c, x_last - x_snap); x_last = c   (snapshot kept for pull)
        self._descend(index, start, snapshot, central, take=False)

    def pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray) -> None:
        take_pull(local, snapshot, self._last[index].reshape(-1)[start:start + local.size])

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        if self.elementwise and central.flags.c_contiguous:
            flat = local.reshape(-1) if local.flags.c_contiguous else \
                np.ascontiguousarray(local).reshape(-1)
            flat_central = central.reshape(-1)
            if self._journal is None:
                self._descend(index, 0, flat, flat_central, take=True)
            else:  # stripe range by stripe range: each block through its stripe's slot
                for a, b, _ in self._ranges[index]:
                    self._descend(index, a, flat[a:b], flat_central[a:b], take=True)
            if not local.flags.c_contiguous:
                local[...] = flat.reshape(local.shape)
            return
        if self._journal is not None and central.flags.c_contiguous:
            self._update_journaled(index, local, central)
            return
        last = self._last[index]
        g = last - local
        self.optimizer.apply(index, central, g, self.state)
        local[...] = central
        last[...] = central

    def __repr__(self) -> str:
        return "Downpour(%r)" % (self.optimizer,)
