"""Users' type checkers see the public API: `py.typed` is installed, and mypy resolves every
name of `platoon.__all__` (imported under TYPE_CHECKING beside the lazy loading) to what it
is, not to `Any`."""

import os
import re
import subprocess
import sys

import pytest

import platoon

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_package_is_marked_typed_and_the_marker_installs():
    assert os.path.isfile(os.path.join(os.path.dirname(platoon.__file__), "py.typed"))
    with open(os.path.join(ROOT, "setup.py")) as f:
        assert '"py.typed"' in f.read()


def test_mypy_resolves_every_public_name(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    names = sorted(platoon.__all__)
    probe = tmp_path / "probe.py"
    probe.write_text("".join("from platoon import %s\nreveal_type(%s)\n" % (n, n) for n in names))
    # From the checkout (an editable install's import hook is not something mypy follows),
    # with the repository's settings (setup.cfg) and mypy's cache there.
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", str(probe)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    revealed = re.findall(r'probe\.py:(\d+): note: Revealed type is "(.*)"', done.stdout)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not errors, done.stdout + done.stderr
    assert len(revealed) == len(names), done.stdout + done.stderr
    for (line, kind), name in zip(revealed, names):
        assert int(line) == 2 * names.index(name) + 2
        assert kind != "Any", "mypy sees platoon.%s as Any" % name
        assert name in kind or kind.startswith("def "), (name, kind)
