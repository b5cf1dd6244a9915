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
on C-contiguous float32 or float64 it runs a compiled one-pass kernel
(`platoon.rules.kernels`); otherwise the optimizer's `apply_block` in cache-sized
blocks with preallocated scratch. The result is bit-for-bit that of the
whole-parameter formulas either way. Adam is not elementwise (its step count is per
parameter, and a sync of one parameter may interleave stripe by stripe with
another worker's), so Downpour(Adam) keeps one lock around the whole centre.

``Downpour(SGD(lr=1.0))`` is exactly ASGD.
"""

from typing import List, Optional, Sequence

import numpy as np

from . import kernels
from .base import ParamSyncRule, RuleContext, require_float, take_pull


class SGD:
    """SGD with optional (Nesterov) momentum: ``v = momentum*v + g; c -= lr*v``
    (Nesterov: ``c -= lr*(g + momentum*v)``). Raises ValueError for lr <= 0 or
    momentum outside [0, 1)."""

    elementwise = True  # apply_block may update any slice of a parameter on its own

    def __init__(self, lr, momentum=0.0, nesterov=False):
        self.lr, self.momentum, self.nesterov = float(lr), float(momentum), bool(nesterov)
        if not self.lr > 0:
            raise ValueError("SGD lr must be > 0, got %r" % lr)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError("SGD momentum must be in [0, 1), got %r" % momentum)
        if nesterov and not self.momentum:
            raise ValueError("Nesterov SGD needs momentum > 0")

    def state_layout(self, layout):
        """Layout of this optimizer's state for parameters of `layout`."""
        return [dict(e) for e in layout] if self.momentum else []

    def apply(self, index, central, g, state):
        """Apply descent `g` to `central` (parameter `index`), updating `state` in place."""
        if not self.momentum:
            central -= self.lr * g
            return
        v = state[index]
        v *= self.momentum
        v += g
        if self.nesterov:
            central -= self.lr * (g + self.momentum * v)
        else:
            central -= self.lr * v

    def apply_block(self, central, g, state, scratch):
        """`apply` on one block: `g` (clobbered) and `scratch` are scratch of the block's
        size, `state` the blocks of this parameter's state arrays. Same operations in
        the same order as `apply`, so bit-identical."""
        lr, mu = self.lr, self.momentum
        if not mu:
            g *= lr
            central -= g
            return
        v = state[0]
        v *= mu
        v += g
        if self.nesterov:
            np.multiply(v, mu, out=scratch)
            g += scratch  # g + mu*v (addition commutes exactly)
            g *= lr
        else:
            np.multiply(v, lr, out=g)
        central -= g

    def __repr__(self):
        return "SGD(lr=%r, momentum=%r, nesterov=%r)" % (self.lr, self.momentum, self.nesterov)


class Adam:
    """Adam (Kingma and Ba 2015) with bias correction; the step count `t` is kept per
    parameter in the shared state. Raises ValueError for out-of-range settings.

    Not elementwise: `t` must advance once per sync of a whole parameter, so
    Downpour(Adam) updates the whole centre under one lock."""

    elementwise = False

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(beta1), float(beta2), \
            float(eps)
        if not self.lr > 0 or not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1 \
                or not self.eps > 0:
            raise ValueError("Adam needs lr > 0, 0 <= beta1, beta2 < 1 and eps > 0; got %r" % self)

    def state_layout(self, layout):
        moments = [dict(e) for e in layout]
        return moments + [dict(e) for e in layout] + [{"dtype": "<f8", "shape": [len(layout)]}]

    def apply(self, index, central, g, state):
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

    def __repr__(self):
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

    def __init__(self, optimizer, state_name: str = "downpour"):
        if not hasattr(optimizer, "apply") or not hasattr(optimizer, "state_layout"):
            raise TypeError("Downpour needs an optimizer such as platoon.SGD(lr=0.1, "
                            "momentum=0.9) or platoon.Adam(lr=1e-3), got %r" % (optimizer,))
        self.optimizer = optimizer
        self.state_name = state_name
        self.state: Optional[List[np.ndarray]] = None  # attached by `attach`
        self._last: List[np.ndarray] = []  # the centre as this worker last saw it
        fast = getattr(optimizer, "elementwise", False) is True \
            and hasattr(optimizer, "apply_block")
        self.elementwise = self.supports_async = fast  # per instance: see the class docstring

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        require_float(self, local_params)
        self._layout = [{"dtype": p.dtype.str, "shape": list(p.shape)} for p in local_params]

    def attach(self, worker: RuleContext) -> None:
        """Attach the optimizer's state in shared memory (called by init_shared_params)."""
        layout = self.optimizer.state_layout(self._layout)
        self.state = worker.shared_state(self.state_name, layout) if layout else []

    def setup(self, local_params: Sequence[np.ndarray]) -> None:
        if self.state is None:
            raise RuntimeError("Downpour's optimizer state is not attached: pass the rule to "
                               "Worker.init_shared_params")
        self._last = [np.array(p, copy=True, order="C") for p in local_params]

    def _state_blocks(self, index, start, n):
        count = len(self._layout)
        per_param = len(self.state) // count if count else 0
        return [self.state[j * count + index].reshape(-1)[start:start + n]
                for j in range(per_param)]

    def _descend(self, index, start, src, central, take):
        """Apply g = last - src to central[start:...]; last (and src when `take`) become
        the new centre. In one pass for SGD (platoon.rules.kernels), else block by block."""
        n = src.size
        last = self._last[index].reshape(-1)[start:start + n]
        state = self._state_blocks(index, start, n)
        opt = self.optimizer
        if type(opt) is SGD and len(state) == (1 if opt.momentum else 0) and kernels.sgd(
                src, central, last, state[0] if state else None, opt.lr, opt.momentum,
                opt.nesterov, take):
            return
        k = len(state)
        extra = self.__dict__.setdefault("_extra", {})
        scratch = extra.get(src.dtype)
        if scratch is None:
            scratch = extra[src.dtype] = np.empty_like(self._scratch(src.dtype))
        apply_block = self.optimizer.apply_block
        for blocks in self._blocks(src, central, last, *state):
            s, c, x_last, g = blocks[0], blocks[1], blocks[2], blocks[-1]
            np.subtract(x_last, s, out=g)
            apply_block(c, g, blocks[3:3 + k], scratch[:g.size])
            if take:
                s[...] = c
            x_last[...] = c

    def update_range(self, index: int, start: int, local: np.ndarray,
                     central: np.ndarray) -> None:
        self._descend(index, start, local, central, take=True)

    def push(self, index: int, start: int, snapshot: np.ndarray, central: np.ndarray) -> None:
        # c <- optimizer(c, x_last - x_snap); x_last = c   (snapshot kept for pull)
        self._descend(index, start, snapshot, central, take=False)

    def pull(self, index: int, start: int, local: np.ndarray, snapshot: np.ndarray) -> None:
        take_pull(local, snapshot, self._last[index].reshape(-1)[start:start + local.size])

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        if self.elementwise and local.flags.c_contiguous and central.flags.c_contiguous:
            self._descend(index, 0, local.reshape(-1), central.reshape(-1), take=True)
            return
        last = self._last[index]
        g = last - local
        self.optimizer.apply(index, central, g, self.state)
        local[...] = central
        last[...] = central

    def __repr__(self) -> str:
        return "Downpour(%r)" % (self.optimizer,)
