"""Settings of multi-node jobs that need no MPI: tie configuration, controller loading."""

import os
import re

import pytest

from platoon import Controller, PlatoonError
from platoon.mpi import CentreTie, load_controller_class

from helpers import PROCS


def test_centre_tie_validates_its_settings():
    assert CentreTie(every_s=None, every_syncs=4).every_syncs == 4
    with pytest.raises(ValueError, match="needs every_s .* or every_syncs"):
        CentreTie(every_s=None)
    with pytest.raises(ValueError, match="beta must be in"):
        CentreTie(beta=0)
    with pytest.raises(ValueError, match="every_syncs must be an integer >= 1"):
        CentreTie(every_syncs=0)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -1, 1e300, "1"])
def test_centre_tie_refuses_a_period_it_cannot_wait(value):
    """every_s=inf killed every tie thread with OverflowError (Event.wait(inf))."""
    refused = r"^CentreTie every_s must be .*got %s" % re.escape(repr(value))
    with pytest.raises(ValueError, match=refused):
        CentreTie(every_s=value)
    tie = CentreTie(every_s=2.0)
    with pytest.raises(ValueError, match=refused):
        tie.every_s = value  # changed at run time: checked again
    assert tie.every_s == 2.0
    tie.every_s = 0.5
    assert tie.every_s == 0.5


def test_controller_class_from_module_or_file():
    assert load_controller_class(None) is Controller
    assert load_controller_class("platoon:Controller") is Controller
    cls = load_controller_class(os.path.join(PROCS, "step_controller.py") + ":StepController")
    assert issubclass(cls, Controller) and cls.__name__ == "StepController"
    with pytest.raises(PlatoonError, match="module:Class or path/file.py:Class"):
        load_controller_class("platoon")
    with pytest.raises(PlatoonError, match="cannot load controller 'platoon:Nope'"):
        load_controller_class("platoon:Nope")
