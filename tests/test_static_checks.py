"""The package's own checks, configured in the repository: ruff (lint, import order, no module
reaching another's private names; ruff.toml) and mypy (types; setup.cfg)."""

import subprocess
import sys

import pytest

from helpers import ROOT


def run_tool(*args):
    return subprocess.run([sys.executable, "-m"] + list(args), cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def test_ruff_finds_nothing_in_the_package():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    done = run_tool("ruff", "check", "platoon")
    assert done.returncode == 0, done.stdout + done.stderr



@pytest.mark.slow  # about 5-10 s without mypy's cache (torch is not followed: setup.cfg)
def test_mypy_finds_nothing_in_the_package():
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    done = run_tool("mypy", "platoon")
    assert done.returncode == 0, done.stdout + done.stderr
