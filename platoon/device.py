"""The worker's device: the launcher's name for it, and that device's name inside the process.

The launcher names devices as the machine does ("cuda3" is the machine's GPU 3)
and pins each worker to its GPU through ``CUDA_VISIBLE_DEVICES``, so inside the
worker that GPU is ``cuda:0``. `Device` is a ``str`` holding the launcher's name
(it prints, compares, hashes and serialises as before); `Device.local` is the
name PyTorch (and CuPy, JAX) use in this process, and `Device.torch` the
``torch.device``. PyTorch parses any ``str``, subclasses included, as a device
string and offers no hook for them, so ``torch.device(w.device)`` itself works
only for "cpu": write ``model.to(w.device.local)`` or ``w.device.torch``.
"""

import os
import re

_CUDA = re.compile(r"^cuda(\d+)$")


class Device(str):
    """A device name such as "cpu" or "cuda3" (the machine's GPU 3), and its name inside this
    process, `local` ("cpu" or "cuda:K": K is its position in ``CUDA_VISIBLE_DEVICES``, 0 under
    the launcher, which pins each worker to its GPU).

    `local` and `torch` raise ValueError for a name that is neither "cpu"
    nor "cudaN", and for a GPU that ``CUDA_VISIBLE_DEVICES`` hides from this process.
    """

    @property
    def local(self) -> str:
        """The device's name inside this process, in PyTorch's spelling ("cpu", "cuda:0")."""
        match = _CUDA.match(self)
        if self == "cpu":
            return "cpu"
        if match is None:
            raise ValueError("unknown device %r; use cpu, cuda0, cuda1, ..." % str(self))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return "cuda:%s" % match.group(1)
        shown = [d.strip() for d in visible.split(",")]
        if match.group(1) not in shown:
            raise ValueError("device %s is hidden from this process: CUDA_VISIBLE_DEVICES=%r "
                             "does not list GPU %s" % (self, visible, match.group(1)))
        return "cuda:%d" % shown.index(match.group(1))

    @property
    def is_cuda(self) -> bool:
        """True for a GPU ("cudaN")."""
        return self.startswith("cuda")

    @property
    def torch(self):
        """The ``torch.device`` of `local` (imports torch)."""
        import torch
        return torch.device(self.local)
