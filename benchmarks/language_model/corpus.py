"""The text: the Python standard library's own source, which every machine has offline.

A fixed rule picks the files (every `.py` under `sysconfig`'s stdlib, sorted, outside tests,
site-packages and a few non-library folders); every tenth file goes to validation, the rest to
training. Bytes, so the vocabulary is 256. `describe()` records what was read (the Python
version, file counts, sizes and a digest of the list), since another Python's stdlib is
another corpus.
"""

import hashlib
import os
import sys
import sysconfig

import numpy as np

SKIP_DIRS = {"test", "tests", "site-packages", "idlelib", "__pycache__", "lib2to3",
             "turtledemo", "ensurepip"}
VALID_EVERY = 10  # every tenth file (in sorted order) is validation text


def files(root=None):
    """The corpus's files, in a fixed (sorted) order."""
    root = root or sysconfig.get_paths()["stdlib"]
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        out += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    if not out:
        raise FileNotFoundError("no .py files under %s: the language-model benchmark reads the "
                                "Python standard library's source" % root)
    return out


def load(train_bytes, valid_bytes, root=None):
    """(train, valid) as uint8 numpy arrays of at most the given sizes, and their record."""
    paths = files(root)
    train, valid = bytearray(), bytearray()
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            text = f.read()
        (valid if i % VALID_EVERY == VALID_EVERY - 1 else train).extend(text)
    digest = hashlib.sha256("\n".join(os.path.relpath(p, os.path.dirname(paths[0]))
                                      for p in paths).encode()).hexdigest()[:16]
    record = {"python": sys.version.split()[0], "files": len(paths),
              "corpus_bytes": len(train) + len(valid), "train_bytes": min(train_bytes, len(train)),
              "valid_bytes": min(valid_bytes, len(valid)), "file_list_sha256": digest}
    return (np.frombuffer(bytes(train[:train_bytes]), dtype=np.uint8).copy(),
            np.frombuffer(bytes(valid[:valid_bytes]), dtype=np.uint8).copy(), record)
