"""Sync rule arithmetic, exactly, against the plain formulas."""

import numpy as np
import pytest

from platoon import ASGD, EASGD, ParamSyncRule
from platoon.rules import BLOCK_ELEMENTS


def naive_easgd(x, c, alpha):
    d = alpha * (x - c)
    x -= d
    c += d


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("size", [1, 17, BLOCK_ELEMENTS, 2 * BLOCK_ELEMENTS + 5])
def test_easgd_is_bit_identical_to_the_formula(dtype, size):
    rng = np.random.default_rng(size)
    x = rng.normal(size=size).astype(dtype)
    c = rng.normal(size=size).astype(dtype)
    x2, c2 = x.copy(), c.copy()
    rule = EASGD(0.3)
    rule.check([x])
    rule.setup([x])
    rule.update_params([x], [c])
    naive_easgd(x2, c2, 0.3)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(c, c2)


def test_easgd_on_small_arrays_by_hand():
    x = np.array([1.0, 2.0, 4.0], np.float32)
    c = np.array([0.0, 2.0, 0.0], np.float32)
    EASGD(0.5).update_params([x], [c])
    np.testing.assert_array_equal(x, [0.5, 2.0, 2.0])
    np.testing.assert_array_equal(c, [0.5, 2.0, 2.0])


def test_easgd_handles_non_contiguous_local_views():
    base = np.arange(40, dtype=np.float64).reshape(5, 8)
    x = base[:, ::2]
    c = np.zeros((5, 4))
    want_x, want_c = x.copy(), c.copy()
    naive_easgd(want_x, want_c, 0.25)
    EASGD(0.25).update_params([x], [c])
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(c, want_c)
    np.testing.assert_array_equal(base[:, ::2], want_x)  # written through the view


def test_asgd_pushes_changes_since_last_sync_and_takes_the_centre():
    c = np.array([10.0, 10.0])
    x = c.copy()
    rule = ASGD()
    rule.setup([x])
    x += [1.0, -2.0]
    rule.update_params([x], [c])
    np.testing.assert_array_equal(c, [11.0, 8.0])
    np.testing.assert_array_equal(x, [11.0, 8.0])
    c += [5.0, 5.0]  # another worker pushed meanwhile
    x += [1.0, 1.0]
    rule.update_params([x], [c])
    np.testing.assert_array_equal(c, [17.0, 14.0])
    np.testing.assert_array_equal(x, c)


@pytest.mark.parametrize("size", [5, BLOCK_ELEMENTS + 3])
def test_several_workers_interleaving(size):
    """Three workers with their own rule instances sync in an arbitrary order."""
    rng = np.random.default_rng(0)
    init = rng.normal(size=size)
    for make in (lambda: EASGD(0.4), ASGD):
        centre = init.copy()
        locals_ = [init.copy() for _ in range(3)]
        rules = [make() for _ in range(3)]
        for x, rule in zip(locals_, rules):
            rule.setup([x])
        # Plain-formula replay of the same schedule.
        ref_c = init.copy()
        ref_x = [init.copy() for _ in range(3)]
        ref_last = [init.copy() for _ in range(3)]
        order = [0, 2, 1, 1, 0, 2, 2, 0, 1]
        for _step, k in enumerate(order):
            delta = rng.normal(size=size)
            locals_[k] += delta
            ref_x[k] += delta
            rules[k].update_params([locals_[k]], [centre])
            if isinstance(rules[k], EASGD):
                naive_easgd(ref_x[k], ref_c, 0.4)
            else:
                ref_c += ref_x[k] - ref_last[k]
                ref_x[k] = ref_c.copy()
                ref_last[k] = ref_c.copy()
        np.testing.assert_array_equal(centre, ref_c)
        for x, rx in zip(locals_, ref_x):
            np.testing.assert_array_equal(x, rx)


def test_a_user_rule_subclass():
    class TakeCentre(ParamSyncRule):
        def update(self, index, local, central):
            local[...] = central

    x, c = np.zeros(3), np.arange(3.0)
    TakeCentre().update_params([x], [c])
    np.testing.assert_array_equal(x, c)


def test_base_rule_says_what_to_override():
    with pytest.raises(NotImplementedError, match="update"):
        ParamSyncRule().update_params([np.zeros(1)], [np.zeros(1)])


@pytest.mark.parametrize("alpha", [0, -0.1, 1.5, float("nan")])
def test_easgd_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        EASGD(alpha)


def test_rules_reject_integer_parameters():
    with pytest.raises(TypeError, match="parameter 1 is int32"):
        EASGD(0.5).check([np.zeros(2), np.zeros(2, np.int32)])


def test_capabilities_are_declared_on_the_class():
    assert not ParamSyncRule.elementwise and not ParamSyncRule.supports_async
    for rule in (EASGD(0.5), ASGD()):
        assert rule.elementwise and rule.supports_async


def test_a_user_rule_declaring_async_without_push_and_pull_is_refused():
    with pytest.raises(TypeError, match=r"Half declares supports_async = True but does not "
                                        r"implement pull\(\)"):
        class Half(ParamSyncRule):
            elementwise = True
            supports_async = True

            def update(self, index, local, central):
                local[...] = central

            def push(self, index, start, snapshot, central):
                pass


def test_a_user_rule_declaring_async_needs_elementwise():
    with pytest.raises(TypeError, match="needs elementwise = True"):
        class Whole(ParamSyncRule):
            supports_async = True

            def update(self, index, local, central):
                pass

            def push(self, index, start, snapshot, central):
                pass

            def pull(self, index, start, local, snapshot):
                pass


def test_a_user_rule_declaring_elementwise_must_update_and_flags_are_booleans():
    with pytest.raises(TypeError, match="elementwise = True but implements neither"):
        class Nothing(ParamSyncRule):
            elementwise = True
    with pytest.raises(TypeError, match="Flag.elementwise must be True or False"):
        class Flag(ParamSyncRule):
            elementwise = "yes"


def test_attach_is_a_hook_and_bind_worker_still_works_with_a_warning():
    seen = []

    class Attaching(ParamSyncRule):
        def attach(self, worker):
            seen.append(("attach", worker))

    Attaching().attach("w")
    with pytest.warns(DeprecationWarning, match=r"Legacy.bind_worker\(\) is deprecated: rename "
                                                r"it attach\(worker\)"):
        class Legacy(ParamSyncRule):
            def bind_worker(self, worker):
                seen.append(("bind", worker))

    Legacy().attach("v")  # the worker calls attach: it reaches the old method
    with pytest.warns(DeprecationWarning, match="call attach"):
        Attaching().bind_worker("u")
    assert seen == [("attach", "w"), ("bind", "v"), ("attach", "u")]
    ParamSyncRule().attach("anything")  # the base hook does nothing


class PlainContext:
    """A `platoon.rules.RuleContext` without a controller: the centre and the shared states
    are plain arrays of this process."""

    def __init__(self, centre, num_workers):
        self.shared_params = centre
        self.num_workers = num_workers
        self.states = {}

    def shared_state(self, name, layout):
        if name not in self.states:
            self.states[name] = [np.zeros(e["shape"], e["dtype"]) for e in layout]
        return self.states[name]


def pushed_centre(rule, num_workers, pushes):
    """The centre after `pushes` (one array of new local values each) by one worker under
    `rule`, attached to a PlainContext."""
    centre = [np.zeros(1000, np.float32)]
    local = [centre[0].copy()]
    rule.check(local)
    rule.attach(PlainContext(centre, num_workers))
    rule.setup(local)
    for values in pushes:
        local[0][...] = values
        rule.update(0, local[0], centre[0])
    return centre[0]


def test_rules_with_shared_state_attach_to_any_context_without_a_controller():
    from platoon import SGD, DelayedNesterov, DiLoCo, Downpour
    from platoon.rules import RuleContext  # noqa: F401  (what PlainContext implements)
    rng = np.random.default_rng(3)
    pushes = [rng.standard_normal(1000).astype(np.float32) for _ in range(5)]
    # DiLoCo(L) with p workers is Downpour(SGD(L / p)) with the same momentum, bit for bit
    # when p is a power of two (docs/api.md)
    diloco = pushed_centre(DiLoCo(0.8, momentum=0.9), 4, pushes)
    downpour = pushed_centre(Downpour(SGD(0.2, momentum=0.9, nesterov=True)), 4, pushes)
    assert np.array_equal(diloco, downpour)
    assert np.abs(diloco).max() > 0.1  # the pushes moved it
    # Delayed Nesterov's default delay is the context's number of workers
    rule = DelayedNesterov(0.7)
    pushed_centre(rule, 3, pushes[:1])
    assert rule.optimizer.delay == 3
    with pytest.raises(ValueError, match="num_workers"):
        pushed_centre(DiLoCo(0.8), None, pushes)


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("alpha", [0.25, 0.45])
def test_easgd_centre_drifts_at_p_over_p_plus_1_of_a_worker_and_asgd_at_p(workers, alpha):
    """Why elastic averaging loses steps (docs/choosing-a-rule.md): when every worker moves
    the same way between syncs, the centre, which gets no gradient, holds them back; it
    settles at p/(p+1) of one worker's speed whatever alpha. ASGD adds every worker's change."""
    tau, rounds = 4, 400
    for rule_of, expected in ((lambda: EASGD(alpha), workers / (workers + 1)),
                              (ASGD, float(workers))):
        centre = [np.zeros(1)]
        rules, xs = [rule_of() for _ in range(workers)], [np.zeros(1) for _ in range(workers)]
        for rule, x in zip(rules, xs):
            rule.check([x])
            rule.setup([x])
        for _ in range(rounds):
            for rule, x in zip(rules, xs):
                x += tau  # tau steps of size 1 along the shared direction
                rule.update_params([x], centre)
        start = centre[0].copy()
        for _ in range(rounds):
            for rule, x in zip(rules, xs):
                x += tau
                rule.update_params([x], centre)
        speed = float(centre[0][0] - start[0]) / (rounds * tau)
        assert abs(speed - expected) < 1e-3 * expected, (rule_of(), speed, expected)


def test_a_rule_takes_its_stripes_from_the_context():
    """Downpour's journal has one slot per stripe of the worker's cut (RuleContext.stripes),
    not of a cut the rule makes up; a context without stripes has one."""
    from platoon import SGD, Downpour
    centre = [np.zeros(1000, np.float32), np.zeros(10, np.float32)]
    cut = [[(0, 0, 500)], [(0, 500, 1000), (1, 0, 10)]]
    for stripes, slots in ((cut, 2), (None, 1)):
        ctx = PlainContext(centre, 2)
        if stripes is not None:
            ctx.stripes = stripes
        rule = Downpour(SGD(0.1, 0.9, nesterov=True))
        rule.check([c.copy() for c in centre])
        rule.attach(ctx)
        journal = ctx.states["%s-journal" % rule.state_name]
        assert journal[0].shape[0] == slots, [a.shape for a in journal]


# Each rule declares its kernels once (`sync_kernels`); adapters ask the rule
# (`device_kernels`), never its type.


def test_the_built_in_rules_declare_every_compiled_kernel_once_and_nothing_else():
    from platoon.rules import Downpour, kernels
    declared = [name for rule in (EASGD, ASGD, Downpour) for name in rule.sync_kernels.compiled
                if name != "take_pull"]  # the pull that ASGD and Downpour share
    assert sorted(declared + ["take_pull"]) == sorted(kernels.NAMES)
    assert {type(EASGD(0.5).device_kernels()).__name__,
            type(ASGD().device_kernels()).__name__} == {"EASGDOnDevice", "ASGDOnDevice"}
    assert Downpour.sync_kernels.device is None and ParamSyncRule().device_kernels() is None


def test_a_subclass_keeps_the_device_kernels_unless_it_changes_the_maths():
    from platoon.adapters.torch_registered import unfit
    from platoon.rules.base import SyncKernels
    torch = pytest.importorskip("torch")

    class Named(EASGD):  # only a name: the maths, hence the kernels, are EASGD's
        def __repr__(self):
            return "Named()"

    class Damped(EASGD):  # its own update: its code must run, so no device kernels
        def update(self, index, local, central):
            super().update(index, local, central)
            local *= 0.5

    class Mine(ParamSyncRule):  # a new rule runs EASGD's device kernels by declaring them
        elementwise = True
        alpha = 0.25
        sync_kernels = SyncKernels(device="elastic_torch:EASGDOnDevice")

        def update(self, index, local, central):
            EASGD(self.alpha).update(index, local, central)

    assert Named(0.5).device_kernels().alpha == 0.5 and Mine().device_kernels().alpha == 0.25
    assert Damped(0.5).device_kernels() is None
    on_cpu = [torch.zeros(3)]
    assert "not all on one GPU" in unfit(on_cpu, Named(0.5))
    assert "not all on one GPU" in unfit(on_cpu, Mine())
    assert "declare device kernels" in unfit(on_cpu, Damped(0.5))
    assert "declare device kernels" in unfit(on_cpu, object())
    with pytest.raises(TypeError, match="compiled kernels that platoon.rules.kernels does not "
                                        "have: easgd_fused"):
        class Typo(EASGD):
            sync_kernels = SyncKernels(compiled=("easgd_fused",))
