"""One-pass sync kernels: the compiled `platoon.rules._sync_kernels`, or numpy where it cannot run.

The built-in rules (EASGD, ASGD, Downpour(SGD), DiLoCo) call the functions below first;
each returns True when it did the update, in one pass that reads and writes
every element once, bit-identical to the rule's numpy formula. It returns False,
touching nothing, when the arrays need the numpy path: not C-contiguous, not
native float32 or float64, of mixed dtypes or lengths, overlapping, or when the
compiled module is not in use. The rule then runs its numpy formula.

The module is built by ``pip install`` with the system's C compiler (setup.py,
optional: an install without a compiler still succeeds). When it cannot be
loaded, platoon logs one warning, at the first sync, and syncs with numpy (about
half the speed of a copy instead of a copy's). Set ``PLATOON_SYNC_KERNELS=numpy``
before importing platoon to use numpy on purpose (no warning), or use
``with numpy_only():`` for a block of code (tests compare the two paths this way).

Functions (arrays 1-D or any shape, C-contiguous; scalars Python floats, rounded to
the arrays' dtype as numpy does):

- ``easgd_update(x, c, alpha)``: ``d = alpha*(x-c); x -= d; c += d``
- ``easgd_push(s, c, alpha)``: ``d = alpha*(s-c); c += d; s = -d``
- ``add_into(x, s)``: ``x += s`` (EASGD's pull)
- ``easgd_push_pull(x, s, c, alpha)``: ``d = alpha*(s-c); c += d; x += -d`` (EASGD's push
  and pull of one stripe in one pass, leaving `s` as it was)
- ``asgd_update(x, c, last)``: ``c += x-last; x = c; last = c``
- ``asgd_push(s, c, last)``: ``c += s-last; last = c``
- ``take_pull(x, s, last)``: ``x = (x-s) + last`` (ASGD's and Downpour's pull)
- ``sgd(s, c, last, v, lr, momentum, nesterov, take, divisor=1.0)``: Downpour(SGD) with
  ``g = last-s`` (then ``g /= divisor`` unless it is 1: DiLoCo's ``g/p``), momentum state
  `v` (None without momentum); ``last = c``, and ``s = c`` when `take`.
- ``sgd_staged(s, c, last, v, c_new, v_new, lr, momentum, nesterov, take, divisor)``: the
  same with momentum, but the new centre and momentum go to `c_new` and `v_new` (a
  journal's staging rows, `platoon.rules.journal`), `c` and `v` are only read.

On x86 the module has its loops twice, plain and for AVX, and uses AVX where the
CPU has it (the same operations, so the same bits); ``compiled.isas()`` lists
the sets there are and ``compiled.set_isa(name)`` picks one (for tests).
"""

import contextlib
import logging
import os

log = logging.getLogger(__name__)

ENV = "PLATOON_SYNC_KERNELS"  # "numpy": do not load the compiled kernels; "compiled": default
NAMES = ("easgd_update", "easgd_push", "easgd_push_pull", "add_into", "asgd_update",
         "asgd_push", "take_pull", "sgd", "sgd_staged")

_warned = False


def _load():
    """The compiled module; None with the reason when it is not to be used."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice == "numpy":
        return None, None
    if choice not in ("", "compiled"):
        log.warning("%s=%r is neither 'numpy' nor 'compiled'; using the compiled sync kernels",
                    ENV, os.environ[ENV])
    try:
        from . import _sync_kernels
    except ImportError as exc:
        return None, exc
    missing = [name for name in NAMES if not hasattr(_sync_kernels, name)]
    if missing:  # built from an older source: its kernels would not match this module
        return None, ImportError("the compiled module is out of date (it lacks %s)"
                                 % ", ".join(missing))
    return _sync_kernels, None


compiled, _load_error = _load()  # the module in use, or None


def _fallback(*args):
    global _warned
    if not _warned and _load_error is not None:
        _warned = True
        log.warning("platoon's compiled sync kernels could not be loaded (%s); syncing with "
                    "numpy, at about half the speed. Reinstall platoon with a C compiler present "
                    "to build them (e.g. apt-get install gcc, then from a checkout: pip install "
                    "-e .)", _load_error)
    return False


if compiled is not None:
    easgd_update, easgd_push, add_into = (compiled.easgd_update, compiled.easgd_push,
                                          compiled.add_into)
    easgd_push_pull = compiled.easgd_push_pull
    asgd_update, asgd_push, take_pull = (compiled.asgd_update, compiled.asgd_push,
                                         compiled.take_pull)
    sgd, sgd_staged = compiled.sgd, compiled.sgd_staged
else:
    easgd_update = easgd_push = easgd_push_pull = add_into = asgd_update = asgd_push = \
        take_pull = sgd = sgd_staged = _fallback


def available() -> bool:
    """True when the compiled kernels are in use (not the numpy formulas)."""
    return easgd_update is not _fallback and easgd_update is not _numpy_path


@contextlib.contextmanager
def numpy_only():
    """Run the block with the numpy formulas (for comparisons); restores the kernels after.
    Affects every thread of the process."""
    saved = {name: globals()[name] for name in NAMES}
    for name in NAMES:
        globals()[name] = _numpy_path
    try:
        yield
    finally:
        globals().update(saved)


def _numpy_path(*args):
    return False


# all_reduce's compiled meeting of a node's workers (platoon.collectives): the class
# ``Meeting`` of the compiled module, or None where numpy and Python do the round (the
# module is not built, is out of date, or PLATOON_SYNC_KERNELS=numpy). Both kinds use the
# same words and lock of the segment, so workers of either kind meet each other.
Meeting = getattr(compiled, "Meeting", None)
MEET_DONE, MEET_ARRIVED, MEET_PENDING, MEET_GONE, MEET_COPY = range(5)  # as in the C source
