"""A centre tie's outer rule: what a round does with the members' mean move (`OuterRule`):
DiLoCo's outer Nesterov step on the anchor, or hierarchical EASGD (the anchor is the members'
mean centre, toward which each centre moves by beta), or a user's own."""

import importlib
from typing import Protocol

import numpy as np

from .._os.nodesettings import CentreTie
from ..errors import PlatoonError
from ..rules.diloco import DiLoCo


def outer_step(anchor: np.ndarray, velocity: np.ndarray, mean_moved: np.ndarray, lr: float,
               mu: float) -> None:
    """DiLoCo's outer SGD step with Nesterov momentum `mu` and learning rate `lr` on
    `anchor`, in place (`velocity` too): ``u = mu*u + d; anchor += lr * (d + mu*u)``, d the
    nodes' mean move (-gradient). lr 1, momentum 0: the new anchor is the mean. The rule's
    own step (`DiLoCo.synchronous_step`), not a copy of it."""
    DiLoCo(lr, mu).synchronous_step(anchor, velocity, mean_moved)


class OuterRule(Protocol):
    """What a tie does with a round's mean move: `step` makes the new anchor from it, in place
    (`velocity`: this rule's state, one array per anchor array, the same bits on every member);
    `moves_centres` says whether each training member's centre then moves toward the anchor by
    `move_centre` (EASGD) or becomes the anchor plus its workers' later syncs (DiLoCo). A user's
    own rule may stand here (``--tie-outer MODULE:FACTORY``, ``FACTORY(tie)`` making it on every
    node; or `NodeTie`'s `outer`), if every member runs it alike: its step must be a pure
    function of its arguments (the anchors stay the same bits on every member)."""

    @property
    def moves_centres(self) -> bool: ...

    def step(self, anchor: np.ndarray, velocity: np.ndarray, mean_moved: np.ndarray) -> None: ...

    def move_centre(self, centre: np.ndarray, snapshot: np.ndarray,
                    anchor: np.ndarray) -> None: ...

    def describe(self) -> str: ...


class DiLoCoOuter:
    """DiLoCo's outer Nesterov step (`outer_step`) on the anchor."""

    moves_centres = False

    def __init__(self, lr: float, momentum: float):
        self.lr, self.momentum = lr, momentum

    def step(self, anchor: np.ndarray, velocity: np.ndarray, mean_moved: np.ndarray) -> None:
        outer_step(anchor, velocity, mean_moved, self.lr, self.momentum)

    def move_centre(self, centre: np.ndarray, snapshot: np.ndarray,
                    anchor: np.ndarray) -> None:
        raise AssertionError("DiLoCo's centres become the anchor")  # pragma: no cover

    def describe(self) -> str:
        return "DiLoCo lr %g, momentum %g" % (self.lr, self.momentum)


class EASGDOuter:
    """Hierarchical EASGD: the anchor is the members' mean centre, and each training member's
    centre moves toward it by `beta` from its snapshot."""

    moves_centres = True

    def __init__(self, beta: float):
        self.beta = beta

    def step(self, anchor: np.ndarray, velocity: np.ndarray, mean_moved: np.ndarray) -> None:
        anchor += mean_moved

    def move_centre(self, centre: np.ndarray, snapshot: np.ndarray,
                    anchor: np.ndarray) -> None:
        move = anchor - snapshot
        move *= self.beta
        centre += move

    def describe(self) -> str:
        return "EASGD beta %g" % self.beta


def outer_rule(tie: CentreTie) -> OuterRule:
    """The outer rule `tie` names (``--tie-outer``): DiLoCo's, EASGD's, or a user's own,
    ``MODULE:FACTORY``, made by ``FACTORY(tie)``. Raises PlatoonError when the module cannot be
    imported or the factory's rule lacks what a tie calls."""
    if tie.outer == "diloco":
        return DiLoCoOuter(tie.outer_lr, tie.outer_momentum)
    if tie.outer == "easgd":
        return EASGDOuter(tie.beta)
    module_name, _, factory_name = tie.outer.partition(":")
    where = "--tie-outer %s" % tie.outer
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise PlatoonError("%s: %s (%s: %s); the module must be importable on every node (its "
                           "folder on PYTHONPATH, or installed)" % (
                               where, "cannot import %s" % module_name
                               if isinstance(exc, ImportError) else "%s has no %s" % (
                                   module_name, factory_name), type(exc).__name__, exc)) from exc
    rule: OuterRule = factory(tie)
    missing = [name for name in ("moves_centres", "step", "move_centre", "describe")
               if not hasattr(rule, name)]
    if missing:
        raise PlatoonError("%s: %s(tie) gave %r, which has no %s: an outer rule has "
                           "moves_centres, step, move_centre and describe (see "
                           "platoon.node.outer.OuterRule)" % (where, factory_name, rule,
                                                              ", ".join(missing)))
    return rule
