"""The distribution: its name ("platoon" on the package index is an unrelated project), its
torch pin, its description."""

import ast
import importlib.metadata
import os
import re

from helpers import ROOT

DISTRIBUTION = "platoon-dp"


def test_the_package_installs_under_a_name_of_its_own():
    if hasattr(importlib.metadata, "packages_distributions"):
        assert set(importlib.metadata.packages_distributions()["platoon"]) == {DISTRIBUTION}
    else:  # Python 3.9
        top = importlib.metadata.distribution(DISTRIBUTION).read_text("top_level.txt")
        assert "platoon" in (top or "").split(), top


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
    from platoon import rules as home

    description = ast.literal_eval(setup_keywords()["description"])
    rules = [n for n in platoon.__all__ if isinstance(getattr(home, n, None), type)
             and issubclass(getattr(home, n), home.ParamSyncRule) and n != "ParamSyncRule"]
    assert rules and all(re.search(r"\b%s\b" % rule, description) for rule in rules), \
        "setup.py's description %r does not name every rule in %s" % (description, rules)


# The test command: README.md's, run exactly by .ci/run, with the versions in constraints.txt.

def readme_test_command():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    block = re.search(r"\*\*Run the tests:\*\*\s*```bash\n(.*?)\n```", readme, re.S)
    assert block, "README.md has no **Run the tests:** bash block"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readmes_test_command_with_the_constraints():
    command = readme_test_command()
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line.strip() for line in f]
    assert command in ci, ".ci/run does not run README.md's test command %r" % command
    assert re.search(r"pip install .*-c constraints\.txt ", command), command


def constraints():
    """{canonical name: version} of constraints.txt's pins."""
    from packaging.utils import canonicalize_name

    pins = {}
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version, "constraints.txt: %r is not NAME==VERSION" % line
                pins[canonicalize_name(name)] = version
    return pins


def test_the_constraints_pin_every_package_the_test_command_names_within_setup_py():
    """A framework the tests lean on (the Lightning strategy reads Lightning's private
    attributes) changes only when constraints.txt does."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extras = re.search(r"-e '\.\[([\w,]+)\]'", readme_test_command()).group(1).split(",")
    keywords = setup_keywords()
    wanted = ast.literal_eval(keywords["install_requires"]) + [
        r for extra in extras for r in ast.literal_eval(keywords["extras_require"])[extra]]
    pins, wrong = constraints(), []
    for text in wanted:
        requirement = Requirement(text)
        version = pins.get(canonicalize_name(requirement.name))
        if version is None or version not in requirement.specifier:
            wrong.append("%s: pinned %s" % (text, version))
    assert not wrong, "constraints.txt must pin every requirement of the test command within " \
        "setup.py's range: %s" % wrong


def test_ruff_checks_the_syntax_against_the_oldest_python_setup_py_declares():
    oldest = re.fullmatch(r">=(\d+)\.(\d+)", ast.literal_eval(
        setup_keywords()["python_requires"])).groups()
    with open(os.path.join(ROOT, "ruff.toml")) as f:
        assert 'target-version = "py%s%s"' % oldest in f.read()
