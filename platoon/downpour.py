"""Downpour: workers push their accumulated update, an optimizer next to the centre applies it.

The parameter server's "update on server" mode. At each sync a worker sends
``g = x_last - x`` (the descent it made since its last sync, the sum of its
local steps); the centre's optimizer applies ``g`` as a gradient, then the
worker takes the centre. The optimizer's state (momentum, Adam moments and
step count) lives in a shared-memory segment next to the centre, owned by the
controller (`Controller.shared_states`), so it persists across syncs and
workers and can be checkpointed with the centre. Updates run under the
centre's lock, so state and centre change together.

``Downpour(SGD(lr=1.0))`` is exactly ASGD.
"""

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .rules import ParamSyncRule, _require_float

if TYPE_CHECKING:
    from .worker import Worker


class SGD:
    """SGD with optional (Nesterov) momentum: ``v = momentum*v + g; c -= lr*v``
    (Nesterov: ``c -= lr*(g + momentum*v)``). Raises ValueError for lr <= 0 or
    momentum outside [0, 1)."""

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

    def __repr__(self):
        return "SGD(lr=%r, momentum=%r, nesterov=%r)" % (self.lr, self.momentum, self.nesterov)


class Adam:
    """Adam (Kingma and Ba 2015) with bias correction; the step count `t` is kept per
    parameter in the shared state. Raises ValueError for out-of-range settings."""

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
    """

    def __init__(self, optimizer, state_name: str = "downpour"):
        if not hasattr(optimizer, "apply") or not hasattr(optimizer, "state_layout"):
            raise TypeError("Downpour needs an optimizer such as platoon.SGD(lr=0.1, "
                            "momentum=0.9) or platoon.Adam(lr=1e-3), got %r" % (optimizer,))
        self.optimizer = optimizer
        self.state_name = state_name
        self.state = None

    def check(self, local_params: Sequence[np.ndarray]) -> None:
        _require_float(self, local_params)
        self._layout = [{"dtype": p.dtype.str, "shape": list(p.shape)} for p in local_params]

    def attach(self, worker: "Worker") -> None:
        """Attach the optimizer's state in shared memory (called by init_shared_params)."""
        layout = self.optimizer.state_layout(self._layout)
        self.state = worker.shared_state(self.state_name, layout) if layout else []

    def setup(self, local_params: Sequence[np.ndarray]) -> None:
        if self.state is None:
            raise RuntimeError("Downpour's optimizer state is not attached: pass the rule to "
                               "Worker.init_shared_params")
        self._last = [np.array(p, copy=True, order="C") for p in local_params]

    def update(self, index: int, local: np.ndarray, central: np.ndarray) -> None:
        last = self._last[index]
        g = last - local
        self.optimizer.apply(index, central, g, self.state)
        local[...] = central
        last[...] = central

    def __repr__(self) -> str:
        return "Downpour(%r)" % (self.optimizer,)
