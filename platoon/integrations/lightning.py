"""A Lightning script as a platoon worker, in one added line: `PlatoonStrategy`.

::

    import lightning as L
    from platoon.integrations.lightning import PlatoonStrategy

    trainer = L.Trainer(max_epochs=3, strategy=PlatoonStrategy())   # this process: a worker
    trainer.fit(model, train_loader, val_loader)

The strategy trains on one device, as Lightning's ``SingleDeviceStrategy`` (which it extends),
and syncs the model with the job's centre every `sync_every` real optimizer steps (a
``PeriodicSync`` counting, through the optimizer's post-step hook, the steps that Lightning's
precision plugin really takes: ``accumulate_grad_batches``' micro-batches are not steps, nor
are the steps a GradScaler skips). Every validation during ``fit`` runs on the centre (and
only the validation: the worker's own weights are back before any callback's
``on_validation_end``, so a checkpoint holds them); at the end of ``fit`` the job's last
worker validates the final centre once as the job's result, and the model then holds the
centre. Platoon's state rides in Lightning's checkpoints and resumes with
``fit(ckpt_path=...)``. A LightningCLI script selects it with no line changed::

    python main.py fit --trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy

(or ``class_path:`` in its config); once this module is imported, ``strategy="platoon"`` names
it too. It works with ``lightning`` and with ``pytorch_lightning``. docs/lightning.md tells
the rest. Imported only by its users; needs one of the two (the ``lightning`` extra).
"""

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Dict, List, Optional, Set

import torch

from ..errors import PlatoonError
from ..rules import ParamSyncRule
from ..torch_sync import BUFFERS, PeriodicSync
from ..worker import Worker
from ._core import StepCounter, job_workers, own_ddp_refused, worker_slot

PACKAGES = ("lightning", "pytorch_lightning")  # Lightning's two names for one Trainer


def installed(package: str) -> bool:
    """Whether `package` can be imported (not blocked by a None in sys.modules)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


if not any(installed(name) for name in PACKAGES):
    raise ImportError("platoon.integrations.lightning needs Lightning (lightning or "
                      "pytorch_lightning): pip install 'platoon-dp[lightning]' (in platoon's "
                      "clone: pip install -e '.[lightning]')")

STATE_KEY = "platoon"  # platoon's state in a Lightning checkpoint


def users_package(package: Optional[str] = None) -> str:
    """The Lightning package whose Trainer the strategy serves: `package` if given, else the
    one of ``lightning`` and ``pytorch_lightning`` that the script imported (``lightning`` if
    both or neither), else the one installed. ValueError for another name, ImportError when
    it is not installed."""
    if package is not None:
        if package not in PACKAGES:
            raise ValueError("package must be %s or %s (the package of your Trainer), got %r"
                             % (PACKAGES + (package,)))
        if not installed(package):
            raise ImportError("PlatoonStrategy(package=%r): %s is not installed" % (package,
                                                                                    package))
        return package
    imported = [name for name in PACKAGES if sys.modules.get(name) is not None]
    if imported:
        return imported[0]
    return next(name for name in PACKAGES if installed(name))


def worker_version(version: Any, directory: str) -> str:
    """A Lightning file logger's version for one worker of a job: ``workerK`` (`directory`)
    where the script set none, else under the script's (or a version Lightning already
    chose): ``exp/workerK``, ``version_3/workerK``; so no two workers share a directory."""
    if version is None:
        return directory
    return os.path.join(version if isinstance(version, str) else "version_%s" % version,
                        directory)


SHORT_NAME = "platoon"  # the strategy's name in Lightning's StrategyRegistry

_CLASSES: Dict[str, type] = {}


def lightning_module(package: str) -> str:
    """The module of `package` that holds its Trainer, strategies and callbacks."""
    return "lightning.pytorch" if package == "lightning" else package


def strategy_class(package: str) -> type:
    """`PlatoonStrategy` over `package`'s ``SingleDeviceStrategy`` (made once per package).

    Making it also makes `PlatoonStrategy` a (virtual) subclass of `package`'s ``Strategy``,
    so that LightningCLI takes ``class_path: platoon.integrations.lightning.PlatoonStrategy``
    for its ``trainer.strategy``, and registers `SHORT_NAME` in its ``StrategyRegistry``."""
    if package not in _CLASSES:
        strategies = importlib.import_module(lightning_module(package) + ".strategies")
        _CLASSES[package] = type("PlatoonStrategy",
                                 (PlatoonStrategy, strategies.SingleDeviceStrategy),
                                 {"__module__": __name__, "__doc__": PlatoonStrategy.__doc__,
                                  "package": package})
        strategies.Strategy.register(PlatoonStrategy)
        strategies.StrategyRegistry.register(
            SHORT_NAME, _CLASSES[package], override=True,
            description="platoon: this process a worker of a platoon job "
                        "(platoon.integrations.lightning.PlatoonStrategy)")
    return _CLASSES[package]


_CALLBACKS: Dict[str, type] = {}


def centre_out_class(package: str) -> type:
    """A callback of `package` that gives the model its worker's own weights back at the end
    of a validation, before any other callback's hook there (``ModelCheckpoint`` saves in its
    ``on_validation_end``); made once per package."""
    if package not in _CALLBACKS:
        base = importlib.import_module(lightning_module(package) + ".callbacks").Callback

        class CentreOut(base):  # type: ignore[valid-type,misc]
            """The worker's own weights back before the other callbacks' end of validation."""

            def __init__(self, restore: Any) -> None:
                self.restore = restore

            def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
                self.restore()

        CentreOut.__module__ = __name__
        _CALLBACKS[package] = CentreOut
    return _CALLBACKS[package]


AFTER_FIT = ("validate", "test", "predict")  # what a script may run after fit
JOBS_MODEL = (None, "best", "last")  # a ckpt_path that means the fit's model, after fit


class JoinFirst:
    """The strategy's launcher: the one hook Lightning calls with the Trainer before ``fit``
    looks for its checkpoint, so that the worker has joined its job and logs and checkpoints
    under its own ``workerK`` when ``fit(ckpt_path="last")`` looks there; and before a
    ``validate``, ``test`` or ``predict`` after ``fit`` picks its checkpoint
    (`PlatoonStrategy._after_fit`). Starts no process."""

    is_interactive_compatible = True

    def __init__(self, strategy: "PlatoonStrategy") -> None:
        self.strategy = strategy

    def launch(self, function: Any, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if trainer is not None and trainer.state.fn == "fit":
            self.strategy._join(trainer)  # noqa: SLF001 (its own strategy)
        elif trainer is not None and trainer.state.fn in AFTER_FIT:
            args, kwargs = self.strategy._after_fit(  # noqa: SLF001 (its own strategy)
                function, trainer, args, kwargs)
        return function(*args, **kwargs)

    def kill(self, signum: Any) -> None:
        """Nothing to kill: the strategy started no process (Lightning calls it on SIGTERM)."""


class PlatoonStrategy:
    """A Lightning strategy that makes the Trainer's process a worker of a platoon job.

    ``Trainer(strategy=PlatoonStrategy())``; the instance is a ``SingleDeviceStrategy`` of the
    Lightning package the script uses (`users_package`). In a LightningCLI script:
    ``--trainer.strategy.class_path=platoon.integrations.lightning.PlatoonStrategy`` (and
    ``--trainer.strategy.init_args.sync_every=8``), or the same under ``trainer: strategy:``
    in its config; ``strategy="platoon"`` once this module is imported.

    Parameters:
        sync_every: sync with the centre after every this many real optimizer steps (>= 1).
        rule: the sync rule; default as ``PeriodicSync``'s: ``EASGD(0.9 / workers)``, and
            ``ASGD()`` in a job of one worker (the script run alone trains as without
            platoon); ``DiLoCo(...)`` or any platoon rule.
        buffers: "sync" (default): floating-point buffers (BatchNorm's statistics) go through
            the centre with the parameters; "exclude": each worker keeps its own.
        counted_optimizer: with several optimizers (manual optimization), the index in
            ``configure_optimizers``' list of the one whose steps are counted (default 0:
            the first); each sync syncs the whole model.
        validate_centre: True: every validation loop of ``fit`` runs on the centre as it is
            then (the worker's own weights come back at its end, before the callbacks'
            ``on_validation_end``: a checkpoint saved there holds them); False: on the
            worker's own.
        evaluate_centre: True: at the end of ``fit`` the job's last worker runs the
            validation loop once on the final centre (when there is validation data); the
            launcher's summary shows its metrics as the job's result, and `final_result`
            holds them on that worker.
        worker: this process's `platoon.Worker`; default one made at the start of ``fit``
            (under the launcher or ``python -m platoon.mpi`` a worker of the job, alone a
            one-worker job) and closed at its end.
        report_every_s: progress reports (steps, the training loss) to the launcher's status
            line at most this often; None: never.
        device: the device to train on; default the accelerator's (under the launcher, the
            worker's GPU or the CPU).
        package: "lightning" or "pytorch_lightning", the package of the Trainer; default the
            one the script imported (`users_package`).

    After ``fit`` the model holds the centre (the final one on the job's last worker), so
    that ``trainer.validate``, ``trainer.test`` and saving the model see it. Raises
    PlatoonError at the start of ``fit`` when Lightning's own DDP is asked for
    (``devices`` or ``num_nodes`` above 1, torchrun's WORLD_SIZE) or for a second ``fit``;
    ValueError for a bad `sync_every`, `buffers` or `counted_optimizer`.
    """

    # Set by Lightning's accelerator connector (the Trainer's devices and num_nodes), read to
    # refuse its DDP: a SingleDeviceStrategy would ignore them.
    parallel_devices: Optional[List[torch.device]] = None
    num_nodes = 1
    package: str  # the Lightning package, set on each package's class (`strategy_class`)

    def __new__(cls, *args: Any, **options: Any) -> Any:
        if cls is PlatoonStrategy:
            cls = strategy_class(users_package(options.get("package")))
        return object.__new__(cls)

    # __new__ only picks the class: a tool that reads a class's parameters from its own
    # __new__ when it has one (LightningCLI's jsonargparse) is to read __init__'s, as for a
    # class without one.
    __new__.__wrapped__ = object.__new__  # type: ignore[attr-defined]

    def __init__(self, *, sync_every: int = 4, rule: Optional[ParamSyncRule] = None,
                 buffers: str = "sync", counted_optimizer: int = 0,
                 validate_centre: bool = True, evaluate_centre: bool = True,
                 worker: Optional[Worker] = None, report_every_s: Optional[float] = 1.0,
                 device: Any = None, package: Optional[str] = None) -> None:
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError("sync_every must be an integer >= 1, got %r" % (sync_every,))
        if isinstance(counted_optimizer, bool) or not isinstance(counted_optimizer, int) \
                or counted_optimizer < 0:
            raise ValueError("counted_optimizer must be an index >= 0 into "
                             "configure_optimizers' optimizers, got %r" % (counted_optimizer,))
        if buffers not in BUFFERS:
            raise ValueError("buffers must be one of %s, got %r" % (", ".join(BUFFERS), buffers))
        super().__init__(device="cpu" if device is None else device)  # type: ignore[call-arg]
        self.sync_every, self.rule, self.buffers = sync_every, rule, buffers
        self.counted_optimizer = counted_optimizer
        self.validate_centre, self.evaluate_centre = validate_centre, evaluate_centre
        self.report_every_s = report_every_s
        self._device_given = device is not None
        self._given_worker = worker
        self.worker: Optional[Worker] = None
        self.sync: Optional[PeriodicSync] = None  # made at the start of fit
        self.final_result: Optional[Dict[str, Any]] = None
        self._fitted = False
        self._counter: Optional[StepCounter] = None
        self._resumed: Optional[Dict[str, Any]] = None  # platoon's state from a checkpoint
        self._on_centre = contextlib.ExitStack()  # the centre in the model, while validating
        self._final = False  # validating the final centre
        self._centre_loaded = False  # the centre in the model (inside `_on_centre`)
        self._centre_out_callback: Any = None
        self._redirected: Set[int] = set()
        self._slot: Optional[str] = None  # this worker's workerK in a job of several
        self._centre_after_fit: Optional[Dict[str, Any]] = None  # what fit left in the model

    # -- the strategy's Lightning parts (super(): the package's SingleDeviceStrategy) --

    def _trainer(self) -> Any:
        return self.lightning_module.trainer  # type: ignore[attr-defined]

    def _configure_launcher(self) -> None:
        self._launcher = JoinFirst(self)

    def _join(self, trainer: Any) -> None:
        """At the start of ``fit``: refuse Lightning's DDP, join the job, give this worker its
        own directories and seed (once a fit)."""
        self._refuse_ddp(trainer)
        if self._fitted:
            raise PlatoonError("a PlatoonStrategy serves one trainer.fit(): its worker left "
                               "the job at the end of the first; give the next Trainer a new "
                               "PlatoonStrategy")
        if self.worker is None:
            self.worker = Worker() if self._given_worker is None else self._given_worker
            self._own_files(trainer)
        if self._centre_out_callback is None:
            self._centre_out_callback = centre_out_class(self.package)(self._centre_out)
        if self._centre_out_callback not in trainer.callbacks:  # first: before the savers
            trainer.callbacks.insert(0, self._centre_out_callback)

    def setup_environment(self) -> None:
        """At the start of ``fit``, the job joined (`JoinFirst` did already, unless the
        Trainer took no launcher); then the device's set-up."""
        trainer = self._trainer()
        if trainer.state.fn == "fit":
            self._join(trainer)
            if not self._device_given and self.parallel_devices:
                self._root_device = torch.device(self.parallel_devices[0])
        if self.parallel_devices:
            self.parallel_devices = [self.root_device]  # type: ignore[attr-defined]
        super().setup_environment()  # type: ignore[misc]

    def _refuse_ddp(self, trainer: Any) -> None:
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        world = max(world, int(os.environ.get("WORLD_SIZE", "1") or 1))
        if world > 1:
            raise own_ddp_refused(world, "Lightning", "torchrun or a cluster's ranks: "
                                  "WORLD_SIZE=%d" % world)
        devices = getattr(getattr(trainer, "_accelerator_connector", None), "_devices_flag",
                          None)
        asked = len(devices) if isinstance(devices, (list, tuple)) else \
            devices if isinstance(devices, int) and devices > 0 else 1
        if asked > 1 or self.num_nodes > 1:
            raise PlatoonError(
                "Trainer(devices=%r, num_nodes=%d) asks for Lightning's DDP across %d "
                "processes: under platoon each worker trains alone on one device and syncs "
                "through the centre. Leave devices and num_nodes at 1 and start N workers "
                "with platoon-launcher -n N (or python -m platoon.mpi)"
                % (devices, self.num_nodes, asked * self.num_nodes))

    def _own_files(self, trainer: Any) -> None:
        """In a job of several workers, worker K logs and checkpoints under its own
        ``workerK`` (in Lightning's file loggers' version, a ModelCheckpoint's dirpath, the
        default root directory) and seeds torch with ``torch.initial_seed() + K``."""
        assert self.worker is not None
        slot = worker_slot(self.worker)
        if slot is None:
            return
        directory, offset = slot
        self._slot = directory
        torch.manual_seed((torch.initial_seed() + offset) % 2 ** 64)
        if id(trainer) not in self._redirected:
            self._redirected.add(id(trainer))
            root = trainer.default_root_dir
            trainer._default_root_dir = os.path.join(root, directory)  # noqa: SLF001 (Lightning)
            for logger in trainer.loggers:  # Lightning's file loggers (CSV, TensorBoard)
                if hasattr(logger, "_version"):
                    logger._version = worker_version(logger._version,  # noqa: SLF001
                                                     directory)
            for callback in trainer.checkpoint_callbacks:
                if getattr(callback, "dirpath", None) is not None \
                        and id(callback) not in self._redirected:
                    self._redirected.add(id(callback))
                    callback.dirpath = os.path.join(callback.dirpath, directory)

    def setup(self, trainer: Any) -> None:
        """The package's set-up (model on its device, optimizers, precision); at the start of
        ``fit`` the model (loaded from the checkpoint, when resuming) is shared with the job's
        centre and the counted optimizer's real steps are counted."""
        super().setup(trainer)  # type: ignore[misc]
        if trainer.state.fn != "fit":
            return
        optimizers = self.optimizers  # type: ignore[attr-defined]
        if self.counted_optimizer >= len(optimizers):
            raise ValueError("PlatoonStrategy(counted_optimizer=%d): configure_optimizers "
                             "gave %d optimizer(s); count one of them (0 .. %d)"
                             % (self.counted_optimizer, len(optimizers), len(optimizers) - 1))
        assert self.worker is not None
        self.sync = PeriodicSync(self.worker, self.lightning_module, None,  # type: ignore
                                 sync_every=self.sync_every, rule=self.rule, buffers=self.buffers,
                                 report_every_s=self.report_every_s)
        if self._resumed:
            self.sync.load_state_dict(self._resumed)
            self._resumed = None
        self._counter = StepCounter(optimizers[self.counted_optimizer], self.sync.step,
                                    job_workers(self.worker))

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().training_step(*args, **kwargs)  # type: ignore[misc]
        loss = out.get("loss") if isinstance(out, dict) else out
        if self.sync is not None:
            self.sync.count_batches()  # a batch (accumulate_grad_batches: several a step)
            if isinstance(loss, torch.Tensor):
                self.sync.report_loss(loss)
        return out

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any,
                        storage_options: Any = None) -> None:
        """Lightning's checkpoint, with platoon's state (the sync phase) under "platoon"."""
        if self.sync is not None:
            checkpoint[STATE_KEY] = self.sync.state_dict()
        super().save_checkpoint(checkpoint, filepath,  # type: ignore[misc]
                                storage_options=storage_options)

    def lightning_module_state_dict(self) -> Dict[str, Any]:
        """The model's state dict for a checkpoint: always the worker's own weights. (A save
        in the middle of a validation on the centre takes them back for the save, then the
        centre as it is then.)"""
        if not self._centre_loaded:
            return super().lightning_module_state_dict()  # type: ignore[misc]
        self._centre_out()
        try:
            state = super().lightning_module_state_dict()  # type: ignore[misc]
            return {key: value.detach().clone() if isinstance(value, torch.Tensor) else value
                    for key, value in state.items()}
        finally:
            self._enter_centre()

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Lightning's checkpoint; platoon's state in it resumes the sync phase."""
        checkpoint = super().load_checkpoint(*args, **kwargs)  # type: ignore[misc]
        self._resumed = checkpoint.get(STATE_KEY)
        return checkpoint

    # -- validation on the centre --

    def _enter_centre(self) -> None:
        if self.sync is not None and not self._fitted and not self._centre_loaded \
                and (self.validate_centre or self._final):
            self._on_centre.enter_context(self.sync.centre())
            self._centre_loaded = True

    def _centre_out(self) -> None:
        """The worker's own weights back in the model (`CentreOut` calls it first)."""
        self._on_centre.close()
        self._centre_loaded = False

    def on_validation_start(self) -> None:
        super().on_validation_start()  # type: ignore[misc]
        self._enter_centre()

    def on_validation_end(self) -> None:
        self._centre_out()
        super().on_validation_end()  # type: ignore[misc]

    # -- the end of fit --

    def on_train_end(self) -> None:
        """Finish the last sync, take part in the final evaluation, load the centre into the
        model and leave the job."""
        super().on_train_end()  # type: ignore[misc]
        if self.sync is None:
            return
        self._stop_counting()
        self.sync.finish()
        trainer = self._trainer()
        val_loop = trainer.fit_loop.epoch_loop.val_loop
        if self.evaluate_centre:
            trainer.validating = True
            val_loop.setup_data()
            trainer.training = True
            if not val_loop.skip:
                self.final_result = self.worker.final_evaluation(  # type: ignore[union-attr]
                    self._validate_final_centre)
        # The model holds the centre from now on (after every worker's last sync on the last).
        self._centre_after_fit = self.sync.centre_state_dict()
        self.lightning_module.load_state_dict(self._centre_after_fit)  # type: ignore
        self._fitted = True
        self._leave()

    def _validate_final_centre(self) -> Dict[str, Any]:
        """The fit's validation loop once, on the final centre (loaded at its start, as in
        every validation, and out before the callbacks' end of validation)."""
        trainer = self._trainer()
        val_loop = trainer.fit_loop.epoch_loop.val_loop
        logging = trainer._logger_connector  # noqa: SLF001 (Lightning)
        first_loop_iter = logging._first_loop_iter  # noqa: SLF001 (Lightning)
        trainer.validating = True  # as Lightning's training loop runs it
        self._final = True
        try:
            outputs = val_loop.run()
        finally:
            self._final = False
            self._centre_out()
            trainer.training = True
            logging._first_loop_iter = first_loop_iter  # noqa: SLF001 (Lightning)
        metrics: Dict[str, Any] = {}
        for logged in outputs:
            metrics.update(logged)
        return metrics

    def _after_fit(self, function: Any, trainer: Any, args: Any, kwargs: Any) -> Any:
        """Before a ``validate``, ``test`` or ``predict`` after ``fit``, in a job of several
        workers: a `ckpt_path` of None, "best" or "last" (the fit's model, as Lightning reads
        them) runs on the centre the fit left in the model, not on this worker's own
        checkpoint (its weights are one worker's, not the job's model); a path runs on that
        checkpoint, as Lightning does. Prints which, above Lightning's table: one worker's
        run, not the job's result. Returns `function`'s arguments."""
        if self._slot is None or self._centre_after_fit is None:
            return args, kwargs  # alone, or no fit: Lightning's own ways
        bound = inspect.signature(function).bind(*args, **kwargs)
        ckpt_path, model = bound.arguments.get("ckpt_path"), bound.arguments.get("model")
        what = getattr(trainer.state.fn, "value", trainer.state.fn)  # "test"
        module = self.lightning_module  # type: ignore[attr-defined]
        if ckpt_path in JOBS_MODEL and model in (None, module):
            module.load_state_dict(self._centre_after_fit)
            bound.arguments["model"], bound.arguments["ckpt_path"] = module, None
            held = ("the job's final centre" if self.final_result is not None else
                    "the centre as it was when this worker finished (the job's final centre "
                    "is on the worker that evaluated it)")
            print("platoon %s: this %s runs on %s, not on this worker's own checkpoint "
                  "(ckpt_path=%r after fit); the job's result is the launcher's final result"
                  % (self._slot, what, held, ckpt_path), flush=True)
        elif ckpt_path is not None:
            print("platoon %s: this %s runs on checkpoint %s, one worker's weights, not the "
                  "job's model; the job's result is the launcher's final result"
                  % (self._slot, what, ckpt_path), flush=True)
        return bound.args, bound.kwargs

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.remove()
            self._counter = None

    def _leave(self) -> None:
        self._centre_out()
        if self.worker is not None and self._given_worker is None:
            self.worker.close()

    def teardown(self) -> None:
        """Lightning's teardown; after a failed ``fit``, leave the job (closing the worker
        made here)."""
        self._centre_out()
        self._stop_counting()
        if self.worker is not None and not self._fitted:
            self._fitted = True
            self._leave()
        super().teardown()  # type: ignore[misc]



def _serve_the_imported() -> None:
    """Make the strategy a strategy of each Lightning already imported: a LightningCLI script
    has imported its Lightning before its parser imports this module (for ``class_path:
    platoon.integrations.lightning.PlatoonStrategy``), and checks the class against it."""
    for package in PACKAGES:
        if sys.modules.get(lightning_module(package) + ".strategies") is not None:
            strategy_class(package)


_serve_the_imported()

__all__ = ["PlatoonStrategy", "STATE_KEY", "SHORT_NAME", "users_package", "strategy_class",
           "worker_version"]
