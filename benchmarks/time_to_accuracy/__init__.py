"""Time to a target test accuracy: platoon against what users would pick instead.

usage: python -m benchmarks.time_to_accuracy [--quick] [--datasets digits,mnist1d]
                                            [--reps N] [--out DIR]

Methods, each with its learning rate (or platoon's own knob) tuned over a grid
of three values: one process of plain torch SGD; Hogwild (a shared model,
2 processes, lock-free); DDP over gloo (2 processes); local SGD with torch's
PeriodicModelAverager (gloo, 2 processes); platoon with 2 worker processes
and a controller process, one entry per sync rule in PLATOON_MODES. Then a
straggler run: one of the two processes sleeps after each step for as long
as its measured step time (2x slower), and each multi-process method's time
to target is divided by its time without.

How it is timed, the same for every method:
- every process is forked from this one (torch already imported), builds its
  model, joins its group (process group, platoon controller), warms up, then
  all wait on one barrier; the clock starts at the barrier. Start-up is
  reported separately ("setup").
- every `eval_every` steps every process evaluates a model on the test set
  (rank 0 the one the method produces: the single model, the shared one, the
  centre; the others their own, so that every process pauses alike) and
  subtracts its evaluation time from its clock. Stopping is decided there.
- each process is single-threaded (torch.set_num_threads(1), SINGLE_THREAD_ENV).
- all methods alternate within each repetition (seeds differ between
  repetitions and from the tuning runs), so machine load hits all alike.

The package: `methods` (what is compared: datasets, models, each method's
per-process part and lr grid), `harness` (one run in forked processes),
`tuning` (the grid search, the measured and straggler repetitions, medians),
`report` (goals, Markdown, the docs page) and `__main__` (the command).

Writes benchmarks/results/time_to_accuracy.json and .md (with --quick:
time_to_accuracy_quick.*) and, for a full run, docs/time-to-accuracy.md.
`--render` rewrites the .md and the docs page from the JSON only.
"""


import os

from .._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)

from .methods import methods  # noqa: E402
from .report import DOC, doc, markdown  # noqa: E402

__all__ = ["DOC", "doc", "markdown", "methods"]
