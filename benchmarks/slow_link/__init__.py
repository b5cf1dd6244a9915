"""Time to the language model's target across a slow link: two "hosts" (network namespaces
joined by a veth pair, shaped with `tc` tbf), one worker on each.

usage: python -m benchmarks.slow_link [--quick] [--links 10mbit,100mbit] [--methods a,b]
                                      [--cap-s S] [--reps N] [--estimate]

The problem is benchmarks/language_model's (its FULL problem; `--quick`: its QUICK one),
with the lrs recorded in benchmarks/results/language_model_tuning.json. Each (method, link)
pair runs in fresh processes (`jobs`): one process; DDP and torch's local SGD (gloo) with one
process in each namespace; platoon as `mpiexec ... python -m platoon.mpi --workers 1` with one
rank in each namespace and MPICH forced onto TCP over the veth; and the platoon jobs again on
one host (`none`: two ranks, MPI through shared memory). Reported per run: time to target
(wall time from a barrier after start-up, evaluation excluded), steps per worker, the bytes
the two veth ends sent (their `tx_bytes`), the share of the wall time the workers computed,
and the ratios to DDP on the same link and to the same platoon job on one host
(`report`: benchmarks/results/slow_link.{json,md}; `--quick`: slow_link_quick.*).

The default plan (`methods.DEFAULT_PAIRS`, one repetition) takes about 25 minutes on the
2-core machine, idle; `--estimate` prints the plan and its estimated duration without running
it. A platoon method is its list of `python -m platoon.mpi` options (`methods.METHODS`; add
one with `--define NAME=OPTIONS`); a method whose options this checkout lacks is skipped and
said so. A run whose traffic did not cross the veth (each end's counter below what the tie,
or gloo, must have sent) fails loudly, and the command exits 1.

Needs root, `ip`, `tc` and `unshare` (skipped with the reason otherwise: exit 0); every
namespace, process and /dev/shm entry it makes is removed at the end, also on failure.
"""

import os

from .._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)
