"""What every process of a job uses from the operating system: signals, pids, stopping
children, the ready pipe and the job's /dev/shm names (`process`), the ``PLATOON_*``
settings handed to children (`environment`), the status file the controller writes and the
launcher reads (`statusfile`), a multi-node job's node and tie settings, which cross mpiexec
as one argv (`nodesettings`), a setting's value checked (`checks`), argv handling shared by
the launcher and the MPI runner (`argv`) and a throttled log (`logthrottle`).

Standard library only: no zmq, no numpy (tests/test_imports.py), so the launcher, the MPI
runner, the reaper and every child can use it without paying for the rest of platoon.
"""
