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
from typing import Dict, List, Optional, Tuple

from ._os.environment import JobEnvironment

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


class VisibleDevicesError(ValueError):
    """A ``CUDA_VISIBLE_DEVICES`` (or PLATOON_ASSUME_GPUS) that names GPUs the launcher cannot
    place workers on (a MIG instance, an unknown UUID); the message says what to list."""


def _indices(listed: str, name: str, uuids: Optional[Dict[str, str]] = None) -> List[str]:
    """The GPU indices a CUDA_VISIBLE_DEVICES-style list (variable `name`) names, as CUDA reads
    it: up to the first entry that names no GPU ("-1" names none); GPU UUIDs become their index
    through `uuids` (UUID -> index, from nvidia-smi; CUDA takes a unique prefix). Raises
    VisibleDevicesError for a MIG instance (cudaN names a whole GPU) and for a UUID nvidia-smi
    does not list."""
    indices = []
    for entry in visible_devices(listed):
        if entry.startswith("MIG-"):
            raise VisibleDevicesError(
                "%s=%r names a MIG instance (%s); the launcher places workers on whole GPUs "
                "(cudaN), which cannot name one. List whole GPUs there (indices or GPU-... "
                "UUIDs, see nvidia-smi -L), or use -D cpu, or run the worker script on the "
                "instance yourself" % (name, listed, entry))
        if entry.isdigit():
            indices.append(str(int(entry)))
            continue
        matches = sorted({index for uuid, index in (uuids or {}).items()
                          if uuid.startswith(entry)})
        if len(matches) != 1:
            raise VisibleDevicesError(
                "%s=%r names GPU %s, which %s; nvidia-smi -L lists the GPUs with their UUIDs "
                "(or list indices: 0,1)" % (
                    name, listed, entry, "several GPUs' UUIDs start with" if matches else
                    "is not among the GPUs nvidia-smi lists here" if uuids else
                    "cannot be matched to an index without nvidia-smi"))
        indices.append(matches[0])
    return indices


def _machine_gpus() -> Tuple[List[str], List[str], Dict[str, str]]:
    """(indices of the machine's NVIDIA GPUs, what was looked at, their UUIDs -> indices):
    nvidia-smi's list, else the /dev/nvidiaN device files (no UUIDs then)."""
    seen = []
    import shutil  # (here: a worker imports this module, and needs neither)
    import subprocess
    smi = shutil.which("nvidia-smi")
    if smi is None:
        seen.append("nvidia-smi (not on PATH)")
    else:
        try:
            out = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            seen.append("nvidia-smi (failed: %s)" % exc)
        else:
            rows = [[word.strip() for word in line.split(",")]
                    for line in out.stdout.splitlines()]
            uuids = {row[1]: row[0] for row in rows if len(row) == 2 and row[0].isdigit()}
            found = [row[0] for row in rows if row and row[0].isdigit()]
            if found:
                return found, ["nvidia-smi (GPUs %s)" % ", ".join(found)], uuids
            seen.append("nvidia-smi (no GPU listed, exit code %d)" % out.returncode)
    found = sorted((name[len("nvidia"):] for name in os.listdir("/dev")
                    if re.fullmatch(r"nvidia\d+", name)), key=int) if os.path.isdir("/dev") else []
    seen.append("/dev/nvidiaN (%s)" % (", ".join("nvidia" + i for i in found) or "none"))
    return found, seen, {}


def find_gpus() -> Tuple[List[str], List[str]]:
    """(indices of the CUDA GPUs this process may use, what was looked at to find them).

    The machine's GPUs (nvidia-smi, else /dev/nvidiaN), narrowed to those CUDA_VISIBLE_DEVICES
    lists if it is set (indices or GPU UUIDs, read as CUDA reads them); PLATOON_ASSUME_GPUS
    (indices, "0,3"; "-1" for none) replaces the search (tests, or GPUs the launcher cannot
    see). Raises VisibleDevicesError for a CUDA_VISIBLE_DEVICES naming MIG instances or
    unknown UUIDs.
    """
    assumed = JobEnvironment.read("assume_gpus").assume_gpus
    if assumed is not None:
        return (_indices(assumed, "PLATOON_ASSUME_GPUS"),
                ["PLATOON_ASSUME_GPUS=%r" % assumed])
    found, seen, uuids = _machine_gpus()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return found, seen + ["CUDA_VISIBLE_DEVICES (unset)"]
    seen = seen + ["CUDA_VISIBLE_DEVICES=%r" % listed]
    if not found:
        return [], seen
    shown = []
    for index in _indices(listed, "CUDA_VISIBLE_DEVICES", uuids):
        if index not in found:  # CUDA ignores this entry and those after it
            break
        if index not in shown:
            shown.append(index)
    return shown, seen


def in_turn(count: int, gpus: List[str]) -> List[str]:
    """The devices of `count` workers placed in turn on `gpus` (indices; several workers may
    share one): "cudaK" each, or "cpu" for all when there is no GPU."""
    if not gpus:
        return ["cpu"] * count
    return ["cuda%s" % gpus[i % len(gpus)] for i in range(count)]


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
