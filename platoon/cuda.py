"""pycuda context on the worker's pinned GPU.

The launcher pins each worker to one GPU through CUDA_VISIBLE_DEVICES, so the
process sees it as device 0.
"""

import atexit

from .errors import PlatoonError


def init_context(device_index=0):
    """Create and push a pycuda context on visible GPU `device_index`; returns it.

    The context is popped at exit. Raises PlatoonError when pycuda is missing
    or no GPU is visible.
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
    context = cuda.Device(device_index).make_context()
    atexit.register(context.pop)
    return context
