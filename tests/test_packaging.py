"""The distribution's name: "platoon" on the package index is an unrelated project."""

import importlib.metadata
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
