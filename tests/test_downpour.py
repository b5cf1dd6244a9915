"""Downpour: the centre's optimizer arithmetic, exactly, and its state in shared memory."""

import numpy as np
import pytest

from platoon import ASGD, Controller, Worker
from platoon.downpour import SGD, Adam, Downpour

ROUNDS = 4


def initial(dtype):
    return [np.linspace(-1, 1, 12, dtype=dtype).reshape(3, 4), np.arange(5, dtype=dtype) / 7]


def delta(k, r, dtype):
    return [(np.cos(np.arange(p.size) + 3 * k + r) * 0.05).astype(dtype).reshape(p.shape)
            for p in initial(dtype)]


def run_downpour(serve, make_rule, dtype, n=2):
    """n workers in the test thread: each round every worker steps, then they sync in turn."""
    ctl = Controller(control_port=0, num_workers=n)
    serving = serve(ctl)
    workers = [Worker(ctl.control_port, timeout_s=10) for _ in range(n)]
    params = [initial(dtype) for _ in range(n)]
    rules = [make_rule() for _ in range(n)]
    for w, p, rule in zip(workers, params, rules):
        w.init_shared_params(p, rule)
    for r in range(ROUNDS):
        for k in range(n):
            for p, d in zip(params[k], delta(k, r, dtype)):
                p += d
            workers[k].sync_params()
    centre = [c.copy() for c in ctl.centre]
    states = {name: [a.copy() for a in arrays] for name, arrays in ctl.shared_states.items()}
    for w in workers:
        w.close()
    serving.join()
    return centre, params, states


def reference(dtype, step, n=2):
    """The same schedule written plainly: the centre applies g = last - x with `step`."""
    c = initial(dtype)
    xs = [initial(dtype) for _ in range(n)]
    lasts = [initial(dtype) for _ in range(n)]
    for r in range(ROUNDS):
        for k in range(n):
            for i, d in enumerate(delta(k, r, dtype)):
                xs[k][i] = xs[k][i] + d
                g = lasts[k][i] - xs[k][i]
                c[i] = step(i, c[i], g)
                xs[k][i] = c[i].copy()
                lasts[k][i] = c[i].copy()
    return c, xs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_on_the_centre_is_exact(serve, dtype):
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-6
    centre, params, states = run_downpour(serve, lambda: Downpour(Adam(lr, b1, b2, eps)), dtype)
    shapes = [p.shape for p in initial(dtype)]
    m = [np.zeros(s, dtype) for s in shapes]
    v = [np.zeros(s, dtype) for s in shapes]
    t = [0, 0]

    def adam(i, c, g):
        t[i] += 1
        m[i] = b1 * m[i] + (1 - b1) * g
        v[i] = b2 * v[i] + (1 - b2) * (g * g)
        m_hat = m[i] / (1.0 - b1 ** t[i])
        v_hat = v[i] / (1.0 - b2 ** t[i])
        return c - lr * m_hat / (np.sqrt(v_hat) + eps)

    want_c, want_x = reference(dtype, adam)
    for got, want in zip(centre, want_c):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    for k in range(2):
        for got, want in zip(params[k], want_x[k]):
            np.testing.assert_array_equal(got, want)
    state = states["downpour"]
    np.testing.assert_array_equal(state[-1], [2 * ROUNDS, 2 * ROUNDS])  # t, per parameter
    for got, want in zip(state[:2] + state[2:4], m + v):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_with_momentum_on_the_centre_is_exact(serve, nesterov):
    lr, mu = 0.5, 0.9
    dtype = np.float64
    centre, _, states = run_downpour(serve, lambda: Downpour(SGD(lr, mu, nesterov)), dtype)
    vel = [np.zeros(p.shape) for p in initial(dtype)]

    def sgd(i, c, g):
        vel[i] = mu * vel[i] + g
        return c - lr * ((g + mu * vel[i]) if nesterov else vel[i])

    want_c, _ = reference(dtype, sgd)
    for got, want in zip(centre, want_c):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(states["downpour"], vel):
        np.testing.assert_array_equal(got, want)


def test_plain_sgd_with_lr_1_is_asgd(serve):
    dp, dp_params, states = run_downpour(serve, lambda: Downpour(SGD(1.0)), np.float64)
    asgd, asgd_params, _ = run_downpour(serve, ASGD, np.float64)
    assert states == {}  # plain SGD keeps no state
    for a, b in zip(dp + dp_params[0] + dp_params[1], asgd + asgd_params[0] + asgd_params[1]):
        np.testing.assert_array_equal(a, b)


def test_bad_settings_say_what_fits():
    with pytest.raises(ValueError, match="momentum must be in"):
        SGD(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="Adam needs lr > 0"):
        Adam(lr=0)
    with pytest.raises(TypeError, match="Downpour needs an optimizer such as"):
        Downpour("adam")


def test_optimizer_state_is_checkpointed_and_resumed(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    dtype = np.float64
    ctl = Controller(control_port=0, num_workers=1, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, Downpour(Adam(0.01)))
        for r in range(3):
            for p, d in zip(params, delta(0, r, dtype)):
                p += d
            w.sync_params()
        saved = [a.copy() for a in ctl.shared_states["downpour"]]
    serving.join()  # serve() checkpoints when it ends
    np.testing.assert_array_equal(saved[-1], [3, 3])

    ctl = Controller(control_port=0, num_workers=1, resume_from=str(tmp_path))
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, Downpour(Adam(0.01)))
        for got, want in zip(ctl.shared_states["downpour"], saved):
            np.testing.assert_array_equal(got, want)  # m, v and t carry on
        w.sync_params()
        assert list(ctl.shared_states["downpour"][-1]) == [4, 4]
    serving.join()
