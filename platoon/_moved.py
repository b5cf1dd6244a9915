"""Import paths of modules that moved into subpackages, kept working.

`import platoon.channel`, `from platoon.shmem import SharedCentre` and `python -m
platoon.child` load the module at its new home (the same module object, so
`platoon.channel is platoon.compat.channel`). One line per old path below: this
table is also the map of where each old module went.
"""

import importlib
import importlib.machinery
import sys

MOVED = {
    # the launcher's processes (platoon.launch: loads neither zmq nor numpy)
    "platoon.launcher": "platoon.launch.cli",
    "platoon.supervision": "platoon.launch.supervision",
    "platoon.child": "platoon.launch.child",
    "platoon.reaper": "platoon.launch.reaper",
    "platoon.process": "platoon._os.process",
    "platoon.environment": "platoon._os.environment",
    # sync rules (platoon.rules)
    "platoon.downpour": "platoon.rules.downpour",
    "platoon.diloco": "platoon.rules.diloco",
    "platoon.kernels": "platoon.rules.kernels",
    "platoon._sync_kernels": "platoon.rules._sync_kernels",
    # the original Platoon's names (platoon.compat)
    "platoon.channel": "platoon.compat.channel",
    "platoon.param_sync": "platoon.compat.param_sync",
    "platoon.controller_args": "platoon.compat.controller_args",
    "platoon.deprecation": "platoon.compat.deprecation",
    # the controller's parts (private)
    "platoon.controller_config": "platoon._controller.config",
    "platoon.afterjob": "platoon._controller.afterjob",
    "platoon.checkpointing": "platoon._controller.checkpointing",
    "platoon.dispatch": "platoon._controller.dispatch",
    "platoon.endpoints": "platoon._controller.endpoints",
    "platoon.logthrottle": "platoon._os.logthrottle",
    "platoon.peers": "platoon._controller.peers",
    "platoon.registry": "platoon._controller.registry",
    "platoon.rendezvous": "platoon._controller.rendezvous",
    "platoon.services": "platoon._controller.services",
    "platoon.status": "platoon._controller.status",
    # the centre's machinery, used by both sides (private)
    "platoon.shmem": "platoon._centre.shmem",
    "platoon.exchange": "platoon._worker.exchange",
    "platoon.stopsignal": "platoon._centre.stopsignal",
    "platoon.checkpoint": "platoon._centre.checkpoint",
    # both sides' plumbing (private)
    "platoon.client": "platoon._worker.client",
    "platoon.resources": "platoon._resources",
    "platoon.minibatches": "platoon._controller.minibatches",
}


class MovedModules:
    """Finds an old path of `MOVED` and gives the module at its new path (a meta path finder
    and loader by protocol: `importlib.abc` would load `importlib.resources`, `tempfile` and
    `shutil` into every process, a few milliseconds of start-up)."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)

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
