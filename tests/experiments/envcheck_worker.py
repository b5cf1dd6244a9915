"""Prints what the launcher told this worker, shares a parameter, reports, and exits."""

import os

import numpy as np

from platoon import EASGD, Worker

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # the launcher's caps

# How MPI and torchrun make a process a rank of a distributed job: no worker may see them
DISTRIBUTED = ("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPI_LOCAL", "RANK", "WORLD_SIZE",
               "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

with Worker() as w:
    print("DISTRIBUTED " + (" ".join(sorted(k for k in os.environ if k.startswith(DISTRIBUTED)))
                            or "none"))
    print("THREADS " + " ".join("%s=%s" % (var, os.environ.get(var)) for var in THREAD_VARIABLES))
    print("DEVICE %s CUDA_VISIBLE_DEVICES=%r OMP_NUM_THREADS=%s CUDA_DEVICE_ORDER=%s "
          "XLA_PYTHON_CLIENT_MEM_FRACTION=%s"
          % (w.device, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("OMP_NUM_THREADS"),
             os.environ.get("CUDA_DEVICE_ORDER"),
             os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")))
    w.init_shared_params([np.zeros(10)], EASGD(0.5))
    w.sync_params()
    w.report(minibatches=5, loss=0.5)
    w.barrier()
