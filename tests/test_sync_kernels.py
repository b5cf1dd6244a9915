"""The compiled one-pass sync kernels: bit for bit the numpy path, and a logged fallback."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from platoon import ASGD, EASGD, DiLoCo
from platoon._centre.shmem import stripe_ranges  # noqa: PLC2701 (the exchange's cut)
from platoon.protocol import layout_of
from platoon.rules import BLOCK_ELEMENTS, kernels
from platoon.rules.downpour import SGD, Downpour

from helpers import ROOT

# Not multiples of any block or vector width; the stripes start at odd offsets, so the
# kernels also run on arrays not aligned to 8 or 16 bytes.
SIZES = [1, 7, 2 * BLOCK_ELEMENTS + 13]


def stripes(n):
    cuts = sorted({0, min(n, 3), min(n, n // 3 | 1), min(n, BLOCK_ELEMENTS + 5), n})
    return list(zip(cuts, cuts[1:])) or [(0, n)]


def make_rules():
    return {"easgd": EASGD(0.3), "asgd": ASGD(), "sgd": Downpour(SGD(0.2)),
            "momentum": Downpour(SGD(0.2, 0.9)),
            "nesterov": Downpour(SGD(0.2, 0.9, nesterov=True)),
            "diloco": DiLoCo(0.7, 0.9, workers=3),  # g/3: a division that rounds
            "diloco-plain": DiLoCo(0.7, 0.0, workers=3)}


RULES = list(make_rules())


class Context:
    """A `RuleContext` over private arrays: random optimizer state, zeroed journals."""

    num_workers = None

    def __init__(self, centre, rng):
        self.shared_params, self.rng = centre, rng
        self.stripes = stripe_ranges(layout_of(centre))  # as a worker's exchange cuts it

    def shared_state(self, name, layout):
        if name.endswith("-journal"):
            return [np.zeros(e["shape"], e["dtype"]) for e in layout]
        return [self.rng.normal(size=e["shape"]).astype(e["dtype"]) for e in layout]


def setup_rule(rule, params, centre, rng):
    rule.check(params)
    rule.attach(Context(centre, rng))
    rule.setup(params)


def run(name, dtype, n, how):
    """Three syncs of one worker by `how`, moving its parameters in between; returns every
    array the rule touched (parameters, centre, the rule's last copy and state)."""
    rng = np.random.default_rng(n)
    x = [rng.normal(size=n).astype(dtype), rng.normal(size=(3, 5)).astype(dtype)]
    c = [p + rng.normal(size=p.shape).astype(dtype) for p in x]
    rule = make_rules()[name]
    setup_rule(rule, x, c, rng)
    for _step in range(3):
        for p in x:
            p += (rng.normal(size=p.shape) * 0.1).astype(dtype)
        if how == "whole":
            rule.update_params(x, c)
        elif how == "stripes":
            for i, (p, q) in enumerate(zip(x, c)):
                flat, central = p.reshape(-1), q.reshape(-1)
                for a, b in stripes(p.size):
                    rule.update_range(i, a, flat[a:b], central[a:b])
        elif how == "fused":  # the parameters move, then push_pull stripe by stripe (a wait
            snaps = [p.reshape(-1).copy() for p in x]  # that takes over the push)
            for p in x:
                p += 0.01
            for i, (p, s, q) in enumerate(zip(x, snaps, c)):
                for a, b in stripes(s.size):
                    rule.push_pull(i, a, p.reshape(-1)[a:b], s[a:b], q.reshape(-1)[a:b])
        else:  # push then pull, stripe by stripe, with the parameters moving in between
            snaps = [p.reshape(-1).copy() for p in x]
            for i, (s, q) in enumerate(zip(snaps, c)):
                for a, b in stripes(s.size):
                    rule.push(i, a, s[a:b], q.reshape(-1)[a:b])
            for p in x:
                p += 0.01
            for i, (p, s) in enumerate(zip(x, snaps)):
                flat = p.reshape(-1)
                for a, b in stripes(s.size):
                    rule.pull(i, a, flat[a:b], s[a:b])
    return x + c + list(getattr(rule, "_last", [])) + list(getattr(rule, "state", None) or [])


def test_the_compiled_kernels_are_built():
    assert kernels.available(), (
        "platoon.rules._sync_kernels is not loaded (%s); build it: pip install -e . (or python "
        "setup.py build_ext --inplace) with a C compiler present" % (kernels._load_error,))


@pytest.fixture(params=["generic", "avx"])
def isa(request):
    """Each set of loops the compiled module has for this CPU (AVX where there is one)."""
    if not kernels.available():
        pytest.skip("the compiled kernels are not built (test_the_compiled_kernels_are_built)")
    if request.param not in kernels.compiled.isas():
        pytest.skip("no %s loops on this CPU" % request.param)
    before = kernels.compiled.set_isa(request.param)
    yield request.param
    kernels.compiled.set_isa(before)


@pytest.mark.parametrize("how", ["whole", "stripes", "push_pull"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", RULES)
def test_compiled_kernels_are_bit_identical_to_numpy(name, dtype, how, isa):
    for n in SIZES:
        got = run(name, dtype, n, how)
        with kernels.numpy_only():
            want = run(name, dtype, n, how)
        assert len(got) == len(want) >= 4
        for g, w in zip(got, want):
            assert g.dtype == dtype
            assert g.tobytes() == w.tobytes(), (name, dtype, how, n, isa)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", RULES)
def test_push_pull_in_one_pass_is_bit_identical_to_push_then_pull(name, dtype, isa):
    for n in SIZES:
        got = run(name, dtype, n, "fused")
        with kernels.numpy_only():
            want = run(name, dtype, n, "push_pull")
        for g, w in zip(got, want):
            assert g.tobytes() == w.tobytes(), (name, dtype, n, isa)


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "diloco", "diloco-plain"])
def test_downpour_and_diloco_take_the_compiled_kernel(name, monkeypatch, isa):
    # Chosen by what the optimizer computes (SGD, DiLoCo's SGD on g/p), not by its type.
    calls = []
    for kernel in ("sgd", "sgd_staged"):
        def spy(*args, _real=getattr(kernels, kernel), _kernel=kernel):  # noqa: B008 (bound)
            calls.append((_kernel, _real(*args)))
            return calls[-1][1]
        monkeypatch.setattr(kernels, kernel, spy)
    run(name, np.float64, 1000, "stripes")
    assert calls and all(done for _, done in calls), calls
    staged = "sgd_staged" if name in ("momentum", "nesterov", "diloco") else "sgd"
    assert {kernel for kernel, _ in calls} == {staged}  # with momentum: into the journal


def test_an_sgd_subclass_with_its_own_arithmetic_takes_numpy():
    class Clipped(SGD):
        def apply_block(self, central, g, state, scratch):
            np.clip(g, -0.1, 0.1, out=g)
            super().apply_block(central, g, state, scratch)

    assert SGD(0.1, 0.9).kernel_settings() == (0.1, 0.9, False, 1.0)
    assert Clipped(0.1, 0.9).kernel_settings() is None


def test_the_best_loops_for_this_cpu_are_in_use():
    if not kernels.available():
        pytest.skip("the compiled kernels are not built")
    best = kernels.compiled.isas()[-1]
    assert kernels.compiled.set_isa(best) == best
    with pytest.raises(ValueError, match="no avx512 loops"):
        kernels.compiled.set_isa("avx512")


def test_kernels_refuse_what_needs_numpy_and_touch_nothing():
    if not kernels.available():
        pytest.skip("the compiled kernels are not built")
    x, c = np.arange(10, dtype=np.float32), np.ones(10, np.float32)
    before = x.copy(), c.copy()
    refused = [
        kernels.easgd_update(x[::2], c[:5], 0.5),                   # not contiguous
        kernels.easgd_update(x.astype(np.float16), c.astype(np.float16), 0.5),
        kernels.easgd_update(x, c.astype(np.float64), 0.5),         # mixed dtypes
        kernels.easgd_update(x, c[:9], 0.5),                        # lengths differ
        kernels.easgd_update(x.reshape(2, 5), c.reshape(5, 2), 0.5),  # shapes differ
        kernels.easgd_update(x[1:], x[:-1], 0.5),                   # overlapping
        kernels.asgd_update(x, c, x),                               # the same array twice
        kernels.easgd_update(x.astype(">f4"), c.astype(">f4"), 0.5),  # byte-swapped
        kernels.easgd_update(np.arange(4), np.arange(4), 0.5),      # integers
    ]
    readonly = c.copy()
    readonly.flags.writeable = False
    refused.append(kernels.easgd_update(x, readonly, 0.5))
    assert refused == [False] * len(refused)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(c, before[1])
    assert kernels.add_into(x, readonly)  # only written arrays must be writable
    np.testing.assert_array_equal(x, before[0] + 1)


def test_kernels_let_other_threads_run():
    """start_sync pushes in a background thread: the kernel must not hold the GIL. The
    thread holds the GIL from `entering.set()` until the kernel lets it go, so this thread
    sees the centre's last element unwritten only if the kernel runs without the GIL."""
    if not kernels.available():
        pytest.skip("the compiled kernels are not built")
    x, c = np.ones(4_000_000, np.float32), np.zeros(4_000_000, np.float32)
    for _attempt in range(20):  # under load the kernel may finish before this thread runs
        c[-1] = 0.0
        entering = threading.Event()

        def push(entering=entering):
            entering.set()
            kernels.easgd_push(x, c, 0.5)

        thread = threading.Thread(target=push)
        thread.start()
        assert entering.wait(30)
        seen_running = c[-1] == 0.0
        thread.join(30)
        assert c[-1] == 0.5
        if seen_running:
            return
        x.fill(1.0)
    pytest.fail("no other thread ran while the kernel did, in 20 tries: it holds the GIL")


def test_rules_on_arrays_the_kernels_refuse_still_follow_the_formula():
    base = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    x, c = base[:, ::2], np.zeros((4, 3), np.float32)
    want_x = x - np.float32(0.25) * (x - c)
    want_c = c + np.float32(0.25) * (x - c)
    EASGD(0.25).update_params([x], [c])
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(c, want_c)


FALLBACK = r"""
import sys
if sys.argv[1] == "missing":
    sys.modules["platoon.rules._sync_kernels"] = None  # makes the import fail, as with no .so
import numpy as np
from platoon import EASGD
from platoon.rules import kernels
print("available", kernels.available())
x, c = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
rule = EASGD(0.5)
for _ in range(3):
    rule.update_params([x], [c])
print("result", x.tolist(), c.tolist())
"""


@pytest.mark.parametrize("why", ["missing", "env"])
def test_without_the_compiled_kernels_syncs_use_numpy_and_say_so_once(why):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop(kernels.ENV, None)
    if why == "env":
        env[kernels.ENV] = "numpy"
    done = subprocess.run([sys.executable, "-c", FALLBACK, why], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "available False" in done.stdout
    assert "result [0.0, 0.5, 1.0, 1.5, 2.0] [0.0, 0.5, 1.0, 1.5, 2.0]" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "sync kernels" in line]
    if why == "missing":  # one line, however many syncs, saying what to do
        assert len(warnings) == 1, done.stderr
        assert "could not be loaded" in warnings[0]
        assert "Reinstall platoon with a C compiler" in warnings[0]
    else:  # asked for: no warning
        assert warnings == [], done.stderr
