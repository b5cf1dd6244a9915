"""The original Platoon's module paths, kept working: `import platoon.channel` and
`from platoon.param_sync import EASGD` load the module at its home in `platoon.compat`
(the same module object, so `platoon.channel is platoon.compat.channel`).

The 30 other old paths this table held (`platoon.launcher`, `platoon.shmem`,
`platoon.child`, ...) existed only between unreleased versions of this package and were
removed with version 0.1.0's layout (docs/architecture.md maps the tree).
"""

import importlib
import importlib.machinery
import sys

MOVED = {
    # the original Platoon's names (platoon.compat)
    "platoon.channel": "platoon.compat.channel",
    "platoon.param_sync": "platoon.compat.param_sync",
}


class MovedModules:
    """Finds an old path of `MOVED` and gives the module at its new path (a meta path finder
    and loader by protocol: `importlib.abc` would load `importlib.resources`, `tempfile` and
    `shutil` into every process, a few milliseconds of start-up)."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)  # type: ignore[arg-type]  # a Loader by protocol

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # loaded at its new path already

    def get_code(self, name):
        """For `python -m OLD.PATH`: run the module at its new path as __main__."""
        return compile("import runpy\nrunpy.run_module(%r, run_name='__main__', alter_sys=True)"
                       % MOVED[name], "<%s, moved to %s>" % (name, MOVED[name]), "exec")


def install():
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
