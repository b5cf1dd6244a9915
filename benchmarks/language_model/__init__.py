"""Time to a target validation loss on real text: platoon against what users would pick.

usage: python -m benchmarks.language_model [--quick] [--tune] [--methods a,b] [--reps N]

The text is the Python standard library's own source (every machine has it offline; see
`corpus`), read as bytes; the model a byte-level LSTM trained with clipped SGD (`problem`);
the target a validation bits-per-byte late enough that a doubled batch (DDP with 2
processes) needs measurably fewer steps per process than one process.

It reuses benchmarks/time_to_accuracy's harness: every method in forked single-threaded
processes, a barrier before the clock starts, evaluation time excluded, methods alternating
within each repetition. `--tune` is the separate step that tunes each method's lr on its grid
(seed 0) and records the choice in benchmarks/results/language_model_tuning.json; the
measured run takes the recorded lrs, runs every method on 3 new seeds, then the 2x straggler
runs, then the faults (`faults`: a worker SIGKILLed halfway, platoon under the real launcher
with --restart and --keep-going, DDP under torchrun --max-restarts resuming from its
checkpoint). `report` writes benchmarks/results/language_model.{json,md} and
docs/language-model.md (`--quick`: language_model_quick.*, no docs page).
"""

import os

from .._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)
