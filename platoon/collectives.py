"""Collectives of a job's workers: `average_gradients`, synchronous data-parallel SGD, over
`Worker.all_reduce` (the ops it takes: `OPS`).

The machinery lives on each side of the process line: the worker's meeting in shared
memory in `platoon._worker.collectives`, the controller's buffers, reductions across
nodes and named shared states in `platoon._controller.collectives`, the buffers' layout
and reduction order in `platoon._centre.reduction`.
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np

from . import adapters
from ._centre.reduction import OPS, check_op
from ._deprecation import renamed_keywords

if TYPE_CHECKING:
    from .worker import Worker


@renamed_keywords(timeout="timeout_s")
def average_gradients(worker: "Worker", grads: Any, *,
                      timeout_s: Optional[float] = None) -> List[Any]:
    """Synchronous data-parallel SGD: replace each array in `grads` by its mean over all workers.

    `grads` are numpy arrays or torch tensors (CPU tensors are reduced in place
    through numpy views; CUDA tensors are copied to host and back), or a torch
    ``nn.Module``, whose parameters' ``.grad`` are averaged (every parameter
    that requires a gradient must have one: call ``backward()`` first). Arrays
    of one dtype travel together in one all_reduce. Call it every step on every
    worker, after the backward pass, before the optimizer step. Returns
    `grads` (the list of gradients for a module). `timeout_s` bounds each
    all_reduce (None: forever). Raises TypeError for other arrays, and as
    `Worker.all_reduce`.
    """
    grads = _gradients_of(grads)
    arrays, install = adapters.host_arrays(grads)
    by_dtype: Dict[np.dtype, List[np.ndarray]] = {}
    for g in arrays:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        flat = np.concatenate([g.reshape(-1) for g in group]) if len(group) > 1 \
            else np.ascontiguousarray(group[0]).reshape(-1).copy()
        worker.all_reduce(flat, "mean", timeout_s=timeout_s)
        pos = 0
        for g in group:
            g[...] = flat[pos:pos + g.size].reshape(g.shape)
            pos += g.size
    install()
    return grads


def _gradients_of(grads):
    """The list of arrays `grads`, or the gradients of a torch module's parameters."""
    if adapters.framework_of(grads) == "torch" and hasattr(grads, "parameters"):  # nn.Module
        found = []
        for name, p in grads.named_parameters():
            if p.requires_grad:
                if p.grad is None:
                    raise TypeError("parameter %s has no gradient; call backward() before "
                                    "average_gradients(), on every worker" % name)
                found.append(p.grad)
        return found
    return list(grads)


__all__ = ["OPS", "average_gradients", "check_op"]
