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
from typing import List

_CUDA = re.compile(r"^cuda(\d+)$")
_ENTRY = re.compile(r"^(\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)$")


def visible_devices(listed: str) -> List[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value that CUDA uses: indices ("0") and
    GPU or MIG UUIDs ("GPU-8932f937-...", "MIG-..."), up to the first entry that names no
    device ("-1", "NoDevFiles", an empty one): CUDA ignores it and every entry after it."""
    entries = []
    for entry in listed.split(","):
        entry = entry.strip()
        if not _ENTRY.match(entry):
            break
        entries.append(entry)
    return entries


class Device(str):
    """A device name such as "cpu" or "cuda3" (the machine's GPU 3, nvidia-smi's index), and
    its name inside this process, `local` ("cpu" or "cuda:K": K is its position in
    ``CUDA_VISIBLE_DEVICES``, 0 under the launcher, which pins each worker to its GPU and sets
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers GPUs as nvidia-smi does).

    `local` and `torch` raise ValueError for a name that is neither "cpu"
    nor "cudaN", and for a GPU that ``CUDA_VISIBLE_DEVICES`` hides from this process or names
    by UUID (which cudaN cannot be matched to without asking the driver).
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
        shown = [str(int(d)) if d.isdigit() else d for d in visible_devices(visible)]
        if match.group(1) in shown:
            return "cuda:%d" % shown.index(match.group(1))
        named = [d for d in shown if not d.isdigit()]
        if named:
            raise ValueError(
                "device %s cannot be found in CUDA_VISIBLE_DEVICES=%r: it names GPUs by UUID "
                "(%s), and %s is the machine's GPU %s (nvidia-smi's index). List indices there "
                "instead (nvidia-smi -L shows both), or use the launcher, which sets it"
                % (self, visible, ", ".join(named), self, match.group(1)))
        raise ValueError("device %s is hidden from this process: CUDA_VISIBLE_DEVICES=%r "
                         "does not list GPU %s" % (self, visible, match.group(1)))

    @property
    def is_cuda(self) -> bool:
        """True for a GPU ("cudaN")."""
        return self.startswith("cuda")

    @property
    def torch(self):
        """The ``torch.device`` of `local` (imports torch)."""
        import torch
        return torch.device(self.local)
