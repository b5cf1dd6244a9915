"""The distribution's name: "platoon" on the package index is an unrelated project."""

import importlib.metadata
import os
import re

from helpers import ROOT

DISTRIBUTION = "platoon-dp"


def test_the_package_installs_under_a_name_of_its_own():
    assert set(importlib.metadata.packages_distributions()["platoon"]) == {DISTRIBUTION}


def test_no_install_line_names_the_unrelated_platoon_distribution():
    bad = []
    for folder, _, files in os.walk(ROOT):
        if any(part.startswith(".") for part in folder[len(ROOT):].split(os.sep)):
            continue
        for name in files:
            if not name.endswith((".md", ".py", ".sh")):
                continue
            with open(os.path.join(folder, name), errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if re.search(r"pip install\b.*['\" ]platoon(\[|['\"]?(\s|$))", line):
                        bad.append("%s:%d: %s" % (name, number, line.strip()))
    assert not bad, bad


def test_every_extra_pins_torch_to_the_release_with_a_cpu_build():
    # An unpinned torch pulls a multi-GB CUDA build (docs/api.md#pytorch says how to install).
    import ast

    with open(os.path.join(ROOT, "setup.py")) as f:
        tree = ast.parse(f.read())
    extras = next(ast.literal_eval(k.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) for k in node.keywords
                  if k.arg == "extras_require")
    torch = {name: [r for r in reqs if re.match(r"torch\b", r)] for name, reqs in extras.items()}
    assert torch["torch"], "setup.py has no [torch] extra"
    assert all(r == "torch==2.13.0" for reqs in torch.values() for r in reqs), torch
