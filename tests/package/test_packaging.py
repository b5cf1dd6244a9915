"""The distribution: its name ("platoon" on the package index is an unrelated project), its
torch pin, its description."""

import ast
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


def setup_keywords():
    """The keywords of setup.py's setup() call, as syntax trees."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        tree = ast.parse(f.read())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "setup")
    return {k.arg: k.value for k in call.keywords}


def test_every_extra_pins_torch_to_the_release_with_a_cpu_build():
    # An unpinned torch pulls a multi-GB CUDA build (docs/api.md#pytorch says how to install).
    extras = ast.literal_eval(setup_keywords()["extras_require"])
    torch = {name: [r for r in reqs if re.match(r"torch\b", r)] for name, reqs in extras.items()}
    assert torch["torch"], "setup.py has no [torch] extra"
    assert all(r == "torch==2.13.0" for reqs in torch.values() for r in reqs), torch


def test_the_description_names_every_sync_rule_the_package_exports():
    import platoon

    description = ast.literal_eval(setup_keywords()["description"])
    rules = [n for n in platoon.__all__ if isinstance(getattr(platoon, n), type)
             and issubclass(getattr(platoon, n), platoon.ParamSyncRule)
             and getattr(platoon, n) is not platoon.ParamSyncRule]
    assert rules and all(re.search(r"\b%s\b" % rule, description) for rule in rules), \
        "setup.py's description %r does not name every rule in %s" % (description, rules)
