"""Settings the launcher hands to the processes it starts, read in one place.

The launcher sets ``PLATOON_*`` environment variables; `Controller()` and
`Worker()` called without ports use them, so one script runs both under the
launcher and by hand with explicit arguments.
"""

import dataclasses
import os
import typing
from dataclasses import dataclass
from typing import Optional


def _number(name, kind=int):
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError("environment variable %s=%r is not %s" % (
            name, text, "an integer" if kind is int else "a number")) from None


@dataclass(frozen=True)
class JobEnvironment:
    """What the launcher told this process. Fields are None when not launched."""

    control_port: Optional[int] = None
    data_port: Optional[int] = None
    job_id: Optional[str] = None
    num_workers: Optional[int] = None
    device: Optional[str] = None
    worker_index: Optional[int] = None
    status_file: Optional[str] = None
    ready_fd: Optional[int] = None
    restarts: Optional[int] = None
    checkpoint_path: Optional[str] = None
    log_dir_fd: Optional[int] = None  # the log directory, opened by the launcher: the
    # controller writes status_file and checkpoint_path (both in it) relative to it
    checkpoint_every_s: Optional[float] = None
    resume_from: Optional[str] = None
    keys_file: Optional[str] = None
    launcher_pid: Optional[int] = None  # child processes exit if it is gone
    log_level: Optional[str] = None
    host: Optional[str] = None  # the interface a node's controller binds (platoon.mpi)
    # 1: this controller is a node runner's (python -m platoon.mpi's rank, an elastic node's):
    # it takes the node link the runner offers
    mpi_node: Optional[int] = None
    mpi_timeout_s: Optional[float] = None  # a node this late to a collective hangs
    assume_gpus: Optional[str] = None  # the launcher takes these GPUs ("0,3") as present
    elastic_secret_file: Optional[str] = None  # platoon.elastic: the job's secret
    elastic_node: Optional[str] = None  # platoon.elastic: the node's name (its data slot)
    # a node runner's worker, started before its controller serves: the controller's ports
    # come on this pipe (`platoon._worker.ports.await_ports`)
    ports_fd: Optional[int] = None
    # 0: an elastic node starts its workers as new processes, not forked once it imported
    # torch (`platoon.node.prefork`)
    prefork: Optional[int] = None

    @classmethod
    def read(cls, *names: str) -> "JobEnvironment":
        """The settings in this process's environment (only those `names`, if given: the
        others are then None and their variables are not checked)."""
        values: typing.Dict[str, typing.Any] = {}
        for field in dataclasses.fields(cls):
            if names and field.name not in names:
                continue
            kind = typing.get_args(field.type)[0]  # Optional[kind]
            name = _variable(field.name)
            values[field.name] = (os.environ.get(name) or None) if kind is str \
                else _number(name, kind)
        return cls(**values)

    def to_env(self) -> typing.Dict[str, str]:
        """The environment variables that carry these settings (None fields left out)."""
        return {_variable(field.name): str(getattr(self, field.name))
                for field in dataclasses.fields(self) if getattr(self, field.name) is not None}


def without_job_variables(env: typing.Mapping[str, str], *names: str) -> typing.Dict[str, str]:
    """A copy of the environment mapping `env` without the variables of settings `names`
    (every ``PLATOON_*`` variable if none are given)."""
    if names:
        drop = {_variable(name) for name in names}
        return {k: v for k, v in env.items() if k not in drop}
    return {k: v for k, v in env.items() if not k.startswith("PLATOON_")}


# What MPI launchers (MPICH/Hydra, Open MPI, MVAPICH, Intel MPI, PMIx) and torchrun give a
# process: seen by a worker, a framework (Hugging Face's Trainer, Accelerate, Lightning) takes
# the worker for a rank of its own DDP job and starts torch.distributed ("environment variable
# MASTER_ADDR expected"). platoon's workers are no such ranks: the variables stay with the
# processes MPI started (platoon.mpi's node runners), not with the workers they start.
DISTRIBUTED_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPI_LOCAL", "MPICH_",
                        "I_MPI_", "TORCHELASTIC_")
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")


def without_distributed_variables(env):
    """A copy of the environment mapping `env` without the variables by which MPI and torchrun
    make a process a rank of a distributed job (`DISTRIBUTED_PREFIXES`,
    `DISTRIBUTED_VARIABLES`): a worker's environment, so that no framework in it starts its own
    DDP across platoon's workers."""
    return {k: v for k, v in env.items()
            if not k.startswith(DISTRIBUTED_PREFIXES) and k not in DISTRIBUTED_VARIABLES}


def worker_environment(environ: typing.Mapping[str, str], drop: typing.Sequence[str] = (),
                       extra: Optional[typing.Mapping[str, str]] = None
                       ) -> typing.Dict[str, str]:
    """The environment of the workers a runner starts (the launcher's, ``python -m
    platoon.mpi``'s, an elastic node's): `environ` plus `extra`, without MPI's and torchrun's
    rank variables (`without_distributed_variables`: a worker is no rank, even where its
    runner is one) and without the runner's own settings `drop` (JobEnvironment field names,
    such as "ready_fd")."""
    env = dict(without_distributed_variables(environ), **(extra or {}))
    return without_job_variables(env, *drop) if drop else env


def _variable(field_name):
    """The environment variable of a setting: PLATOON_ and its name in capitals."""
    return "PLATOON_" + field_name.upper()


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# What JAX preallocates on a GPU when nothing says otherwise (XLA's default), and the variables
# with which a user decides it: the launcher leaves the decision to them when one is set.
XLA_MEMORY_FRACTION = 0.75
XLA_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                        "XLA_PYTHON_CLIENT_ALLOCATOR")


def device_variables(device: str, devices: typing.Sequence[str], cpus: int,
                     environ: typing.Mapping[str, str], *,
                     host_workers: Optional[int] = None) -> typing.Dict[str, str]:
    """The environment variables of a worker on `device` (one of the job's `devices`: "cpu" or
    "cudaK") on a machine with `cpus` cores, `environ` being the environment the worker
    inherits, `host_workers` the workers of every job's node on this machine (default:
    ``len(devices)``; several nodes of a multi-node job may share a machine).

    - ``CUDA_VISIBLE_DEVICES``: its GPU only ("" for a CPU worker), and
      ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that K is the index nvidia-smi shows (CUDA
      otherwise numbers the fastest GPU first);
    - BLAS/OpenMP threads: the cores split evenly among all the machine's workers (GPU
      workers too: their data work runs on the CPU, and k workers x all cores oversubscribe
      it), unless `environ` sets one of `THREAD_VARIABLES`: then the user has decided, and
      none is set (the worker inherits theirs);
    - ``XLA_PYTHON_CLIENT_MEM_FRACTION``: when k workers share a GPU, 0.75/k each (JAX
      preallocates 0.75 of the GPU in every process, and the second would fail), unless the
      launcher's environment sets one of `XLA_MEMORY_VARIABLES`.
    """
    sharing_cores = len(devices) if host_workers is None else host_workers
    threads = str(max(1, cpus // max(sharing_cores, 1)))
    env: typing.Dict[str, str] = {}
    if not any(environ.get(var) for var in THREAD_VARIABLES):
        env.update((var, threads) for var in THREAD_VARIABLES)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        return env
    env["CUDA_VISIBLE_DEVICES"] = device[len("cuda"):]
    sharing = devices.count(device)
    if sharing > 1 and not any(var in environ for var in XLA_MEMORY_VARIABLES):
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "%.3g" % (XLA_MEMORY_FRACTION / sharing)
    return env
