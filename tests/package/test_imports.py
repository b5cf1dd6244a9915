"""The public API imports on demand: supervising processes load neither zmq nor numpy; the
original Platoon's module paths still import; the package's imports make no circle, each home
keeps to its side of the process line, and docs/architecture.md's import table says what the
code imports."""

import functools
import importlib
import subprocess
import sys

import pytest

import platoon
from platoon._moved import MOVED

from helpers import loaded_after


@pytest.mark.parametrize("module", ["platoon", "platoon.launch", "platoon._os.process",
                                    "platoon.launch.child", "platoon.launch.cli",
                                    "platoon.launch.supervision", "platoon.node.reaper",
                                    "platoon.launch.elastic", "platoon._os.nodesettings",
                                    "platoon._os.jobsecret", "platoon._os.elasticsettings",
                                    "platoon._os.environment", "platoon._os.statusfile",
                                    "platoon._os.argv", "platoon._os.logthrottle"])
def test_supervising_modules_load_neither_zmq_nor_numpy(module):
    loaded = loaded_after("import " + module)
    heavy = {m for m in loaded if m.split(".")[0] in ("zmq", "numpy", "mpi4py", "posix_ipc")}
    assert not heavy, "import %s loads %s" % (module, sorted(heavy)[:5])


def test_a_worker_loads_only_what_it_starts_with():
    """Before: `platoon.Worker` also loaded subprocess, secrets (OpenSSL), socket,
    importlib.abc (with importlib.resources, tempfile, shutil, lzma) and every sync rule,
    about 14 ms of CPU at each worker's start; the controller, the launcher and the rules
    that are used load them when needed."""
    loaded = loaded_after("import platoon\nplatoon.Worker\nfrom platoon import EASGD")
    unused = {"subprocess", "secrets", "hmac", "socket", "importlib.abc", "importlib.resources",
              "tempfile", "shutil", "platoon.rules.diloco", "platoon.rules.downpour",
              "platoon.controller", "platoon._controller.minibatches",
              "platoon._worker.minibatches", "platoon.mpi"}
    # what the worker's dependencies load themselves (numpy 2.0, on Python 3.9: subprocess)
    unused -= loaded_after("import numpy, zmq, posix_ipc")
    assert not unused & loaded, sorted(unused & loaded)
    assert "subprocess" in loaded_after("import platoon._os.process\n"
                                        "platoon._os.process.stop([], 0.0)")
    assert "platoon.rules.diloco" in loaded_after("from platoon.rules import DiLoCo")


def test_the_launcher_checks_an_elastic_jobs_options_without_zmq_or_numpy():
    """Before: checking --elastic's membership options imported platoon.elastic (its
    lighthouse client: pyzmq) into the launcher."""
    loaded = loaded_after("from platoon.launch.cli import parse_args\n"
                          "args = parse_args(['x', '--hosts', 'h1', 'h2', '--elastic', "
                          "'--min-nodes', '2'])\nassert args.membership.min_nodes == 2")
    heavy = {m for m in loaded if m.split(".")[0] in ("zmq", "numpy", "torch")
             or m.startswith("platoon.elastic")}
    assert not heavy, sorted(heavy)[:5]


def test_an_elastic_node_starts_its_workers_before_it_loads_zmq_or_numpy():
    """What ``python -m platoon.elastic.node`` imports before it starts its workers (its
    module, its secret, its store) loads neither pyzmq nor numpy: the workers' start-up
    overlaps the node's (its link, its controller). Before: the package's __init__ loaded the
    lighthouse client (pyzmq), platoon.security pyzmq, the node runner the controller's parts
    (numpy), some 0.1-0.3 s of a joiner's start before its worker's."""
    loaded = loaded_after("import platoon.elastic.node\nfrom platoon.elastic.secret import "
                          "load_secret\nfrom platoon.elastic.store import StoreServer")
    heavy = {m for m in loaded if m.split(".")[0] in ("zmq", "numpy", "torch")}
    assert not heavy, sorted(heavy)[:5]
    assert "zmq" in loaded_after("from platoon.elastic import LighthouseClient")


def test_a_launched_child_loads_neither_zmq_nor_numpy(tmp_path):
    child = "platoon.launch.child"
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
                      "('zmq', 'numpy')))\n")
    out = subprocess.run([sys.executable, "-m", child, "probe", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_public_name_imports():
    for name in platoon.__all__:
        assert getattr(platoon, name) is not None, name
    assert set(platoon.__all__) <= set(dir(platoon))
    namespace = {}
    exec("from platoon import *", namespace)
    assert set(platoon.__all__) <= set(namespace)
    assert platoon.Controller.__module__ == "platoon.controller"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        platoon.Nope


@pytest.mark.parametrize("path", ["platoon.rules", "platoon.launch", "platoon.compat",
                                  "platoon.mpi", "platoon.security", "platoon.cuda",
                                  "platoon.adapters", "platoon.collectives", "platoon.protocol"])
def test_public_modules_import_and_are_package_attributes(path):
    module = importlib.import_module(path)
    assert getattr(platoon, path.split(".")[1]) is module


def test_the_package_lists_only_the_public_api():
    import platoon._centre.shmem  # noqa: F401  (a private module, loaded)
    listed = set(dir(platoon)) - {"__version__"}
    assert set(platoon.__all__) <= listed
    modules = listed - set(platoon.__all__)
    assert modules == {"adapters", "collectives", "compat", "controller", "cuda", "device",
                       "errors", "launch", "mpi", "protocol", "rules", "security", "sharding",
                       "torch_sync", "worker"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_import_path_gives_the_moved_module(old):
    """Each documented (and each former) module path still imports, as the same module."""
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert getattr(platoon, old.split(".")[1]) is module


def test_the_original_platoons_paths_import_and_unreleased_ones_are_gone():
    from platoon.channel import Controller
    from platoon.compat.channel import Controller as moved
    from platoon.param_sync import EASGD
    assert Controller is moved and EASGD is platoon.EASGD
    assert sorted(MOVED) == ["platoon.channel", "platoon.param_sync"]
    for gone in ("platoon.launcher", "platoon.shmem", "platoon.child", "platoon.process"):
        with pytest.raises(ImportError):
            importlib.import_module(gone)


def test_mpi_names_of_today():
    from platoon import mpi
    for name in ("CentreTie", "NodeLink", "node_link_for", "run_node", "main", "import_mpi",
                 "load_controller_class"):
        assert callable(getattr(mpi, name)), name
    from platoon._os.process import raise_system_exit as moved
    from platoon.controller import raise_system_exit
    assert raise_system_exit is moved


def platoon_sources():
    """{module name: its file} for every module of the platoon package."""
    import os

    root = os.path.dirname(platoon.__file__)
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "platoon." + os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                files[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
    return files


def module_imports():
    """{module: platoon modules it imports when loaded} (imports inside functions and under
    `if TYPE_CHECKING:` do not count: they run later, or never)."""
    import ast

    files = platoon_sources()
    graph = {}
    for module, path in files.items():
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        with open(path) as f:
            tree = ast.parse(f.read())
        found = set()
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.level:
                    base = package
                    for _ in range(sub.level - 1):
                        base = base.rsplit(".", 1)[0]
                    base = base + "." + sub.module if sub.module else base
                    for alias in sub.names:
                        name = base + "." + alias.name
                        found.add(name if name in files else base)
                elif isinstance(sub, ast.FunctionDef):
                    break
        graph[module] = {m for m in found if m in files and m not in (module, "platoon")}
    return graph


def test_the_import_graph_has_no_cycle():
    graph, done, path = module_imports(), set(), []

    def visit(module):
        if module in path:
            pytest.fail("import cycle: %s" % " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


@functools.lru_cache(maxsize=None)
def every_import():
    """{module: (platoon modules, other top-level packages) it imports anywhere, at load
    time or inside functions} (not under `if TYPE_CHECKING:`). Parsed once for the file's
    tests (each home's test read every source again: 1-3 s each); not to be changed."""
    import ast

    files = platoon_sources()
    found = {}
    for module, path in files.items():
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        with open(path) as f:
            tree = ast.parse(f.read())
        typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.dump(node.test) for sub in ast.walk(node)}
        ours, theirs = set(), set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                base = base + "." + node.module if node.module else base
                ours.update(base + "." + a.name if base + "." + a.name in files else base
                            for a in node.names)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [node.module]):
                    (ours if name.split(".")[0] == "platoon" else theirs).add(
                        name if name.split(".")[0] == "platoon" else name.split(".")[0])
        found[module] = (ours, theirs)
    return found


# The process line (docs/architecture.md): what each private home may not import, anywhere.
NEVER = {
    # (the node link is a contract it declares, `_controller.services`: no multi-node package)
    "platoon._controller": ("platoon._worker", "platoon.worker", "platoon.launch", "platoon.mpi",
                            "platoon.elastic", "platoon.node"),
    "platoon._worker": ("platoon._controller", "platoon.controller", "platoon.launch",
                        "platoon.mpi"),
    "platoon._centre": ("platoon._controller", "platoon._worker", "platoon.controller",
                        "platoon.worker", "platoon.launch", "platoon.mpi", "zmq",
                        "platoon._resources", "platoon.security"),
    "platoon._os": ("platoon.", "zmq", "numpy"),  # the standard library only
    "platoon.rules": ("platoon._", "platoon.controller", "platoon.worker", "zmq"),
    # The two multi-node paths: each builds on the node layer, neither on the other.
    "platoon.elastic": ("platoon._controller", "platoon._worker", "platoon.controller",
                        "platoon.worker", "platoon.launch", "platoon.mpi", "mpi4py"),
    # The node layer: what both paths run (the node runner, codecs, outer step, reaper); no
    # MPI, no elastic machinery, no worker's side.
    "platoon.node": ("platoon.mpi", "platoon.elastic", "platoon.launch", "platoon._worker",
                     "platoon.worker", "platoon.adapters", "platoon.torch_sync",
                     "platoon.collectives", "platoon.compat", "platoon.integrations", "zmq",
                     "mpi4py", "torch"),
    "platoon.launch": ("platoon._controller", "platoon._worker", "platoon._centre",
                       "platoon.controller", "platoon.worker", "platoon.mpi", "platoon.elastic",
                       "platoon.node", "zmq", "numpy"),
    # The original Platoon's names: a facade over the core (nothing imports it: below).
    "platoon.compat": ("platoon._worker", "platoon._centre", "platoon.mpi", "platoon.launch",
                       "zmq", "numpy"),
    # Controller ranks: the controller's side, never a worker's, nor the launcher's.
    "platoon.mpi": ("platoon._worker", "platoon.worker", "platoon.adapters",
                    "platoon.torch_sync", "platoon.collectives", "platoon.compat", "zmq",
                    "platoon.launch", "platoon.elastic"),
    # A worker's arrays: rules and errors only, no process, no sockets.
    "platoon.adapters": ("platoon._", "platoon.controller", "platoon.worker", "platoon.mpi",
                         "platoon.launch", "platoon.compat", "platoon.protocol",
                         "platoon.security", "platoon.torch_sync", "platoon.collectives",
                         "zmq"),
    # The root modules. The leaves: errors, and helpers of the standard library (or numpy).
    "platoon.errors": ("platoon.",),
    "platoon._deprecation": ("platoon.",),
    "platoon._moved": ("platoon.",),  # names its modules as strings, imports none
    "platoon._resources": ("platoon.",),
    "platoon.sharding": ("platoon.",),
    "platoon.cuda": ("platoon.",),
    "platoon.device": ("platoon._controller", "platoon._worker", "platoon._centre",
                       "platoon.controller", "platoon.worker", "platoon.mpi", "platoon.launch",
                       "platoon.compat", "zmq"),
    # Both sides: messages and keys, no process of either side.
    "platoon.protocol": ("platoon._", "platoon.controller", "platoon.worker", "platoon.mpi",
                         "platoon.launch", "platoon.compat", "platoon.adapters", "platoon.rules",
                         "platoon.security", "zmq"),
    "platoon.security": ("platoon._", "platoon.controller", "platoon.worker", "platoon.mpi",
                         "platoon.launch", "platoon.compat", "platoon.protocol"),
    # The facades, each on its side of the process line.
    "platoon.controller": ("platoon._worker", "platoon.worker", "platoon.launch",
                           "platoon.adapters", "platoon.compat", "platoon.mpi",
                           "platoon.elastic", "platoon.node"),
    "platoon.worker": ("platoon._controller", "platoon.mpi", "platoon.launch", "platoon.compat"),
    "platoon.collectives": ("platoon._controller", "platoon.controller", "platoon.mpi",
                            "platoon.launch", "platoon.compat", "zmq"),
    "platoon.torch_sync": ("platoon._controller", "platoon.controller", "platoon.mpi",
                           "platoon.launch", "platoon.compat", "zmq"),
}


@pytest.mark.parametrize("home", sorted(NEVER))
def test_each_home_keeps_to_its_side_of_the_process_line(home):
    crossings = []
    for module, (ours, theirs) in every_import().items():
        if module == home or module.startswith(home + "."):
            for name in sorted(ours | theirs):
                if name.startswith(home) or name == "platoon.errors" and home != "platoon._os":
                    continue
                if any(name == bad or name.startswith(bad if bad.endswith(("_", ".")) else
                                                      bad + ".") for bad in NEVER[home]):
                    crossings.append("%s imports %s" % (module, name))
    assert not crossings, crossings


def test_compat_is_a_facade_that_nothing_imports():
    """`compat/` stands above the core: the core's helpers live below it (`_deprecation`,
    `_controller.arguments`) and compat re-exports them, so no arrow runs back up into it."""
    importers = sorted("%s imports %s" % (module, name)
                       for module, (ours, _) in every_import().items()
                       if module != "platoon.compat" and not module.startswith("platoon.compat.")
                       for name in ours
                       if name == "platoon.compat" or name.startswith("platoon.compat."))
    assert not importers, importers
    for public, home, name in (
            ("compat.controller_args", "_controller.arguments", "default_parser"),
            ("compat.controller_args", "_controller.arguments", "default_arguments"),
            ("compat.deprecation", "_deprecation", "renamed_keywords")):
        assert getattr(importlib.import_module("platoon." + public), name) is getattr(
            importlib.import_module("platoon." + home), name), (public, name)


def architecture_import_table():
    """{unit: the platoon modules its row names} from docs/architecture.md's table
    "Which package imports which": a unit is a package (``mpi``) or a root module
    (``controller`` for ``controller.py``); a row may give several units (one cell, one set).
    Text in parentheses explains and is not read; "nothing" is the empty set."""
    import os
    import re

    path = os.path.join(os.path.dirname(os.path.dirname(platoon.__file__)), "docs",
                        "architecture.md")
    with open(path) as f:
        text = f.read()
    header = "| package | imports (of platoon) |"
    assert header in text, "docs/architecture.md has no import table (%r)" % header
    table = {}
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        units, imports = [cell.strip() for cell in line.strip().strip("|").split("|")]
        while re.search(r"\([^()]*\)", imports):
            imports = re.sub(r"\([^()]*\)", "", imports)
        named = set(re.findall(r"`([\w.]+)`", imports))
        for unit in re.findall(r"`([\w.]+)`", re.sub(r"\([^()]*\)", "", units)):
            unit = unit[:-len(".py")] if unit.endswith(".py") else unit
            assert unit not in table, "docs/architecture.md: %s has two rows" % unit
            table[unit] = named
    return table


def test_the_architecture_import_table_says_what_the_code_imports():
    """Each row of docs/architecture.md's "which package imports which" names every package
    its unit imports (anywhere: at load time or inside a function) and nothing else, and each
    module it names (``rules.diloco``) is one the unit imports; every package and root module
    of platoon has a row."""
    table = architecture_import_table()
    files = platoon_sources()
    code = {}
    for module, (ours, _) in every_import().items():
        parts = module.split(".")
        unit = parts[1] if len(parts) > 1 else "__init__"
        code.setdefault(unit, set()).update(
            name[len("platoon."):] for name in ours
            if name.startswith("platoon.") and name.split(".")[1] != unit)
    assert sorted(table) == sorted(code), "rows missing: %s; rows of nothing: %s" % (
        sorted(set(code) - set(table)), sorted(set(table) - set(code)))
    stale = []
    for unit, named in sorted(table.items()):
        imported = code[unit]
        for name in sorted(named):
            if "platoon." + name not in files:
                stale.append("%s: `%s` is no module of platoon" % (unit, name))
            elif not any(m == name or m.startswith(name + ".") for m in imported):
                stale.append("%s: the code imports no `%s`" % (unit, name))
        said = {name.split(".")[0] for name in named}
        done = {name.split(".")[0] for name in imported}
        if said != done:
            stale.append("%s: the row says %s, the code imports %s" % (
                unit, sorted(said), sorted(done)))
    assert not stale, "docs/architecture.md's import table is stale:\n" + "\n".join(stale)
