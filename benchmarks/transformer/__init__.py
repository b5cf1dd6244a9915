"""Time to a target validation loss for a small GPT-style transformer trained by AdamW: platoon
against one process, DDP, torch's local SGD and torchft's DiLoCo, on real text.

usage: python -m benchmarks.transformer [--tune] [--methods a,b] [--reps N] [--cap-s S]

The language-model benchmark's text (the Python standard library's source, as bytes) and
harness (forked single-threaded processes, a barrier before the clock starts, evaluation
time excluded, methods alternating), with a byte-level transformer (`problem`) and every
method's optimizer AdamW (weight decay 0.01, gradients clipped at norm 1) under a
Trainer's schedule (5% linear warm-up, then linear decay to 0 at step 3,200 of each process).
torchft's DiLoCo runs where `torchft` is installed (`pip install torchft==0.2.0`; skipped,
and said, elsewhere): one replica group per process, its lighthouse started per run.
`--tune` runs every method's grid on seed 0 and records the point with the fewest steps to
the target in benchmarks/results/transformer_tuning.json; the measured run takes the recorded
points, runs every method on new seeds, then DDP and platoon with one process
slowed 2x, and writes benchmarks/results/transformer.{json,md}. The first record, at a
1,600-step horizon and a 2.6 bits-per-byte target, is transformer_horizon1600.*.
"""

import os

from .._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)
