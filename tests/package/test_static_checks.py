"""The package's own checks, configured in the repository: ruff (lint, import order, no module
reaching another's private names; ruff.toml) over the package, its tests, benchmarks and
examples, and mypy (types; setup.cfg) over the package."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT


def run_tool(*args):
    return subprocess.run([sys.executable, "-m"] + list(args), cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


# Everything ruff.toml configures: the package, and the tests, benchmarks and examples beside
# it (examples are what users copy: ruff.toml keeps them to public names).
LINTED = ["platoon", "tests", "benchmarks", "examples"]


def test_ruff_finds_nothing_in_the_package_its_tests_benchmarks_and_examples():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    done = run_tool("ruff", "check", *LINTED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_toml_names_what_the_suite_lints():
    with open(os.path.join(ROOT, "ruff.toml")) as f:
        first = f.readline()
    assert first.startswith("# ruff check %s " % " ".join(LINTED)), first


@pytest.mark.slow  # about 5-10 s without mypy's cache (torch and transformers' models are
# not followed: setup.cfg)
def test_mypy_finds_nothing_in_the_package():
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    done = run_tool("mypy", "platoon")
    assert done.returncode == 0, done.stdout + done.stderr
