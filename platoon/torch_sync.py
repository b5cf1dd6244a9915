"""Periodic syncing in one line of an existing PyTorch training loop: `PeriodicSync`.

`PeriodicSync` wraps a ``torch.optim.Optimizer``, or none for a loop that
updates the parameters by hand: every `sync_every` calls of its `step()` it
syncs the model with the job's centre under a sync rule, in place or, with
``overlap=True`` (or ``"step"``), in the background while the next steps (or the
next step's forward and backward) compute. Everything
else (``zero_grad``, ``param_groups``, ``state_dict``, learning-rate
schedulers) goes to the wrapped optimizer, so it drops into existing code;
``with sync.centre():`` evaluates the centre in the model and gives the
worker's own weights back. The same idea as torch's ``PostLocalSGDOptimizer``
(periodic model averaging) and torchft's ``DiLoCo``, with platoon's
asynchronous centre.
Imported only when ``platoon.PeriodicSync`` is first used; torch is needed then.
"""

import contextlib
import logging
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Union

try:
    import torch
except ImportError as exc:  # pragma: no cover - torch is in the test extra
    raise ImportError("platoon.PeriodicSync needs PyTorch: pip install torch (or the "
                      "'torch' extra of platoon)") from exc

from ._worker.exchange import SyncHandle
from .adapters.torch_adapter import describe_layout, layout_changed
from .errors import LayoutMismatch, PlatoonError
from .rules import ASGD, EASGD, ParamSyncRule

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger(__name__)


def _delegated(name: str, doc: str) -> property:
    """A property reading and writing attribute `name` of the wrapped optimizer."""
    def get(self: "PeriodicSync") -> Any:
        return getattr(self._wrapped(name), name)

    def set_(self: "PeriodicSync", value: Any) -> None:
        setattr(self._wrapped(name), name, value)
    return property(get, set_, doc=doc)


BUFFERS = ("sync", "exclude")
_WORKERS: Any = object()  # "the worker's timeout_s"


class PeriodicSync(torch.optim.Optimizer):
    """An optimizer that also syncs `model` with the centre every `sync_every` steps.

    Replace ``opt = torch.optim.SGD(model.parameters(), lr=0.1)`` by::

        opt = platoon.PeriodicSync(w, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                   sync_every=4, rule=platoon.EASGD(0.45))

    and the loop (``opt.zero_grad(); loss.backward(); opt.step()``) stays as it
    is. A loop that updates the parameters itself (``p.data.add_(p.grad, alpha=-lr)``)
    passes no optimizer and calls `step()` after its update::

        sync = platoon.PeriodicSync(w, model, sync_every=4)
        ...
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)   # the script's own lr, annealed its own way
        sync.step()                          # steps 4, 8, ...: sync with the centre

    The constructor calls ``worker.init_shared_params`` on the model's
    parameters (and floating-point buffers, see `buffers`): the first worker's
    values initialise the centre, every other worker's model starts from it.

    Parameters:
        worker: this process's `platoon.Worker`, before `init_shared_params`.
        model: the ``nn.Module`` trained by `optimizer`; its parameters must
            be contiguous tensors, all on the CPU or all on one GPU.
        optimizer: the ``torch.optim.Optimizer`` stepping the model, or None
            (the default) when the script updates the parameters itself: then
            `step()` only counts and syncs, and `zero_grad()` is the model's.
        sync_every: sync after every this many `step()` calls (>= 1).
        rule: the sync rule (EASGD, ASGD, Downpour(...), or your own);
            default ``EASGD(min(0.9 / worker.global_size, 1))`` (on an elastic
            node, its own workers), the usual elastic force for that many workers
            (with SGD and with AdamW give
            the workers about twice the lr one process would use: see
            docs/choosing-a-rule.md), and ``ASGD()`` in a job of one worker (a
            script run alone, or ``-n 1``: the controller's ``num_workers`` is 1),
            which leaves its training as the plain script's.
        overlap: False: sync in `step()`, waiting for it. True: `step()` starts
            the sync in a background thread (``Worker.start_sync``) and the
            next steps compute meanwhile; the next sync point (or `wait`,
            `sync`, leaving the ``with`` block) first finishes it, applying
            its effect on top of the steps taken since. The centre receives
            exactly what it would without overlap; the worker feels the
            centre's pull `sync_every` steps later, so the steps in between
            are computed from parameters not yet pulled (when the gradient
            does not depend on the parameters, the results are the same).
            "step": the sync runs in the background during the next step's
            forward and backward and is finished at the start of the next
            `step()`, before the optimizer writes the parameters; it updates
            the parameters in place, without copying them
            (``Worker.start_sync(snapshot=False)``), at about the cost of an
            in-place sync, so that, given a free core, it hides the sync. The
            forward and backward read the parameters while the sync updates
            them (each element from before or after it); the optimizer's step
            then sees exactly the parameters of an in-place sync. The script
            must not write the parameters itself between `step()` calls (call
            `wait()` first). With no optimizer (the script's own update comes
            before `step()`) or shared buffers (BatchNorm's statistics, which
            the forward writes) the sync copies the parameters first, as with
            True, and is still finished at the next `step()`.
            True and "step" need a rule with push/pull (EASGD, ASGD,
            Downpour(SGD)).
        buffers: "sync" (default): floating-point buffers, such as
            BatchNorm's running mean and variance, are shared through the
            centre under the same rule as the parameters, so the centre is a
            model whose statistics match its weights (as DDP broadcasts
            buffers by default); with EASGD they are elastically averaged,
            with ASGD/Downpour their changes reach the centre as the
            parameters' do. Non-persistent buffers (not in the state dict)
            are left alone. "exclude": every worker keeps its own buffers and the
            centre holds parameters only. Integer buffers (BatchNorm's
            ``num_batches_tracked``) cannot be averaged and are never shared:
            each worker keeps its own count, and `centre_state_dict` takes
            this worker's.
        start_together: True (default): the constructor waits until every worker of
            the job has shared its model (``Worker.start_together``, bounded by the
            worker's timeout_s), so that no worker trains alone before the others
            start; a replacement joining a job that already syncs does not wait.
            False: start at once.
        report_every_s: report progress to the controller (the launcher's status
            line) from `step` at most this often, in seconds: ``steps`` and, once
            given to `step(loss=...)` or `report_loss`, ``loss``; each report counts
            the steps since the last as minibatches, or, once the script counts its
            batches with `count_batches` (gradient accumulation: several batches a
            step), those batches. None: never (the script calls ``Worker.report``
            itself).
        evaluate: ``evaluate(model) -> dict`` of metrics, the job's one final
            result: `finish()` (also leaving the ``with`` block) has the last worker
            of the job to finish call it once, with the final centre in the model
            (``Worker.final_evaluation``); the launcher's summary shows it.

    A shared tensor that torch moves in memory, dtype and shape unchanged
    (``model.share_memory()``, ``p.data = ...``), keeps syncing; so does one the
    model replaced by a tensor of the same dtype, shape and device (a buffer after
    ``model.double()`` then ``model.float()``): its values are copied into the
    shared tensor, which takes its place in the model again. At a sync,
    LayoutMismatch names one whose dtype, shape or device is still changed.

    Raises ValueError for a bad `sync_every` or `buffers`, TypeError for a
    `model` or `optimizer` of the wrong kind or `overlap` with a rule that
    cannot run in the background, and as
    ``Worker.init_shared_params``; ControllerTimeout when `start_together` waited
    the worker's timeout_s. It is a context manager: leaving the block calls
    `finish` (not after an exception: the worker's close finishes a sync in flight).
    """

    def __init__(self, worker: "Worker", model: "torch.nn.Module",
                 optimizer: Optional["torch.optim.Optimizer"] = None, *, sync_every: int,
                 rule: Optional[ParamSyncRule] = None, overlap: Union[bool, str] = False,
                 buffers: str = "sync", start_together: bool = True,
                 report_every_s: Optional[float] = 1.0,
                 evaluate: Optional[Callable[["torch.nn.Module"], Dict[str, Any]]] = None
                 ) -> None:
        # Deliberately no super().__init__: param_groups and state are the inner optimizer's.
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("PeriodicSync wraps a torch.optim.Optimizer (or None, when the "
                            "script updates the parameters itself), got %r"
                            % type(optimizer).__name__)
        if not isinstance(model, torch.nn.Module):
            raise TypeError("PeriodicSync needs the nn.Module the optimizer trains, got %r"
                            % type(model).__name__)
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError("sync_every must be an integer >= 1, got %r" % (sync_every,))
        if overlap not in (False, True, "step"):
            raise ValueError("overlap must be False, True or \"step\", got %r" % (overlap,))
        if buffers not in BUFFERS:
            raise ValueError("buffers must be one of %s, got %r" % (", ".join(BUFFERS), buffers))
        if report_every_s is not None and not (isinstance(report_every_s, (int, float))
                                               and report_every_s >= 0):
            raise ValueError("report_every_s must be None or a number of seconds >= 0, got %r"
                             % (report_every_s,))
        if evaluate is not None and not callable(evaluate):
            raise TypeError("evaluate must be a function evaluate(model) -> dict of metrics, "
                            "got %r" % (evaluate,))
        # the workers the default elastic force is for: the job's; on an elastic node, its
        # own (its centre's, as before node slots numbered every slot's workers)
        workers = (worker.num_workers or 1) if worker.elastic_node is not None \
            else worker.global_size
        if rule is None and worker.num_workers == 1 and workers == 1:
            # a job of one worker (a script run alone, -n 1): train as the plain script
            rule = ASGD()
        elif rule is None:
            rule = EASGD(min(0.9 / max(workers, 1), 1.0))
        if not isinstance(rule, ParamSyncRule):
            raise TypeError("rule must be a platoon.ParamSyncRule (such as EASGD(0.45)), got %r"
                            % (rule,))
        if overlap and not (rule.supports_async and rule.elementwise):
            raise TypeError("overlap=%r needs a rule that supports start_sync() (EASGD, ASGD, "
                            "Downpour(SGD(...))); %r does not: use overlap=False"
                            % (overlap, rule))
        self.optimizer = optimizer
        self.worker = worker
        self.model = model
        self.sync_every = sync_every
        self.overlap = "step" if overlap == "step" else bool(overlap)
        self.buffers = buffers
        self.rule = rule
        self.steps = 0  # step() calls so far
        self.batches: Optional[int] = None  # batches trained, once `count_batches` is called
        self.report_every_s = report_every_s
        self.evaluate = evaluate
        self.final_result: Optional[Dict[str, Any]] = None  # on the worker that evaluated
        self._loss: Any = None  # the latest loss given (a detached tensor or a number)
        self._reported_done = 0  # steps, or batches once counted, in the reports so far
        self._reported_at = time.monotonic()
        self._finished = False
        self._handle: Optional[SyncHandle] = None
        self._centre_in = False  # inside `with centre():`
        self._names, tensors = _shared_tensors(model, buffers)
        self._slots = _slots(model, self._names, tensors)
        if optimizer is not None:
            _warn_unshared(optimizer, model)
        worker.init_shared_params(tensors, rule, names=self._names)
        if start_together:
            worker.start_together()
        # overlap="step" syncs the live parameters when only `step()` writes what is shared.
        params = {id(p) for p in model.parameters()}
        self._in_place = self.overlap == "step" and optimizer is not None \
            and all(id(t) in params for t in tensors)
        log.info("worker %s: PeriodicSync of %d tensors every %d steps, %r%s", worker.worker_id,
                 len(tensors), sync_every, rule, ", overlapped" if self.overlap is True
                 else ", overlapped with the next step" if self.overlap == "step" else "")

    # -- the optimizer --

    # Properties, not copies: the wrapped optimizer's load_state_dict replaces its lists.
    param_groups = _delegated("param_groups", "The wrapped optimizer's parameter groups "
                              "(learning rates and the rest).")
    defaults = _delegated("defaults", "The wrapped optimizer's defaults.")
    state = _delegated("state", "The wrapped optimizer's state.")

    def _wrapped(self, name):
        if self.optimizer is None:
            raise AttributeError(
                "this PeriodicSync wraps no optimizer, so it has no %s: the script updates "
                "the parameters itself, with its own learning rate" % name)
        return self.optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, *, loss: Any = None) -> Any:
        """The wrapped optimizer's step (returns its result); then, every `sync_every`-th
        call, a sync with the centre (started in the background with `overlap`, after
        finishing the previous one; with ``overlap="step"`` a sync in flight is finished
        first, before the optimizer's step). Without an optimizer, call it after the script's own
        update: it only counts and syncs (and returns `closure()`'s result, if given).
        `loss` (a tensor or a number), if given, is the progress reports' ``loss`` (as
        `report_loss`). Raises PlatoonError inside ``with centre():``."""
        self._refuse_in_centre("step")
        if self.overlap == "step" and self._handle is not None:
            with self._naming_changes():
                self._finish()  # before the optimizer writes the parameters
        if self.optimizer is None:
            result = None if closure is None else closure()
        else:
            result = self.optimizer.step() if closure is None else self.optimizer.step(closure)
        self.steps += 1
        if self.steps % self.sync_every == 0:
            with self._naming_changes():
                if self.overlap:
                    self._finish()
                    self._handle = self.worker.start_sync(snapshot=not self._in_place)
                else:
                    self.worker.sync_params()
        if loss is not None:
            self.report_loss(loss)
        self._report_progress()
        return result

    def count_batches(self, n: int = 1) -> None:
        """`n` more batches trained (micro-batches under gradient accumulation, where a step
        takes several): from the first call on, the progress reports count these as the
        minibatches trained instead of the steps. A script whose step takes one batch need
        not call it."""
        if self.batches is None:  # the steps reported so far were one batch each
            self.batches = self._reported_done
        self.batches += n

    def report_loss(self, loss: Any) -> None:
        """The loss the next progress report carries (a tensor, read only when reported,
        or a number)."""
        self._loss = loss.detach() if isinstance(loss, torch.Tensor) else loss

    def _report_progress(self, force: bool = False) -> None:
        """Report steps (and the loss) to the controller, at most every `report_every_s`."""
        now = time.monotonic()
        if self.report_every_s is None or self.worker.worker_id is None or not (
                force or now - self._reported_at >= self.report_every_s):
            return
        metrics: Dict[str, Any] = {"steps": self.steps}
        if self._loss is not None:
            metrics["loss"] = float(self._loss)
        done = self.steps if self.batches is None else self.batches
        self.worker.report(max(0, done - self._reported_done), **metrics)
        self._reported_done, self._reported_at = done, now

    def finish(self) -> Optional[Dict[str, Any]]:
        """End of training: finish a sync in flight, report the progress, and, with
        `evaluate`, take part in the job's final evaluation (``Worker.final_evaluation``):
        the last worker of the job to finish evaluates the final centre (after every
        worker's last sync) and reports it; returns its metrics there, None elsewhere.
        Once: later calls return the same. Leaving the ``with`` block calls it."""
        if self._finished:
            return self.final_result
        self.wait()
        self._report_progress(force=True)
        self._finished = True
        evaluate = self.evaluate
        if evaluate is not None:
            self.final_result = self.worker.final_evaluation(
                lambda: self.on_centre(evaluate, self.model))
        return self.final_result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's zero_grad; without one, the model's."""
        if self.optimizer is None:
            self.model.zero_grad(set_to_none=set_to_none)
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Adds to the wrapped optimizer; only the model's tensors shared at construction
        are synced."""
        self._wrapped("param groups to add to").add_param_group(param_group)

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state dict (without one, an empty one), with this
        wrapper's step count (``"platoon_steps"``) so a resumed run keeps its sync phase
        and its learning-rate schedule. Save it with the model's own weights and the
        scheduler's state; see docs/porting-a-script.md, "Resuming"."""
        state = {} if self.optimizer is None else self.optimizer.state_dict()
        state["platoon_steps"] = self.steps
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load into the wrapped optimizer (a plain optimizer's state dict works too).
        Without an optimizer only ``"platoon_steps"`` is taken; ValueError for a state
        dict that holds an optimizer's state."""
        state_dict = dict(state_dict)
        steps = int(state_dict.pop("platoon_steps", self.steps))
        if self.optimizer is None:
            if state_dict:
                raise ValueError("this PeriodicSync wraps no optimizer, and the state dict "
                                 "holds an optimizer's (%s): load it into that optimizer"
                                 % ", ".join(sorted(map(str, state_dict))))
        else:
            self.optimizer.load_state_dict(state_dict)
        if self.batches is None:  # the resumed steps were trained by another run: not this
            self._reported_done += steps - self.steps  # one's minibatches
        self.steps = steps

    def __repr__(self) -> str:
        return "PeriodicSync(%r, sync_every=%d, rule=%r, overlap=%r, buffers=%r)" % (
            self.optimizer, self.sync_every, self.rule, self.overlap, self.buffers)

    def __getstate__(self):
        raise TypeError("a PeriodicSync holds a live worker and cannot be pickled; save its "
                        "state_dict() instead")

    # -- syncing --

    @property
    def in_flight(self) -> bool:
        """True while an overlapped sync has started and `wait` has not finished it."""
        return self._handle is not None

    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Finish the overlapped sync in flight, if any: its effect reaches the model.

        `timeout_s` in seconds (None: forever); raises SyncTimeout if it is still
        running then (call again), or the sync's own error; LayoutMismatch naming a shared
        tensor whose dtype, shape or device changed, or that the model replaced.
        """
        if self._handle is None:
            return
        with self._naming_changes():
            self._finish(timeout_s)

    def _finish(self, timeout_s=None):
        handle = self._handle
        if handle is not None:
            handle.wait(timeout_s)
            self._handle = None

    def sync(self) -> None:
        """Sync now, whatever the step count: finish a sync in flight, then sync in place
        (at the end of training, say). Does not change the sync period's phase."""
        self._refuse_in_centre("sync")
        with self._naming_changes():
            self._finish()
            self.worker.sync_params()

    def centre_state_dict(self, timeout_s: Optional[float] = _WORKERS
                          ) -> Dict[str, "torch.Tensor"]:
        """A state dict of the centre model, for ``model.load_state_dict(..., strict=True)``.

        The shared tensors come from one consistent snapshot of the centre
        (`Worker.snapshot_centre`, taken under its whole lock, waiting at most
        `timeout_s` seconds: default the worker's timeout, None forever), as tensors of the
        model's dtypes on its devices; the rest (excluded buffers, integer
        buffers) are copies of this worker's. A sync of this worker in flight is
        in the centre as far as it has gone. Raises LockTimeout.
        """
        arrays = self.worker.snapshot_centre() if timeout_s is _WORKERS \
            else self.worker.snapshot_centre(timeout_s)
        centre = dict(zip(self._names, arrays))
        state = self.model.state_dict(keep_vars=False)
        out = {}
        for key, value in state.items():
            if key in centre:
                out[key] = torch.from_numpy(centre[key]).to(device=value.device,
                                                            dtype=value.dtype)
            elif isinstance(value, torch.Tensor):
                out[key] = value.detach().clone()
            else:
                out[key] = value
        return out

    def on_centre(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the centre in the model (``with centre():`` as a
        call, for a lambda or a hook): ``val = sync.on_centre(evaluate, model, data)``.
        Returns what `fn` returns; raises as `centre`."""
        with self.centre():
            return fn(*args, **kwargs)

    @contextlib.contextmanager
    def centre(self, timeout_s: Optional[float] = _WORKERS) -> Iterator["torch.nn.Module"]:
        """Within the block the model holds the centre; on leaving it, its own values again.

        ``with sync.centre(): val_loss = evaluate(model, data)`` evaluates the centre
        model without losing this worker's weights. On entry, a sync in flight is
        finished (`wait`), then the shared tensors take the values of one consistent
        snapshot of the centre (as `centre_state_dict`; what is not shared stays this
        worker's). On leaving, also through an exception, every tensor of the model's
        state dict gets back, bit for bit, the value it had on entry, whatever the
        block did to it. Yields the model. `step()` and `sync()` inside the block raise
        PlatoonError: a sync would push the centre's values as this worker's own.
        Raises LockTimeout (after `timeout_s` seconds, default the worker's timeout),
        and as `wait`.
        """
        self.wait()
        self._check_shared()  # the model still holds the tensors it shared
        centre = self.centre_state_dict(timeout_s)
        own = {key: value for key, value in self.model.state_dict(keep_vars=True).items()
               if isinstance(value, torch.Tensor)}
        saved = {key: value.detach().clone() for key, value in own.items()}
        outer, self._centre_in = self._centre_in, True
        try:
            with torch.no_grad():
                for key in self._names:
                    own[key].copy_(centre[key])
            yield self.model
        finally:
            with torch.no_grad():
                for key, value in own.items():
                    value.copy_(saved[key])
            self._centre_in = outer

    def _refuse_in_centre(self, what):
        if self._centre_in:
            raise PlatoonError("%s() inside `with centre():` would train the centre's values "
                               "and push them as this worker's own: call it after the block"
                               % what)

    @property
    def shared_names(self) -> List[str]:
        """The state-dict keys of the tensors shared through the centre, in its order."""
        return list(self._names)

    def _check_shared(self):
        """Raise LayoutMismatch for a shared tensor the model no longer holds, or whose dtype,
        shape or device changed; put back one the model replaced by a tensor of its layout."""
        for name, (table, leaf, tensor, layout) in zip(self._names, self._slots):
            now = table.get(leaf)
            if now is tensor:
                continue
            if isinstance(now, torch.Tensor) and (now.dtype, now.shape, now.device) != layout:
                raise layout_changed("the model's %r" % name, describe_layout(*layout), now)
            if isinstance(now, torch.Tensor) and (tensor.dtype, tensor.shape, tensor.device) \
                    == layout and now.is_contiguous():
                self._put_back(name, table, leaf, tensor, now)
                continue
            raise LayoutMismatch(
                "the model's %r is no longer the tensor PeriodicSync shared: it now holds %s, "
                "so it would no longer be synced. Give it back a tensor of the shared dtype, "
                "shape and device (or update it in place: copy_(), zero_()), and convert or "
                "move the model before PeriodicSync" % (name, type(now).__name__))

    def _put_back(self, name, table, leaf, tensor, now):
        """The model replaced shared tensor `tensor` by `now`, of the same layout (a buffer
        after ``model.double()`` then ``model.float()``): `tensor` takes `now`'s values and
        its place again (in the optimizer too), so it keeps syncing."""
        self._finish()  # a sync in flight lands in `tensor` first
        with torch.no_grad():
            tensor.copy_(now)
        table[leaf] = tensor
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["params"] = [tensor if p is now else p for p in group["params"]]
            if now in self.optimizer.state:
                self.optimizer.state[tensor] = self.optimizer.state.pop(now)
        log.info("worker %s: the model's %r was replaced by a tensor of its dtype, shape and "
                 "device; its values are synced through the shared tensor again",
                 self.worker.worker_id, name)

    @contextlib.contextmanager
    def _naming_changes(self):
        """Around a sync: refuse a shared tensor the model no longer holds (a buffer that
        model.double() replaced, say), and name the tensor when the worker refuses one whose
        dtype, shape or device changed. (One torch moved in memory is followed by the worker.)"""
        self._check_shared()
        try:
            yield
        except LayoutMismatch as exc:
            for name, (_, _, tensor, layout) in zip(self._names, self._slots):
                if (tensor.dtype, tensor.shape, tensor.device) != layout:
                    raise layout_changed("the model's %r" % name, describe_layout(*layout),
                                         tensor) from exc
            raise

    # -- context manager --

    def __enter__(self) -> "PeriodicSync":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()


def _shared_tensors(model, buffers):
    """(state-dict keys, tensors) that go through the centre: every parameter, then the
    floating-point persistent buffers when `buffers` is "sync"."""
    state_keys = set(model.state_dict(keep_vars=True))
    names, tensors, seen = [], [], set()
    for name, p in model.named_parameters():
        names.append(name)
        tensors.append(p)
        seen.add(id(p))
    if buffers == "sync":
        for name, b in model.named_buffers():
            # Non-persistent buffers are not model state (not in state_dict): left alone.
            if name in state_keys and b.is_floating_point() and id(b) not in seen:
                names.append(name)
                tensors.append(b)
                seen.add(id(b))
    if not tensors:
        raise ValueError("the model has no parameters to sync")
    return names, tensors


def _slots(model, names, tensors):
    """(the parameter or buffer dict holding it, key, tensor, (dtype, shape, device)) per
    shared tensor."""
    slots = []
    for name, tensor in zip(names, tensors):
        prefix, _, leaf = name.rpartition(".")
        owner = model.get_submodule(prefix)
        table = owner._parameters if leaf in owner._parameters else owner._buffers  # noqa: SLF001 (torch)
        slots.append((table, leaf, tensor, (tensor.dtype, tensor.shape, tensor.device)))
    return slots


def _warn_unshared(optimizer, model):
    shared = {id(p) for p in model.parameters()}
    outside = sum(1 for group in optimizer.param_groups for p in group["params"]
                  if id(p) not in shared)
    if outside:
        warnings.warn("the optimizer steps %d tensor(s) that are not parameters of the model; "
                      "PeriodicSync syncs only the model's" % outside, stacklevel=3)


__all__ = ["PeriodicSync", "BUFFERS"]
