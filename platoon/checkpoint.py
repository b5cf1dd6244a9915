"""Checkpoints of the centre: written atomically, read without unpickling anything."""

import json
import os

import numpy as np

from .errors import PlatoonError


def save(path, arrays, meta=None, states=None):
    """Write `arrays` (and JSON `meta`) to `path` atomically: a crash mid-write leaves the
    previous checkpoint intact. `states` ({name: [arrays]}, a Downpour optimizer's) is
    saved alongside and read back by `load_states`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    payload = {"param_%d" % i: a for i, a in enumerate(arrays)}
    for name, state in (states or {}).items():
        payload.update(("state_%d_%s" % (i, name), a) for i, a in enumerate(state))
    payload["meta"] = np.frombuffer(json.dumps(meta or {}).encode(), dtype=np.uint8)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path):
    """(arrays, meta) from a checkpoint; raises PlatoonError if it is missing or unreadable."""
    if os.path.isdir(path):
        path = os.path.join(path, "centre.npz")
    try:
        with np.load(path, allow_pickle=False) as data:
            count = sum(1 for name in data.files if name.startswith("param_"))
            arrays = [data["param_%d" % i] for i in range(count)]
            meta = json.loads(bytes(data["meta"]).decode()) if "meta" in data.files else {}
    except (OSError, ValueError, KeyError) as exc:
        raise PlatoonError("cannot read checkpoint %s (%s); pass the directory or .npz file "
                           "that a controller wrote with checkpoint_path" % (path, exc)) from None
    return arrays, meta


def load_states(path):
    """{name: [arrays]} of the shared states saved in a checkpoint ({} if none)."""
    if os.path.isdir(path):
        path = os.path.join(path, "centre.npz")
    states = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                if key.startswith("state_"):
                    _, index, name = key.split("_", 2)
                    states.setdefault(name, {})[int(index)] = data[key]
    except (OSError, ValueError, KeyError) as exc:
        raise PlatoonError("cannot read the shared states of checkpoint %s (%s)"
                           % (path, exc)) from None
    return {name: [found[i] for i in range(len(found))] for name, found in states.items()}
