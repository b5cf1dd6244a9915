"""Downpour: the centre's optimizer arithmetic, exactly, and its state in shared memory."""

import numpy as np
import pytest

from platoon import ASGD, Controller, Worker
from platoon._centre.shmem import stripe_ranges  # noqa: PLC2701 (the exchange's cut)
from platoon.protocol import layout_of
from platoon.rules import BLOCK_ELEMENTS
from platoon.rules.downpour import SGD, Adam, Downpour

ROUNDS = 4


def initial(dtype):
    return [np.linspace(-1, 1, 12, dtype=dtype).reshape(3, 4), np.arange(5, dtype=dtype) / 7]


def delta(k, r, dtype):
    return [(np.cos(np.arange(p.size) + 3 * k + r) * 0.05).astype(dtype).reshape(p.shape)
            for p in initial(dtype)]


def run_downpour(serve, make_rule, dtype, n=2):
    """n workers in the test thread: each round every worker steps, then they sync in turn."""
    return run_job(serve, make_rule, dtype, Worker.sync_params, initial, delta, ROUNDS, n)[:3]


def run_job(serve, make_rule, dtype, sync, start, change, rounds, n=2):
    """n workers starting from `start(dtype)`: each round every worker adds
    `change(k, r, dtype)`, then syncs with `sync(worker)` in turn. Returns the centre, the
    workers' parameters, the shared states, whether each worker synced stripe by stripe,
    and the centre's number of stripes."""
    ctl = Controller(control_port=0, num_workers=n)
    serving = serve(ctl, 60)
    workers = [Worker(ctl.control_port, timeout_s=30) for _ in range(n)]
    params = [start(dtype) for _ in range(n)]
    for w, p in zip(workers, params):
        w.init_shared_params(p, make_rule())
    striped = [w._exchange._striped for w in workers]
    stripes = len(workers[0]._exchange.centre.stripes)
    for r in range(rounds):
        for k in range(n):
            for p, d in zip(params[k], change(k, r, dtype)):
                p += d
            sync(workers[k])
    centre = [c.copy() for c in ctl.centre]
    states = {name: [a.copy() for a in arrays] for name, arrays in ctl.shared_states.items()}
    for w in workers:
        w.close()
    serving.join()
    return centre, params, states, striped, stripes


def reference(dtype, step, n=2, rounds=ROUNDS, start=initial, change=delta):
    """The same schedule written plainly: the centre applies g = last - x with `step`."""
    c = start(dtype)
    xs = [start(dtype) for _ in range(n)]
    lasts = [start(dtype) for _ in range(n)]
    for r in range(rounds):
        for k in range(n):
            for i, d in enumerate(change(k, r, dtype)):
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


# -- striped and asynchronous syncs on parameters spanning several stripes --
#
# Guarantee: with SGD (plain, momentum, Nesterov) a striped sync (and start_sync
# + wait) gives bit-for-bit the centre, parameters and velocity of the plain
# whole-parameter formulas below, for float32 and float64: the blocked kernel
# performs the same IEEE operations on each element (only g + mu*v is computed
# as g += mu*v, and addition commutes exactly).

BIG_SHAPES = [(700, 1000), (3,), (300_001,)]  # 4 MB of float32, 8 of float64: several stripes


def big_initial(dtype):
    return [np.random.default_rng(i).normal(size=s).astype(dtype)
            for i, s in enumerate(BIG_SHAPES)]


def big_delta(k, r, dtype):
    return [(np.random.default_rng(100 * k + 10 * r + i).normal(size=s) * 0.05).astype(dtype)
            for i, s in enumerate(BIG_SHAPES)]


def run_big(serve, make_rule, dtype, sync, n=2, rounds=3):
    return run_job(serve, make_rule, dtype, sync, big_initial, big_delta, rounds, n)


def big_reference(dtype, step, n=2, rounds=3):
    return reference(dtype, step, n, rounds, big_initial, big_delta)


def sgd_reference(dtype, lr, mu, nesterov):
    vel = [np.zeros(s, dtype) for s in BIG_SHAPES]

    def sgd(i, c, g):
        if not mu:
            return c - lr * g
        vel[i] = mu * vel[i] + g
        return c - lr * ((g + mu * vel[i]) if nesterov else vel[i])

    want_c, want_x = big_reference(dtype, sgd)
    return want_c, want_x, (vel if mu else [])


SGD_CASES = [(0.3, 0.0, False), (0.2, 0.9, False), (0.2, 0.9, True)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lr,mu,nesterov", SGD_CASES)
@pytest.mark.parametrize("how", ["sync_params", "start_sync"])
def test_striped_sgd_is_bit_identical_to_the_formulas(serve, dtype, lr, mu, nesterov, how):
    if how == "sync_params":
        def sync(w):
            w.sync_params()
    else:
        def sync(w):
            w.start_sync().wait()
    centre, params, states, striped, stripes = run_big(
        serve, lambda: Downpour(SGD(lr, mu, nesterov)), dtype, sync)
    assert all(striped) and stripes > 2
    want_c, want_x, want_v = sgd_reference(dtype, lr, mu, nesterov)
    for got, want in zip(centre, want_c):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    for k in range(2):
        for got, want in zip(params[k], want_x[k]):
            np.testing.assert_array_equal(got, want)
    for got, want in zip(states.get("downpour", []), want_v):
        np.testing.assert_array_equal(got, want)


def test_start_sync_keeps_the_movement_made_while_it_runs(serve):
    dtype = np.float32
    lr, mu = 0.2, 0.9
    ctl = Controller(control_port=0, num_workers=1)
    serving = serve(ctl, 60)
    with Worker(ctl.control_port, timeout_s=30) as w:
        params = big_initial(dtype)
        w.init_shared_params(params, Downpour(SGD(lr, mu, nesterov=True)))
        for p, d in zip(params, big_delta(0, 0, dtype)):
            p += d
        snap = [p.copy() for p in params]
        handle = w.start_sync(snapshot=True)  # overlapped: x = c_new + (x - x_snap)
        moves = big_delta(1, 1, dtype)
        for p, m in zip(params, moves):
            p += m  # the worker keeps training while the sync runs
        handle.wait()
        centre = [c.copy() for c in ctl.centre]
        velocity = [v.copy() for v in ctl.shared_states["downpour"]]
    serving.join()
    start = big_initial(dtype)
    for i, (c0, s) in enumerate(zip(start, snap)):
        g = c0 - s
        v = mu * np.zeros_like(g) + g
        want_c = c0 - lr * (g + mu * v)
        np.testing.assert_array_equal(centre[i], want_c)
        np.testing.assert_array_equal(velocity[i], v)
        moved = (s + moves[i]) - s
        np.testing.assert_array_equal(params[i], want_c + moved)


def test_adam_keeps_the_whole_centre_lock_and_refuses_start_sync(serve):
    assert Downpour(SGD(0.1)).elementwise and Downpour(SGD(0.1, 0.9)).supports_async
    rule = Downpour(Adam(0.01))
    assert not rule.elementwise and not rule.supports_async
    ctl = Controller(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_shared_params(initial(np.float64), rule)
        assert not w._exchange._striped
        with pytest.raises(TypeError, match="does not support start_sync"):
            w.start_sync()
        w.sync_params()
        assert list(ctl.shared_states["downpour"][-1]) == [1, 1]
    serving.join()


def test_striped_momentum_state_is_checkpointed_and_resumed(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    dtype = np.float32
    ctl = Controller(control_port=0, num_workers=1, checkpoint_path=path)
    serving = serve(ctl, 60)
    with Worker(ctl.control_port, timeout_s=30) as w:
        params = big_initial(dtype)
        w.init_shared_params(params, Downpour(SGD(0.2, 0.9, nesterov=True)))
        assert w._exchange._striped
        for r in range(2):
            for p, d in zip(params, big_delta(0, r, dtype)):
                p += d
            w.sync_params()
        saved = [a.copy() for a in ctl.shared_states["downpour"]]
        saved_centre = [c.copy() for c in ctl.centre]
    serving.join()
    assert [a.shape for a in saved] == BIG_SHAPES  # the layout is unchanged: one v per param

    ctl = Controller(control_port=0, num_workers=1, resume_from=str(tmp_path))
    serving = serve(ctl, 60)
    with Worker(ctl.control_port, timeout_s=30) as w:
        params = big_initial(dtype)
        w.init_shared_params(params, Downpour(SGD(0.2, 0.9, nesterov=True)))
        for got, want in zip(ctl.shared_states["downpour"], saved):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(params, saved_centre):
            np.testing.assert_array_equal(got, want)
        for p, d in zip(params, big_delta(0, 2, dtype)):
            p += d
        w.start_sync().wait()
        for i, (c0, v0, d) in enumerate(zip(saved_centre, saved, big_delta(0, 2, dtype))):
            g = c0 - (c0 + d)
            v = 0.9 * v0 + g
            np.testing.assert_array_equal(ctl.shared_states["downpour"][i], v)
            np.testing.assert_array_equal(ctl.centre[i], c0 - 0.2 * (g + 0.9 * v))
    serving.join()


@pytest.mark.parametrize("nesterov", [False, True])
def test_whole_parameter_update_is_the_blocked_kernel_and_handles_views(nesterov):
    # Worker.lock() and non-contiguous parameters take update(): the blocked kernel on
    # contiguous arrays, the plain formula on views; both equal the plain formula.
    lr, mu = 0.2, 0.9
    base = np.random.default_rng(0).normal(size=(300, 500))
    for local in (base.copy(), base.copy()[:, ::2]):
        central = np.random.default_rng(1).normal(size=local.shape)
        rule = Downpour(SGD(lr, mu, nesterov))
        rule.check([local])
        rule.state = [np.full(local.shape, 0.5)]
        rule.setup([local])
        start, c0 = local.copy(), central.copy()
        local += 0.01
        g = start - local
        v = mu * 0.5 + g
        want = c0 - lr * ((g + mu * v) if nesterov else v)
        rule.update_params([local], [central])
        np.testing.assert_array_equal(central, want)
        np.testing.assert_array_equal(local, want)
        np.testing.assert_array_equal(rule.state[0], v)


class PrivateContext:
    """A `RuleContext` over private zeroed arrays, for a rule outside a job."""

    num_workers = None

    def __init__(self, centre):
        self.shared_params = centre
        self.stripes = stripe_ranges(layout_of(centre))  # as a worker's exchange cuts it

    def shared_state(self, name, layout):
        return [np.zeros(e["shape"], e["dtype"]) for e in layout]


@pytest.mark.parametrize("make_optimizer", [lambda: SGD(0.2, 0.9, nesterov=True),
                                            lambda: Adam(0.01, 0.9, 0.99, 1e-6)],
                         ids=["nesterov", "adam"])
def test_journaled_pushes_of_many_blocks_and_mixed_dtypes_are_the_formula(make_optimizer):
    # Each block goes through the journal (float64 rows; the float32 parameter's blocks
    # through private buffers first); the result is bit for bit the whole-array formula.
    rng = np.random.default_rng(3)
    params = [rng.normal(size=2 * BLOCK_ELEMENTS + 5).astype(np.float32), rng.normal(size=(3, 5))]
    centre = [p + rng.normal(size=p.shape).astype(p.dtype) for p in params]
    rule = Downpour(make_optimizer())
    rule.check(params)
    rule.attach(PrivateContext(centre))
    rule.setup(params)
    assert rule._journal is not None
    optimizer, last = make_optimizer(), [p.copy() for p in params]
    want_centre, want_state = [c.copy() for c in centre], [s.copy() for s in rule.state]
    for _ in range(3):
        for p in params:
            p += (rng.normal(size=p.shape) * 0.1).astype(p.dtype)
        for i, p in enumerate(params):
            optimizer.apply(i, want_centre[i], last[i] - p, want_state)
            last[i] = want_centre[i].copy()
        rule.update_params(params, centre)
        for got, want in zip(centre + rule.state + params, want_centre + want_state + last):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
