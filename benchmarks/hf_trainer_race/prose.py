"""A second workload for the Trainer race (issue 47): English prose instead of code, and a
wider, shallower GPT-2 with a shorter context, so that advice tuned on the race's workload is
checked on one its tuning never saw.

The corpus is the docstrings of Python's standard library (modules, classes, functions;
`ast.get_docstring`, so indentation is cleaned), every machine's offline, from the modules
outside test/, idlelib, lib2to3, turtledemo and site-packages, less the race's own files (their
code, docstrings included, is the race's corpus). The modules are sorted by path; every 20th
one's docstrings are held out for evaluation. About 1.6 MB in all on Python 3.11.
"""

import ast
import os
import sysconfig

import torch

SKIPPED_DIRS = ("test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo",
                "__pycache__")
HELD_OUT_EVERY = 20
# GPT2Config fields (n_embd, n_layer, n_head, n_positions) of each model: the race's, and a
# wider, shallower one with half the context.
MODELS = {"race": (64, 2, 4, 128), "wide": (128, 1, 4, 64)}
EVAL_BYTES = 32768  # the race's: 256 windows of 128 bytes


def modules(skip=()):
    """The standard library's module paths (relative, sorted) that the corpus reads."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("config-"))
        found += [os.path.normpath(os.path.join(rel, n)) for n in names
                  if n.endswith(".py") and n not in skip]
    return sorted(found)


def docstrings(paths):
    """The docstrings of the modules at `paths` (relative to the standard library), one text,
    each docstring followed by a blank line."""
    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for path in paths:
        with open(os.path.join(root, path), "rb") as f:
            try:
                tree = ast.parse(f.read())
            except (SyntaxError, ValueError):  # a file for another Python version
                continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append(doc + "\n\n")
    return "".join(texts).encode("utf-8")


def split(skip=()):
    """(training bytes, held-out bytes): every HELD_OUT_EVERY-th module is held out."""
    paths = modules(skip)
    held = set(paths[::HELD_OUT_EVERY])
    return (docstrings([p for p in paths if p not in held]),
            docstrings([p for p in paths if p in held]))


class ByteWindows(torch.utils.data.Dataset):
    """`data` cut into `context`-byte examples (at most `limit`), as the race's Chunks."""

    def __init__(self, data, context, limit=None):
        self.data = torch.tensor(list(data), dtype=torch.long)
        self.context = context
        whole = len(self.data) // context
        self.count = whole if limit is None else min(limit, whole)

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        ids = self.data[i * self.context:(i + 1) * self.context]
        return {"input_ids": ids, "labels": ids}
