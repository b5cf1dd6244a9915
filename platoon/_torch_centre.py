"""The centre runs the workers' Adam or AdamW: `PeriodicSync`'s default for those optimizers.

Each worker's gradients (the mean over `sync_every` steps) go to one Adam at the centre
(``Downpour(platoon.Adam(...))``: its moments and step counts in shared memory, one lock
around the centre), which takes a step with each worker's gradient in turn; the worker
then takes the centre. So p workers take p optimizer steps for each step of one, with
one set of moments, as one process would: not p separate Adams whose steps are summed
(as ASGD does: a doubled learning rate) or averaged (as EASGD and model averaging do:
the noise of one worker's gradient stays in each Adam's second moment). The torch
optimizer's settings are copied to the centre's before each push, per parameter group,
so learning-rate schedules and groups without weight decay keep working.
"""

from typing import Dict, List, Optional

import torch

from .rules.downpour import Adam, Downpour

STATE_NAME = "periodic-adam"  # the centre optimizer's shared state (Controller.shared_states)


def centre_adam_for(optimizer: Optional["torch.optim.Optimizer"]) -> Optional[str]:
    """Why the centre cannot run `optimizer` (a sentence), or None when it can."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return "it is not torch.optim.Adam or AdamW"
    groups = optimizer.param_groups  # type: ignore[union-attr]
    for key in ("betas", "eps"):
        if len({repr(g[key]) for g in groups}) > 1:
            return "its parameter groups have different %s" % key
    for key in ("amsgrad", "maximize"):
        if any(g.get(key) for g in groups):
            return "it has %s=True" % key
    if any(isinstance(g["lr"], torch.Tensor) for g in groups):
        return "its lr is a tensor"
    return None


class CentreAdam:
    """The push side: accumulates each step's gradients and, every `sync_every` steps, moves
    the shared tensors by the mean gradient (so that Downpour's ``x_last - x`` is it),
    copies the optimizer's per-group settings to the centre's Adam and syncs."""

    def __init__(self, optimizer: "torch.optim.Optimizer", names: List[str],
                 tensors: List["torch.Tensor"]):
        group = optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        self.optimizer = optimizer
        self.decoupled = type(optimizer) is torch.optim.AdamW
        # lr: the group's before any schedule (a warm-up may start at 0); each push then
        # takes every group's lr of the moment (`prepare_push`)
        lr = float(group.get("initial_lr", group["lr"])) or 1e-3
        self.adam = Adam(lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"])
        self.rule = Downpour(self.adam, state_name=STATE_NAME)
        group_of: Dict[int, dict] = {id(p): g for g in optimizer.param_groups
                                     for p in g["params"]}
        # per shared tensor: its parameter group, or None for a buffer
        self._groups = [group_of.get(id(t)) for t in tensors]
        self._tensors = tensors
        self._names = names
        self._sums: List[Optional[torch.Tensor]] = [None] * len(tensors)
        self._steps = 0

    def add_gradients(self) -> None:
        """Add this step's gradients to the sums (in place of the optimizer's step)."""
        with torch.no_grad():
            for i, (t, group) in enumerate(zip(self._tensors, self._groups)):
                if group is None or t.grad is None:
                    continue
                if self._sums[i] is None:
                    self._sums[i] = t.grad.detach().clone()
                else:
                    self._sums[i].add_(t.grad)  # type: ignore[union-attr]
        self._steps += 1

    def prepare_push(self) -> None:
        """Move each parameter by its mean gradient (to be pushed) and give the centre's Adam
        each parameter's settings; a parameter without a gradient is left as it is."""
        settings: List[Optional[dict]] = []
        with torch.no_grad():
            for i, (t, group) in enumerate(zip(self._tensors, self._groups)):
                grad = self._sums[i]
                if group is None or grad is None:
                    settings.append(None)  # a buffer's change, or no change, as it is
                    continue
                grad.div_(max(self._steps, 1))
                decay = float(group["weight_decay"])
                if decay and not self.decoupled:  # Adam's L2 penalty: in the gradient
                    grad.add_(t.detach(), alpha=decay)
                t.sub_(grad)
                settings.append({"lr": float(group["lr"]),
                                 "weight_decay": decay if self.decoupled else 0.0})
                self._sums[i] = None
        self._steps = 0
        self.adam.per_parameter = settings
