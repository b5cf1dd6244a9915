"""The fault race (issue 33's measure): three "hosts" (network namespaces on a switch, each
host's link shaped by `tc` tbf, 100 Mbit/s by default, one worker each) race to the slow-link
language model's target while a node is killed -9 about every 60 s and started again 10 s
later, for the whole run; the same fault schedule (from a fixed seed) for every member.

usage: python -m benchmarks.elastic_faults [--quick] [--members a,b] [--reps N]
                                           [--cap-s S] [--link 100mbit] [--schedule]
       python -m benchmarks.elastic_faults --script [--quick] [--reps N] [--kill-at-s 40]

`--script`: the joiner's chain on an ordinary script instead (examples/lm/train.py under
python -m platoon.elastic.node, node c killed -9 and started again: `script`).

Members (`race.MEMBERS`): platoon elastic without and with faults (python -m
platoon.elastic.node per host, its lighthouse on the switch); the fixed-world MPI job (python
-m platoon.mpi, one rank per host) with the same faults, restarted whole after each from its
nodes' last checkpoints, restart time included; torchft's DiLoCo (one replica group per host,
its lighthouse, gloo) with the same faults (skipped, and said so, where torchft is not
installed). Unequal nodes, without faults: `elastic_slow` and `mpi_slow` throttle node c's
worker 2x (it sleeps after each step as long as the step took), against the all-equal
`elastic` and `mpi` (`--members elastic,elastic_slow,mpi,mpi_slow`); the report gives each
node's steps a second (its steps by the target over the seconds its worker trained) and the
others' steps a second and time to target against the all-equal member. Reported per run
(`report`: benchmarks/results/elastic_faults.{json,md}; `--quick`: elastic_faults_quick.*):
time to target, steps made / useful / possible, goodput, bytes across the links, each
restarted node's time from its start command to its first contributing round, and the load
average as it started. `--schedule` prints the fault schedule and exits.

Needs root, `ip`, `tc` and `unshare` (skipped with the reason otherwise: exit 0); every
namespace, process and /dev/shm entry it makes is removed at the end, also on failure.
"""

import os

from .._util import SINGLE_THREAD_ENV

for _name, _value in SINGLE_THREAD_ENV.items():  # before numpy and torch load their BLAS
    os.environ.setdefault(_name, _value)
