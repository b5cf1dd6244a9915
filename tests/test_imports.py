"""The public API imports on demand: supervising processes load neither zmq nor numpy."""

import importlib
import subprocess
import sys

import pytest

import platoon


def loaded_after(statement):
    """The modules loaded by `statement` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", statement + "\nimport sys\nprint(' '.join("
                          "sorted(sys.modules)))"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["platoon", "platoon.process", "platoon.child",
                                    "platoon.launcher", "platoon.supervision",
                                    "platoon.reaper", "platoon.environment"])
def test_supervising_modules_load_neither_zmq_nor_numpy(module):
    loaded = loaded_after("import " + module)
    heavy = {m for m in loaded if m.split(".")[0] in ("zmq", "numpy", "mpi4py", "posix_ipc")}
    assert not heavy, "import %s loads %s" % (module, sorted(heavy)[:5])


def test_a_launched_child_loads_neither_zmq_nor_numpy(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
                      "('zmq', 'numpy')))\n")
    out = subprocess.run([sys.executable, "-m", "platoon.child", "probe", str(script)],
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


@pytest.mark.parametrize("path", ["platoon.channel", "platoon.param_sync", "platoon.mpi",
                                  "platoon.launcher", "platoon.security", "platoon.cuda",
                                  "platoon.adapters", "platoon.process"])
def test_public_modules_import_and_are_package_attributes(path):
    module = importlib.import_module(path)
    assert getattr(platoon, path.split(".")[1]) is module


def test_mpi_and_launcher_names_of_today():
    from platoon import launcher, mpi
    for name in ("CentreTie", "NodeLink", "node_link_for", "run_node", "main", "import_mpi",
                 "load_controller_class"):
        assert callable(getattr(mpi, name)), name
    assert callable(launcher.main)
    from platoon.controller import raise_system_exit
    from platoon.process import raise_system_exit as moved
    assert raise_system_exit is moved
