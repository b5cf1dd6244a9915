"""Settings of multi-node jobs that need no MPI: tie configuration, controller loading."""

import os
import re

import pytest

from conftest import PROCS
from platoon import Controller, PlatoonError
from platoon.mpi import CentreTie, load_controller_class


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


def test_a_node_places_its_workers_on_its_gpus_as_the_launcher_does(monkeypatch):
    """GPU discovery is platoon.device's, shared by the launcher and the node runner (which no
    longer imports the launcher's command line for it)."""
    from platoon import device
    from platoon.launch import cli
    from platoon.mpi.runner import node_devices
    monkeypatch.setenv("PLATOON_ASSUME_GPUS", "0,1")
    assert node_devices(3) == ["cuda0", "cuda1", "cuda0"] == device.in_turn(3, ["0", "1"])
    assert cli.plan_devices(cli.parse_args(["-n", "3", "train.py"]), print) == node_devices(3)
    monkeypatch.setenv("PLATOON_ASSUME_GPUS", "-1")
    assert node_devices(2) == ["cpu", "cpu"]
    monkeypatch.setenv("PLATOON_ASSUME_GPUS", "MIG-4b1c2a3e")
    with pytest.raises(device.VisibleDevicesError, match="names a MIG instance"):
        device.find_gpus()
    with pytest.raises(cli.UsageError, match="names a MIG instance"):
        cli.find_gpus()
