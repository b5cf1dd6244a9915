"""CuPy arrays, through pinned host staging buffers laid out like each array (C or F order).

`ndarray.get(out=...)` blocks until its copy is done; `ndarray.set(...)` only queues its
copy on the stream (from pinned memory it really runs later), so `push` waits for that
stream before the staging buffers may be written again (the next sync) or freed.
"""

import cupy
import cupyx

from . import StagedAdapter, staging_order


class CupyAdapter(StagedAdapter):
    def __init__(self, params):
        orders = [staging_order(i, p, "cupy.ascontiguousarray(p)") for i, p in enumerate(params)]
        staging = [cupyx.empty_pinned(p.shape, p.dtype, order=order)
                   for p, order in zip(params, orders)]
        super().__init__(params, staging, download=_download, upload=None)

    def push(self):
        stream = cupy.cuda.get_current_stream()
        for host, p in zip(self.arrays, self._params):
            p.set(host, stream=stream)
        stream.synchronize()


def _download(p, host):
    p.get(out=host)  # blocking: returns once the copy is in `host`


def adapt(params):
    return CupyAdapter(params)
