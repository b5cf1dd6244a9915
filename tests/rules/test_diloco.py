"""DiLoCo and Delayed Nesterov on the centre: their arithmetic exactly, the 1/p rule, the
push counter under concurrent pushes, and checkpoint/resume of the outer state."""

import random
import time

import numpy as np
import pytest
from test_downpour import ROUNDS, big_delta, big_initial, delta, initial, reference, run_job

import platoon
from platoon import Controller, DelayedNesterov, DiLoCo, Worker

# -- references, written from the papers' formulas, independently of platoon --

def diloco_step(lr, mu, nesterov, p, shapes, dtype):
    """Outer SGD on g/p, one push at a time; returns step(i, c, g) and the velocities."""
    vel = [np.zeros(s, dtype) for s in shapes]

    def step(i, c, g):
        g = g / p
        if not mu:
            return c - lr * g
        vel[i] = mu * vel[i] + g
        return c - lr * ((g + mu * vel[i]) if nesterov else vel[i])

    return step, vel


def delayed_nesterov_step(lr, beta, n, a, shapes, dtype):
    """Algorithm 3 of arXiv 2401.09135, one push at a time; returns step and (m, D, t)."""
    m = [np.zeros(s, dtype) for s in shapes]
    buf = [np.zeros(s, dtype) for s in shapes]
    t = [0] * len(shapes)

    def step(i, c, g):
        buf[i] = buf[i] + g
        t[i] += 1
        if t[i] % n == 0:
            m[i] = beta * m[i] + buf[i] / n
            buf[i] = np.zeros_like(buf[i])
            return c - lr * ((1.0 - a * n + a) * beta * m[i] + g / n)
        if a:
            return c - lr * ((a * beta) * m[i] + g / n)
        return c - lr * (g / n)

    return step, (m, buf, t)


def synced(w):
    w.sync_params()


# -- the arithmetic, bit for bit, with real workers --

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,mu,nesterov", [(2, 0.9, True), (3, 0.9, True), (2, 0.9, False),
                                           (3, 0.0, False)])
def test_diloco_on_the_centre_is_exact(serve, dtype, n, mu, nesterov):
    lr = 0.7
    shapes = [p.shape for p in initial(dtype)]
    centre, params, states, _, _ = run_job(serve, lambda: DiLoCo(lr, mu, nesterov), dtype,
                                           synced, initial, delta, ROUNDS, n)
    step, vel = diloco_step(lr, mu, nesterov, n, shapes, dtype)  # p = n, from the job
    want_c, want_x = reference(dtype, step, n)
    for got, want in zip(centre, want_c):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    for k in range(n):
        for got, want in zip(params[k], want_x[k]):
            np.testing.assert_array_equal(got, want)
    for got, want in zip(states.get("diloco", []), vel if mu else []):
        np.testing.assert_array_equal(got, want)
    assert ("diloco" in states) == bool(mu)


@pytest.mark.parametrize("delay,activation", [(2, 0.0), (3, 0.0), (3, 0.25)])
def test_delayed_nesterov_on_the_centre_is_exact(serve, delay, activation):
    lr, beta, dtype, n = 0.7, 0.9, np.float64, 2
    shapes = [p.shape for p in initial(dtype)]
    centre, params, states, _, _ = run_job(
        serve, lambda: DelayedNesterov(lr, beta, delay=delay, activation=activation), dtype,
        synced, initial, delta, ROUNDS, n)
    step, (m, buf, t) = delayed_nesterov_step(lr, beta, delay, activation, shapes, dtype)
    want_c, want_x = reference(dtype, step, n)
    for got, want in zip(centre, want_c):
        np.testing.assert_array_equal(got, want)
    for k in range(n):
        for got, want in zip(params[k], want_x[k]):
            np.testing.assert_array_equal(got, want)
    state = states["delayed-nesterov"]
    for got, want in zip(state, m + buf):
        np.testing.assert_array_equal(got, want)
    for got in state[4:]:
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, n * ROUNDS)  # every push counted once, everywhere


@pytest.mark.parametrize("rule", ["diloco", "delayed-nesterov"])
def test_striped_and_background_pushes_are_bit_identical(serve, rule):
    dtype, lr, mu = np.float32, 0.7, 0.9
    shapes = [p.shape for p in big_initial(dtype)]
    if rule == "diloco":
        def make():
            return DiLoCo(lr, mu)
        step, _ = diloco_step(lr, mu, True, 2, shapes, dtype)
    else:
        def make():
            return DelayedNesterov(lr, mu)  # delay = p = 2
        step, _ = delayed_nesterov_step(lr, mu, 2, 0.0, shapes, dtype)

    def sync(w):
        w.start_sync().wait(timeout_s=30)

    centre, params, _, striped, stripes = run_job(serve, make, dtype, sync, big_initial,
                                                  big_delta, 3, 2)
    assert all(striped) and stripes > 2
    want_c, want_x = reference(dtype, step, 2, 3, big_initial, big_delta)
    for got, want in zip(centre, want_c):
        np.testing.assert_array_equal(got, want)
    for k in range(2):
        for got, want in zip(params[k], want_x[k]):
            np.testing.assert_array_equal(got, want)


# -- the 1/p rule --

C0 = [np.arange(-12, 12, dtype=np.float64).reshape(4, 6) / 8]  # on a dyadic grid, so that
G = [np.arange(24, dtype=np.float64).reshape(4, 6) % 5 / 64 - 1 / 32]  # c0 - (c0 - g) == g


def push_same_g(serve, make_rule, rounds=1):
    """Two workers start at C0; each round each one moves by -G from where its last sync
    left it (so pushes g = G) and syncs. Returns the centre after every round and the
    shared states."""
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    centres = []
    with Worker(ctl.control_port, timeout_s=10) as a, Worker(ctl.control_port, timeout_s=10) as b:
        pa, pb = [C0[0].copy()], [C0[0].copy()]
        a.init_shared_params(pa, make_rule())
        b.init_shared_params(pb, make_rule())
        assert a.num_workers == b.num_workers == 2
        for _ in range(rounds):
            for p in (pa, pb):
                p[0] -= G[0]
            a.sync_params()
            b.sync_params()
            centres.append(ctl.centre[0].copy())
        states = {k: [s.copy() for s in v] for k, v in ctl.shared_states.items()}
    serving.join()
    return centres, states


def test_without_momentum_two_pushes_of_g_are_one_synchronous_step(serve):
    lr = 0.7
    centres, _ = push_same_g(serve, lambda: DiLoCo(lr, momentum=0.0))
    np.testing.assert_allclose(centres[0], C0[0] - lr * G[0], rtol=0, atol=1e-15)
    # Not divided by p, the same lr would have moved the centre twice as far:
    assert not np.allclose(centres[0], C0[0] - 2 * lr * G[0])


def test_with_momentum_the_lr_term_is_synchronous_and_momentum_decays_per_push(serve):
    lr, mu = 0.7, 0.9
    centres, states = push_same_g(serve, lambda: DiLoCo(lr, mu))
    # push 1: v = g/2, c -= lr(g/2 + mu g/2); push 2: v = (1 + mu) g/2, c -= lr(g/2 + mu v)
    want = C0[0] - lr * G[0] * (1 + mu + mu * mu / 2)
    np.testing.assert_allclose(centres[0], want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(states["diloco"][0], (1 + mu) * G[0] / 2, rtol=1e-15)
    sync_step = C0[0] - lr * (G[0] + mu * G[0])  # synchronous DiLoCo: v = g
    assert not np.allclose(centres[0], sync_step)  # the documented difference: mu^2/2


def test_delayed_nesterov_with_delay_p_is_synchronous_diloco(serve):
    lr, mu, rounds = 0.7, 0.9, 3
    centres, states = push_same_g(serve, lambda: DelayedNesterov(lr, mu), rounds)
    c, v = C0[0].copy(), np.zeros_like(C0[0])
    for r in range(rounds):  # synchronous DiLoCo: the mean of two equal g is g
        v = mu * v + G[0]
        c = c - lr * (G[0] + mu * v)
        np.testing.assert_allclose(centres[r], c, rtol=0, atol=1e-14)
    m, buf, t = states["delayed-nesterov"]
    np.testing.assert_allclose(m, v, rtol=1e-14)
    np.testing.assert_array_equal(buf, 0)
    np.testing.assert_array_equal(t, 2 * rounds)


@pytest.mark.parametrize("p", [2, 4, 3])
def test_g_over_p_and_lr_over_p_are_the_same_rule(p):
    # v = mu v + g/p; c -= lr (g/p + mu v)  versus  u = mu u + g; c -= (lr/p)(g + mu u).
    lr, mu = 0.7, 0.9
    rng = np.random.default_rng(p)
    c1 = rng.normal(size=1000)
    c2, v, u = c1.copy(), np.zeros(1000), np.zeros(1000)
    for _ in range(20):
        g = rng.normal(size=1000) * 0.01
        v = mu * v + g / p
        c1 = c1 - lr * (g / p + mu * v)
        u = mu * u + g
        c2 = c2 - (lr / p) * (g + mu * u)
    if p in (2, 4):  # scaling by a power of two is exact and commutes with rounding
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(u, p * v)
    else:            # otherwise the two round differently, within a few ulps
        np.testing.assert_allclose(c1, c2, rtol=1e-13)
        assert not np.array_equal(c1, c2)


# -- Delayed Nesterov's counter under concurrent pushes --

def test_push_counter_is_exact_under_concurrent_pushes(serve, procs):
    n, rounds, delay = 3, 8, 4
    lr, beta, step = 0.5, 0.9, 0.015625  # as in tests/procs/outer_worker.py
    ctl = Controller(control_port=0, num_workers=n)
    serving = serve(ctl, 90)
    workers = [procs("outer_worker.py", ctl.control_port, rounds, mode, delay)
               for mode in ("sync", "async", "sync")]
    for w in workers:
        assert w.wait(90) == 0, w.output
    centre = [c.copy() for c in ctl.centre]
    m, buf, t = [[a.copy() for a in arrays] for arrays in zip(
        *[iter(ctl.shared_states["delayed-nesterov"])] * 2)]
    serving.join()
    assert all(c.size > 500_000 for c in centre)  # several stripes, pushed concurrently
    # Every push reached every element exactly once: no increment lost, none doubled.
    for counter in t:
        np.testing.assert_array_equal(counter, n * rounds)
    # Each push carries g = -step (up to the rounding of (c + step) - c), so the order in
    # which stripes took them does not matter: the centre is the sequential algorithm's.
    want, (m_ref, buf_ref, _) = sequential_dn(lr, beta, delay, -step, n * rounds)
    for got in centre:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    for got in m:
        np.testing.assert_allclose(got, m_ref, rtol=0, atol=1e-12)
    for got in buf:
        np.testing.assert_allclose(got, buf_ref, rtol=0, atol=1e-12)


def sequential_dn(lr, beta, n, g, pushes):
    """Algorithm 3 on a scalar centre starting at 0, every push carrying g."""
    c = m = buf = 0.0
    for t in range(1, pushes + 1):
        buf += g
        if t % n == 0:
            m = beta * m + buf / n
            buf = 0.0
            c -= lr * (beta * m + g / n)
        else:
            c -= lr * g / n
    return c, (m, buf, pushes)


# -- checkpoint and resume of the outer state --

def test_delayed_nesterov_state_is_checkpointed_and_resumed(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    dtype, lr, beta, delay = np.float64, 0.7, 0.9, 3
    shapes = [p.shape for p in initial(dtype)]
    step, (m, buf, t) = delayed_nesterov_step(lr, beta, delay, 0.0, shapes, dtype)
    ctl = Controller(control_port=0, num_workers=1, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, DelayedNesterov(lr, beta, delay=delay))
        for r in range(2):  # two pushes: the buffer holds both, no momentum yet
            for p, d in zip(params, delta(0, r, dtype)):
                p += d
            w.sync_params()
        saved_centre = [c.copy() for c in ctl.centre]
    serving.join()  # serve() checkpoints when it ends

    ctl = Controller(control_port=0, num_workers=1, resume_from=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, DelayedNesterov(lr, beta, delay=delay))
        state = ctl.shared_states["delayed-nesterov"]
        np.testing.assert_array_equal(state[4], 2)  # the counter carries on
        assert np.any(state[2] != 0)                 # and so does the buffer
        for p, d in zip(params, delta(0, 2, dtype)):
            p += d
        w.sync_params()  # the third push: the momentum moves
        centre = [c.copy() for c in ctl.centre]
        resumed = [s.copy() for s in state]
    serving.join()

    # The same three pushes without a restart.
    c = initial(dtype)
    for r in range(3):
        for i, d in enumerate(delta(0, r, dtype)):
            x = c[i] + d
            c[i] = step(i, c[i], c[i] - x)
        if r == 1:
            for got, want in zip(saved_centre, c):
                np.testing.assert_array_equal(got, want)
    for got, want in zip(centre, c):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(resumed, m + buf):
        np.testing.assert_array_equal(got, want)
    assert np.any(resumed[0] != 0) and not np.any(resumed[2])  # m moved, D emptied


# -- the number of workers, and settings --

def test_the_number_of_workers_comes_from_the_job_or_must_be_given(serve):
    ctl = Controller(control_port=0)  # no num_workers: the workers cannot know p
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        assert w.num_workers is None
        with pytest.raises(ValueError, match=r"num_workers=N .*DiLoCo\(workers=N\)"):
            w.init_shared_params([np.zeros(3)], DiLoCo())
    serving.join()
    ctl = Controller(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = [np.zeros(3)]
        w.init_shared_params(params, DiLoCo(1.0, momentum=0.0, workers=4))
        params[0] += 1.0
        w.sync_params()
        np.testing.assert_array_equal(ctl.centre[0], 0.25)  # g/p with p = 4
    serving.join()


def test_bad_settings_say_what_fits():
    with pytest.raises(ValueError, match="lr must be > 0"):
        DiLoCo(outer_lr=0)
    with pytest.raises(ValueError, match="momentum must be in"):
        DiLoCo(momentum=1.0)
    with pytest.raises(ValueError, match="workers must be a whole number"):
        DiLoCo(workers=0)
    with pytest.raises(ValueError, match="delay must be a whole number"):
        DelayedNesterov(delay=0)
    with pytest.raises(ValueError, match=r"activation must be in \[0, 1/delay\]"):
        DelayedNesterov(delay=4, activation=0.5)
    rule = DiLoCo(momentum=0.0)
    assert not rule.nesterov and rule.elementwise and rule.supports_async
    assert DelayedNesterov().elementwise and DelayedNesterov().supports_async
    assert platoon.DiLoCo is DiLoCo and platoon.DelayedNesterov is DelayedNesterov


def test_diloco_momentum_is_checkpointed_and_resumed(serve, tmp_path):
    path = str(tmp_path / "centre.npz")
    dtype, lr, mu = np.float64, 0.7, 0.9
    shapes = [p.shape for p in initial(dtype)]
    step, vel = diloco_step(lr, mu, True, 1, shapes, dtype)
    ctl = Controller(control_port=0, num_workers=1, checkpoint_path=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, DiLoCo(lr, mu))
        for r in range(2):
            for p, d in zip(params, delta(0, r, dtype)):
                p += d
            w.sync_params()
    serving.join()

    ctl = Controller(control_port=0, num_workers=1, resume_from=path)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        params = initial(dtype)
        w.init_shared_params(params, DiLoCo(lr, mu))
        for p, d in zip(params, delta(0, 2, dtype)):
            p += d
        w.sync_params()
        centre = [c.copy() for c in ctl.centre]
        velocity = [v.copy() for v in ctl.shared_states["diloco"]]
    serving.join()
    c = initial(dtype)
    for r in range(3):  # the same pushes without a restart: the momentum carried on
        for i, d in enumerate(delta(0, r, dtype)):
            x = c[i] + d
            c[i] = step(i, c[i], c[i] - x)
    for got, want in zip(centre + velocity, c + vel):
        np.testing.assert_array_equal(got, want)


def test_diloco_is_downpour_sgd_with_its_lr_divided_by_p(serve):
    # v = mu v + g/p; c -= L (g/p + mu v)  is  u = mu u + g; c -= (L/p)(g + mu u), u = p v:
    # bit for bit with p = 2.
    dtype = np.float64
    dl, dl_params, dl_states, _, _ = run_job(serve, lambda: DiLoCo(0.4, 0.9), dtype, synced,
                                             initial, delta, ROUNDS, 2)
    dp, dp_params, dp_states, _, _ = run_job(
        serve, lambda: platoon.Downpour(platoon.SGD(0.2, 0.9, nesterov=True)), dtype, synced,
        initial, delta, ROUNDS, 2)
    for a, b in zip(dl + dl_params[0] + dl_params[1], dp + dp_params[0] + dp_params[1]):
        np.testing.assert_array_equal(a, b)
    for v, u in zip(dl_states["diloco"], dp_states["downpour"]):
        np.testing.assert_array_equal(2 * v, u)


# -- pushers killed part-way through a push --

class Tolerant(Controller):
    """Carries on when a worker dies."""

    def handle_worker_death(self, worker_id, exit_info):
        pass


def test_a_killed_pusher_leaves_a_state_whole_pushes_explain(serve, procs):
    # Pushers (tests/procs/dn_pusher.py) push g = STEP over and over and are SIGKILLed at
    # random moments. Each element's counter t must then match its centre, momentum and
    # buffer after t whole pushes (a block whose counter moved without its centre, or
    # half-written, fails), and a Fortran-ordered worker, which syncs whole parameters
    # under the whole lock, must keep syncing.
    lr, beta, delay, step, shape = 0.5, 0.5, 4, 0.015625, (1000, 2000)  # as in dn_pusher.py
    rng = random.Random(8)
    ctl = Tolerant(control_port=0)
    serving = serve(ctl, 120)
    with Worker(ctl.control_port, timeout_s=30) as keeper:  # keeps the job open
        params = [np.zeros(shape, order="F")]
        keeper.init_shared_params(params, DelayedNesterov(lr, beta, delay=delay))
        for _ in range(5):
            victims = [procs("dn_pusher.py", ctl.control_port, "C", 0) for _ in range(2)]
            for v in victims:
                v.wait_for_line("READY", 60)
            time.sleep(rng.uniform(0.0, 0.2))  # not to synchronise: a random moment to kill
            for v in victims:
                v.kill()
        t = ctl.shared_states["delayed-nesterov"][2].copy()
        assert len(np.unique(t)) > 1  # the kills cut syncs part-way
        for _ in range(3):  # failed with "push counters ... differ" once a kill cut a sync
            params[0] -= step
            keeper.sync_params()
        centre = ctl.centre[0].copy()
        m, buf, t = [a.copy() for a in ctl.shared_states["delayed-nesterov"]]
    serving.join()
    assert t.min() >= 10
    for pushes in np.unique(t):
        at = t == pushes
        want_c, (want_m, want_buf, _) = sequential_dn(lr, beta, delay, step, int(pushes))
        bad = np.flatnonzero(np.abs(centre[at] - want_c) > 1e-9)
        assert not bad.size, "%d elements with %d pushes counted have a centre of other " \
            "pushes (first: %r, want %r)" % (bad.size, pushes, centre[at][bad[0]], want_c)
        np.testing.assert_allclose(m[at], want_m, rtol=0, atol=1e-9)
        np.testing.assert_allclose(buf[at], want_buf, rtol=0, atol=1e-9)


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_the_ties_outer_step_is_diloco_s_bit_for_bit(mu):
    """The node centres' tie (mpi and elastic) applies DiLoCo's outer step, not a copy: the
    same bits as DiLoCo's per-push kernel and numpy path with p = 1 on g = -d (velocity -u),
    and as the formula the tie wrote by hand before."""
    from platoon.node.tie import outer_step
    from platoon.rules import kernels
    rng = np.random.default_rng(36)
    anchor = rng.standard_normal(100_003).astype(np.float32)
    ties, by_hand, compiled, numpy_path = (anchor.copy() for _ in range(4))
    u, u_hand, v_compiled, v_numpy = (np.zeros_like(anchor) for _ in range(4))
    rule = DiLoCo(0.7, mu, workers=1)
    rule.optimizer.workers = 1  # what attach sets
    settings = rule.optimizer.kernel_settings()
    for _ in range(3):
        d = rng.standard_normal(anchor.size).astype(np.float32)
        outer_step(ties, u, d, 0.7, mu)
        u_hand *= mu  # the tie's formula before it reused the rule's
        u_hand += d
        step = u_hand * mu
        step += d
        step *= 0.7
        by_hand += step
        last, s = np.zeros_like(d), d.copy()  # g = last - s = -d, exactly
        if not kernels.sgd(s, compiled, last, v_compiled if mu else None, *settings[:3],
                           False, settings[3]):
            pytest.skip("the compiled kernels are not built here")
        rule.optimizer.apply_block(numpy_path, -d, [v_numpy], np.empty_like(d))
    for other in (by_hand, compiled, numpy_path):
        np.testing.assert_array_equal(ties.view(np.int32), other.view(np.int32))
    if mu:
        np.testing.assert_array_equal(u, -v_compiled)
