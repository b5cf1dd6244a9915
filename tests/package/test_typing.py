"""Users' type checkers see the public API: `py.typed` is installed, and mypy resolves every
name of `platoon.__all__` (imported under TYPE_CHECKING beside the lazy loading) to what it
is, not to `Any`."""

import inspect
import os
import re
import subprocess
import sys

import pytest

import platoon

from helpers import ROOT


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


def unannotated(function):
    """The parameters (and "return") of `function` that have no annotation; self and cls
    need none."""
    signature = inspect.signature(function)
    missing = [name for name, p in signature.parameters.items()
               if p.annotation is inspect.Parameter.empty and name not in ("self", "cls")]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def exported_functions():
    """{name: function} of each function in `platoon.__all__` and each public method (with
    `__init__`, properties' getters and setters) of an exported class and of its bases in
    platoon, as users' type checkers see them."""
    found = {}
    for name in sorted(platoon.__all__):
        try:
            obj = getattr(platoon, name)
        except ImportError:  # PeriodicSync without torch
            continue
        if inspect.isfunction(obj):
            found[name] = obj
            continue
        if not inspect.isclass(obj):
            continue
        for base in reversed(obj.__mro__):
            if not base.__module__.startswith("platoon"):
                continue
            for attr, value in vars(base).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                parts = ([value.fget, value.fset] if isinstance(value, property) else [value])
                for i, part in enumerate(p for p in parts if inspect.isfunction(p)):
                    found["%s.%s%s" % (name, attr, " (setter)" if i else "")] = part
    return found


def test_the_completeness_check_sees_what_is_missing():
    def half(a: int, b, *args, c=1, **kwargs) -> None:
        pass

    assert unannotated(half) == ["b", "args", "c", "kwargs"]
    assert unannotated(lambda self, x: x) == ["x", "return"]
    assert unannotated(platoon.shard) == []
    functions = exported_functions()
    assert {"Controller.__init__", "Worker.sync_params", "EASGD.update", "shard",
            "Controller.max_shared_bytes (setter)"} <= set(functions)
    assert len(functions) > 150


def test_every_exported_name_is_fully_annotated():
    """The type completeness of the public API (as trio checks its exports'): each function
    behind `platoon.__all__` annotates every parameter and its return, so users' type
    checkers see no implicit Any at platoon's surface."""
    missing = {name: unannotated(f) for name, f in exported_functions().items()}
    missing = {name: params for name, params in missing.items() if params}
    assert not missing, "annotate these (parameters, return): %s" % missing


def mypy_settings():
    import configparser

    settings = configparser.ConfigParser()
    settings.read(os.path.join(ROOT, "setup.cfg"))
    return settings


def test_the_type_ratchet_only_tightens():
    """mypy checks every body (check_untyped_defs), and the strict modules stay strict: a
    module joins the list once it passes (setup.cfg); none leaves it."""
    settings = mypy_settings()
    assert settings.getboolean("mypy", "check_untyped_defs")
    strict = {}
    for section in settings.sections():
        if section.startswith("mypy-") and settings.getboolean(
                section, "disallow_untyped_defs", fallback=False):
            for module in section[len("mypy-"):].split(","):
                strict[module.strip()] = settings[section]
    assert {"platoon.protocol", "platoon.rules.downpour", "platoon.node.*",
            "platoon.elastic.*", "platoon.mpi.tie"} <= set(strict), sorted(strict)
    for module, options in strict.items():
        for flag in ("disallow_untyped_defs", "disallow_incomplete_defs",
                     "disallow_untyped_calls", "disallow_any_generics", "warn_return_any"):
            assert options.getboolean(flag, fallback=False), (module, flag)
    lifted = [s for s in settings.sections() if s.startswith("mypy-platoon")
              and not settings.getboolean(s, "check_untyped_defs", fallback=True)]
    assert lifted == [], lifted  # (platoon.mpi's exception ended with the node layer)
