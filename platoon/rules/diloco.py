"""The DiLoCo family on the centre: outer Nesterov SGD on workers' pseudo-gradients, pushed
asynchronously.

DiLoCo (Douillard et al. 2023, arXiv 2311.08105) trains p workers with an inner
optimizer for H steps, averages their pseudo-gradients ``g_k = c - x_k`` and
applies one outer step of SGD with Nesterov momentum (lr 0.7, momentum 0.9) to
the centre. Here there is no round: each worker pushes its own ``g`` when it
syncs (`Downpour`'s machinery: ``g = x_last - x``, applied next to the centre,
state in shared memory, striped, `Worker.start_sync` supported).

**The 1/p rule.** One push is 1/p of a synchronous round, so `DiLoCo` feeds the
outer optimizer ``g / p``: ``v = mu*v + g/p; c -= lr*(g/p + mu*v)`` (Nesterov).
The outer lr then means what it means in synchronous DiLoCo whatever p is:

- without momentum, p pushes of ``g`` move the centre by ``lr*g``, as one
  synchronous step with the average ``g`` (exactly, up to the rounding of p
  subtractions instead of one);
- with momentum, the lr term of a round is the synchronous one and so is the
  long-run gain: for a constant ``g``, ``v -> (g/p)/(1-mu)`` and a round of p
  pushes moves ``lr*g/(1-mu)``, as synchronous DiLoCo does. What differs is that
  ``v`` decays once per push, not once per round (two pushes of ``g`` from
  ``v = 0``: ``lr*g*(1 + mu + mu**2/2)`` instead of ``lr*g*(1 + mu)``). To get the
  synchronous outer step exactly, use `DelayedNesterov` with ``delay = p``.

Scaling ``g`` by 1/p and scaling lr by 1/p (``u = mu*u + g; c -= (lr/p)*(g + mu*u)``)
are the same rule in real arithmetic, with ``u = p*v``: by induction
``u_t = p*v_t``, so ``(lr/p)*(g + mu*u) = lr*(g/p + mu*v)``. In floating point
they are bit-identical when p is a power of two (scaling by 2**k is exact and
commutes with rounding) and differ in the last bits otherwise. We keep ``g/p``:
the momentum buffer then holds the units of synchronous DiLoCo's, independent of
p, so a checkpoint stays meaningful if the job resumes with another number of
workers.
The same identity makes ``DiLoCo(outer_lr=L)`` the rule
``Downpour(SGD(L/p, momentum, nesterov))``, whose lr must be retuned when p
changes; DiLoCo's need not.

**p** is the job's number of workers pushing into this centre (on a multi-node
job, this node's: `Worker.num_workers`), known once the worker has registered,
when the controller was given ``num_workers`` (the launcher always gives it).
Without it, pass ``workers=`` explicitly; otherwise `init_shared_params` raises
ValueError.
"""

from typing import Optional

import numpy as np

from .base import RuleContext
from .downpour import SGD, Downpour


def _job_workers(rule, worker, what):
    """The number of workers p: `rule.workers` if given, else the job's; ValueError if
    neither is known."""
    if rule.workers is not None:
        return rule.workers
    p = getattr(worker, "num_workers", None)
    if not p:
        raise ValueError(
            "%s needs the number of workers pushing to the centre (%s), but the controller "
            "was started without num_workers: give the Controller num_workers=N (the "
            "launcher does), or pass %s(workers=N)" % (type(rule).__name__, what,
                                                     type(rule).__name__))
    return int(p)


def _check_workers(workers):
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError("workers must be a whole number >= 1 (or None: the job's number of "
                         "workers), got %r" % (workers,))
    return int(workers)


class _PerPush:
    """An optimizer applied to ``g / workers``: one push is 1/workers of a round."""

    elementwise = True

    def __init__(self, inner):
        self.inner = inner
        self.workers: Optional[int] = None  # set by DiLoCo.attach

    def state_layout(self, layout):
        return self.inner.state_layout(layout)

    def apply(self, index, central, g, state):
        assert self.workers is not None, "attached by DiLoCo.attach"
        self.inner.apply(index, central, g / self.workers, state)

    def apply_block(self, central, g, state, scratch):
        assert self.workers is not None, "attached by DiLoCo.attach"
        np.divide(g, self.workers, out=g)
        self.inner.apply_block(central, g, state, scratch)

    def kernel_settings(self):
        """The inner SGD's kernel settings with ``g / workers`` (see `SGD.kernel_settings`)."""
        inner = getattr(self.inner, "kernel_settings", lambda: None)()
        if inner is None or inner[3] != 1.0:
            return None
        assert self.workers is not None, "attached by DiLoCo.attach"
        return inner[:3] + (float(self.workers),)

    def __repr__(self):
        return "%r on g/%s" % (self.inner, self.workers)


class DiLoCo(Downpour):
    """Asynchronous DiLoCo: each push applies ``g / p`` to outer SGD with Nesterov momentum.

    ``v = momentum*v + g/p; c -= outer_lr*(g/p + momentum*v)`` (without Nesterov:
    ``c -= outer_lr*v``; with momentum 0: ``c -= outer_lr*g/p``), where
    ``g = x_last - x`` is the worker's pseudo-gradient since its last sync and
    p the number of workers (see the module docstring for why 1/p, and what it
    keeps of synchronous DiLoCo). Train each worker with its own inner optimizer
    (SGD, AdamW) and sync every H steps.

    Parameters:
        outer_lr: the outer learning rate (DiLoCo: 0.7); must be > 0.
        momentum: outer momentum in [0, 1) (DiLoCo: 0.9).
        nesterov: Nesterov momentum (DiLoCo: True); ignored when momentum is 0.
        workers: p; None takes the job's number of workers when the rule is
            attached (`Worker.num_workers`), and `init_shared_params` raises
            ValueError if the controller was not given ``num_workers``.
        state_name: the shared state holding the momentum (``ctl.shared_states``),
            checkpointed with the centre.

    Elementwise: syncs stripe by stripe and supports `Worker.start_sync`, like
    `Downpour(SGD(...))`, with the same compiled kernel and the same journal (each block
    of a push all or nothing when the worker is killed). Raises ValueError for
    out-of-range settings.
    """

    def __init__(self, outer_lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 workers: Optional[int] = None, state_name: str = "diloco") -> None:
        momentum = float(momentum)
        self.outer_lr, self.momentum = float(outer_lr), momentum
        self.nesterov = bool(nesterov) and momentum != 0.0
        self.workers = _check_workers(workers)
        inner = SGD(outer_lr, momentum, self.nesterov)  # checks lr and momentum
        super().__init__(_PerPush(inner), state_name=state_name)

    def attach(self, worker: RuleContext) -> None:
        self.optimizer.workers = _job_workers(self, worker, "each push applies g/p")
        super().attach(worker)

    def synchronous_step(self, anchor: np.ndarray, velocity: np.ndarray,
                         mean_move: np.ndarray) -> None:
        """Synchronous DiLoCo's outer step, in place: `mean_move` is the workers' mean move
        from `anchor` (``-mean(g)``), applied whole (a round, not one push's 1/p) with the
        outer SGD of this rule; `velocity` holds the momentum of moves (``-v``). What the
        centre ties of a multi-node job apply each round (`platoon.mpi.tie.outer_step`):
        ``u = momentum*u + d; anchor += outer_lr*(d + momentum*u)``; `mean_move` is left as
        it was."""
        assert isinstance(self.optimizer, _PerPush)
        self.optimizer.inner.apply_move(anchor, mean_move, velocity)

    def __repr__(self) -> str:
        return "DiLoCo(outer_lr=%r, momentum=%r, nesterov=%r, workers=%r)" % (
            self.outer_lr, self.momentum, self.nesterov, self.workers)


class _DelayedNesterovOuter:
    """Algorithm 3 of Liu et al. 2024 on blocks; see `DelayedNesterov`.

    State per parameter: the momentum m, the buffer D of pseudo-gradients since
    the last momentum update, and the push counter t (one per element, uint32).
    """

    elementwise = True

    def __init__(self, lr, beta, delay, activation):
        self.lr, self.beta, self.delay, self.activation = lr, beta, delay, activation

    def state_layout(self, layout):
        counters = [{"dtype": "<u4", "shape": list(e["shape"])} for e in layout]
        return [dict(e) for e in layout] + [dict(e) for e in layout] + counters

    def step(self, central, g, m, buf, count, scratch, out=None):
        """One push on aligned 1-D arrays. The new centre, m, D and t go to `out` (four
        arrays; by default the inputs, in place). `g` is clobbered, `scratch` is scratch.
        Counters may differ between elements (a sync cut part-way by a killed worker)."""
        n, beta, c = self.delay, self.beta, self.activation
        c_out, m_out, buf_out, count_out = out or (central, m, buf, count)
        np.add(buf, g, out=buf_out)
        np.add(count, 1, out=count_out)
        if count_out.size == 0:
            return
        np.divide(g, n, out=g)                       # g/N
        scratch = scratch[:g.size]
        if m_out is not m:
            m_out[...] = m
        first = int(count_out[0])
        if first == int(count_out.min()) == int(count_out.max()):
            if first % n == 0:                       # (t+1) % N == 0: update the momentum
                m_out *= beta
                np.divide(buf_out, n, out=scratch)
                m_out += scratch                     # m = beta*m + D/N
                buf_out[...] = 0
                np.multiply(m_out, (1.0 - c * n + c) * beta, out=scratch)
                g += scratch                         # (1 - cN + c)*beta*m + g/N
            elif c:
                np.multiply(m, c * beta, out=scratch)
                g += scratch                         # c*beta*m + g/N
        else:                                        # the same, element by element
            due = count_out % n == 0
            moved = m_out[due] * beta
            moved += buf_out[due] / n
            m_out[due] = moved
            buf_out[due] = 0
            g[due] += moved * ((1.0 - c * n + c) * beta)
            if c:
                g[~due] += m_out[~due] * (c * beta)
        g *= self.lr                                 # (addition and products commute exactly)
        np.subtract(central, g, out=c_out)

    def apply(self, index, central, g, state):
        k = len(state) // 3
        m, buf, count = state[index], state[k + index], state[2 * k + index]
        self.step(central.reshape(-1), np.ascontiguousarray(g).reshape(-1), m.reshape(-1),
                  buf.reshape(-1), count.reshape(-1), np.empty(g.size, g.dtype))

    def apply_block(self, central, g, state, scratch):
        m, buf, count = state
        self.step(central, g, m, buf, count, scratch)

    def apply_block_to(self, central, g, state, scratch, out):
        """`apply_block` with the new centre, m, D and t written to `out` (the inputs are
        left as they were)."""
        m, buf, count = state
        self.step(central, g, m, buf, count, scratch, out)

    def __repr__(self):
        return "DelayedNesterovOuter(lr=%r, beta=%r, delay=%r, activation=%r)" % (
            self.lr, self.beta, self.delay, self.activation)


class DelayedNesterov(Downpour):
    """Asynchronous DiLoCo with Delayed Nesterov momentum (Liu et al. 2024, "Asynchronous
    Local-SGD Training for Language Modeling", arXiv 2401.09135, Algorithm 3, "DN").

    On the t-th push (t = 1, 2, ...) of a pseudo-gradient ``g`` (``x_last - x``)::

        D += g
        if t % N == 0:                       # every N pushes, the momentum moves
            m = beta*m + D/N;  D = 0
            c -= lr*((1 - a*N + a)*beta*m + g/N)
        else:                                # in between, no momentum update
            c -= lr*(a*beta*m + g/N)

    with N = `delay`, beta = `momentum`, lr = `outer_lr` and a = `activation` (the
    paper's momentum activation c in [0, 1/N]; 0, the default, applies no momentum
    in between). With activation 0, N consecutive pushes from fresh workers are one
    synchronous DiLoCo outer step on their average: the pushes add
    ``lr*sum(g)/N``, the milestone ``lr*beta*m`` with ``m = beta*m + mean(g)``.
    With the default ``delay`` = p (the job's number of workers) that is one
    synchronous round per p pushes, so the outer lr keeps its synchronous meaning
    (see `platoon.rules.diloco`).

    Concurrency: t counts pushes per element of the centre (a uint32 array the
    shape of each parameter in the shared state), incremented under the lock of
    the stripe being updated, so no push is lost or counted twice when workers
    push concurrently, and the rule stays elementwise: it syncs stripe by stripe
    and supports `Worker.start_sync`, like `Downpour(SGD(...))`. Each stripe sees
    the pushes in the order it took them; when two pushes interleave, the N-th
    push of one stripe may be another worker's than in the next stripe, exactly
    as the order of pushes differs between stripes for every striped rule. The
    price is memory: shared state of 2 parameter-sized arrays (m, D) plus 4 bytes
    per element (t), against 1 array for `DiLoCo`, plus a journal of one block
    (65,536 elements of c, m, D and t; DiLoCo's: c and v) per stripe that makes each
    block of a push all or nothing when the pushing worker is killed
    (`platoon.rules.journal`; the next sync that takes the stripe completes a block the
    dead worker committed).
    Time per push is about
    DiLoCo's with N = 2 and less with larger N (the momentum pass runs once per N
    pushes; docs/choosing-a-rule.md). The whole-centre alternative (one counter,
    one lock, as `Downpour(Adam)`) would serialise all pushes instead.

    Parameters:
        outer_lr: > 0 (DiLoCo: 0.7). momentum: in [0, 1) (0.9).
        delay: N >= 1; None takes the number of workers p.
        activation: the momentum activation in [0, 1/N].
        workers: p, used only when `delay` is None; None takes the job's (see
            `DiLoCo`).
        state_name: the shared state (m, D, t), checkpointed with the centre.

    Raises ValueError for out-of-range settings (`activation` against a `delay`
    taken from the job: when the rule is attached).
    """

    def __init__(self, outer_lr: float = 0.7, momentum: float = 0.9,
                 delay: Optional[int] = None, activation: float = 0.0,
                 workers: Optional[int] = None, state_name: str = "delayed-nesterov") -> None:
        self.outer_lr, self.momentum = float(outer_lr), float(momentum)
        self.activation = float(activation)
        if not self.outer_lr > 0:
            raise ValueError("DelayedNesterov outer_lr must be > 0, got %r" % (outer_lr,))
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError("DelayedNesterov momentum must be in [0, 1), got %r" % (momentum,))
        if delay is not None and (isinstance(delay, bool) or not isinstance(
                delay, (int, np.integer)) or delay < 1):
            raise ValueError("DelayedNesterov delay must be a whole number >= 1 (or None: the "
                             "number of workers), got %r" % (delay,))
        self.delay = None if delay is None else int(delay)
        self.workers = _check_workers(workers)
        if self.delay is not None:
            self._check_activation(self.delay)
        super().__init__(_DelayedNesterovOuter(self.outer_lr, self.momentum, self.delay,
                                               self.activation), state_name=state_name)

    def _check_activation(self, delay):
        if not 0.0 <= self.activation <= 1.0 / delay:
            raise ValueError("DelayedNesterov activation must be in [0, 1/delay] = [0, %.4g] "
                             "for delay %d, got %r" % (1.0 / delay, delay, self.activation))

    def attach(self, worker: RuleContext) -> None:
        if self.delay is None:
            delay = _job_workers(self, worker, "the default delay N is p")
            self._check_activation(delay)
            self.optimizer.delay = delay
        super().attach(worker)

    def __repr__(self) -> str:
        return ("DelayedNesterov(outer_lr=%r, momentum=%r, delay=%r, activation=%r, workers=%r)"
                % (self.outer_lr, self.momentum, self.delay, self.activation, self.workers))
