"""pycuda GPUArrays, through page-locked host staging buffers laid out like each array.

pycuda copies two contiguous arrays as one flat block whatever their orders, so each staging
buffer takes its array's order (C or F): a Fortran-ordered GPUArray is not transposed.

A pycuda context is current on one thread only. The adapter keeps the context that was
current when the parameters were shared (`platoon.cuda.init_context()`, pycuda.autoinit or
the user's) and pushes it around its copies on any thread where it is not the current one
(`SyncHandle.wait()` from another thread, say), popping it afterwards.
"""

import pycuda.driver as cuda

from ..errors import PlatoonError
from . import StagedAdapter, staging_order


class PycudaAdapter(StagedAdapter):
    def __init__(self, params):
        self._context = cuda.Context.get_current()
        if self._context is None:
            raise PlatoonError("no pycuda context is current on this thread; call "
                               "platoon.cuda.init_context() (or import pycuda.autoinit) before "
                               "creating the GPUArrays and sharing them")
        orders = [staging_order(i, p, "a contiguous copy (gpuarray.to_gpu(p.get()))")
                  for i, p in enumerate(params)]
        staging = [cuda.pagelocked_empty(p.shape, p.dtype, order)
                   for p, order in zip(params, orders)]
        super().__init__(params, staging, download=_download, upload=_upload)

    def pull(self, params=None):
        with self._current():
            super().pull(params)

    def push(self):
        with self._current():
            super().push()

    def _current(self):
        return _Current(self._context)


class _Current:
    """Makes `context` current on this thread for a block, if it is not already."""

    def __init__(self, context):
        self._context = context
        self._pushed = False

    def __enter__(self):
        current = cuda.Context.get_current()
        if current is None or current != self._context:
            self._context.push()
            self._pushed = True

    def __exit__(self, *exc):
        if self._pushed:
            cuda.Context.pop()


def _download(p, host):
    p.get(ary=host)  # synchronous


def _upload(p, host):
    p.set(host)  # synchronous (async_=False)


def adapt(params):
    return PycudaAdapter(params)
