"""pycuda context on the worker's pinned GPU.

The launcher pins each worker to one GPU through CUDA_VISIBLE_DEVICES, so the
process sees it as device 0.
"""

import atexit
import logging

from .errors import PlatoonError

log = logging.getLogger(__name__)


def init_context(device_index=0):
    """Make the primary context of visible GPU `device_index` current on this thread for
    pycuda; returns it (a ``pycuda.driver.Context``).

    The primary context is the one the CUDA runtime, and so PyTorch, CuPy and JAX, use: device
    pointers pass freely between pycuda and them, and their calls on this thread still run in
    their own context. The context is popped at exit. pycuda keeps a current context per
    thread: GPUArrays shared with `Worker.init_shared_params` may be synced from any thread
    (the adapter pushes this context where needed); other pycuda calls on another thread need
    ``context.push()`` / ``pycuda.driver.Context.pop()`` around them. Calling it again on the
    same thread returns the current context. Raises PlatoonError when pycuda is missing or no
    such GPU is visible.
    """
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise PlatoonError("pycuda is not installed (%s); install it with "
                           "pip install pycuda on a machine with CUDA, or keep this "
                           "worker's parameters in numpy or torch" % exc) from None
    try:
        cuda.init()
        count = cuda.Device.count()
    except cuda.Error as exc:
        raise PlatoonError("CUDA is not usable here (%s): no GPU or no driver" % exc) from None
    if device_index >= count:
        raise PlatoonError("no GPU %d: this process sees %d GPU(s) (CUDA_VISIBLE_DEVICES pins "
                           "launched workers to one, as device 0)" % (device_index, count))
    context = cuda.Device(device_index).retain_primary_context()
    current = cuda.Context.get_current()
    if current is not None and current == context:
        return current
    context.push()
    atexit.register(_pop_at_exit, cuda, context)
    return context


def _pop_at_exit(cuda, context):
    """Pop `context` if it is still current on the exiting thread (a context pushed on
    another thread ends with that thread), and drop pycuda's per-context caches."""
    try:
        current = cuda.Context.get_current()
        if current is not None and current == context:
            cuda.Context.pop()
        from pycuda.tools import clear_context_caches
        clear_context_caches()
    except cuda.Error as exc:  # at exit: say so, nothing left to do about it
        log.warning("could not pop the pycuda context at exit: %s", exc)
