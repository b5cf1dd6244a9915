"""Settings of multi-node jobs that need no MPI: tie configuration, controller loading."""

import os
import re
import sys

import pytest

from platoon import Controller, PlatoonError
from platoon.mpi import CentreTie, load_controller_class

from helpers import HERE, PROCS, assert_golden


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
    from platoon.node.runner import node_devices
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


# A --hosts job's settings cross mpiexec as one argv, made from one object (NodeSettings);
# tests/golden/mpi_node_argv.json pins it. Regenerate with WRITE_GOLDEN=1 after a deliberate
# change, and read the diff.
GOLDEN = os.path.join(HERE, "golden", "mpi_node_argv.json")
LAUNCHES = {
    "diloco tie, controller script": (
        ["train.py", "--hosts", "h1", "h2", "-n", "3", "--controller", "ctl.py", "-c",
         "--steps 5", "-w", "--lr 1", "--tie-every-s", "0.5", "--tie-compress", "int8",
         "--tie-outer", "diloco", "--tie-outer-lr", "0.5", "--finish-timeout-s", "8",
         "--", "--epochs", "2"], "ctl.py"),
    "easgd tie every 4 syncs": (["x", "--hosts", "h1", "--tie-every-syncs", "4"], None),
    "no tie": (["x", "--hosts", "h1", "h2", "--ready-timeout-s", "30"], None),
}


def _mpiexec_arguments(argv, controller):
    import dataclasses

    from platoon.launch import cli
    from platoon.launch.supervision import mpiexec_arguments
    args = cli.parse_args(argv)
    node = dataclasses.replace(args.node, controller=controller,
                               controller_args=args.controller_args if controller else "")
    return node, mpiexec_arguments(args.hosts, node, ["worker.py"] + args.worker_argv,
                                   python="PYTHON")


def test_the_node_argv_that_crosses_mpiexec_is_made_from_one_object_and_read_back_whole():
    from platoon.mpi.runner import read_node_settings
    made = {}
    for name, (argv, controller) in LAUNCHES.items():
        node, cmd = _mpiexec_arguments(argv, controller)
        made[name] = cmd
        runner_argv = cmd[cmd.index("platoon.mpi") + 1:]
        read, command = read_node_settings(runner_argv)
        assert read == node, name  # every setting arrives, defaults from the same class
        assert command == [sys.executable] + cmd[cmd.index("--") + 1:]  # a .py: this Python
    assert_golden(made, GOLDEN)


def test_a_tie_setting_is_defaulted_and_checked_in_one_place(capsys):
    """The DiLoCo outer lr's default lives in CentreTie alone: the runner's default, the
    launcher's and the elastic node's help name it; a bad value is refused by CentreTie's
    check, named by each command line's flag."""
    from platoon._os.nodesettings import NodeSettings  # noqa: PLC2701 (the settings' home)
    from platoon.launch import cli
    from platoon.mpi.runner import read_node_settings
    node, _ = read_node_settings(["--workers", "1", "--tie-every-s", "1", "--", "w.py"])
    assert node.tie.outer_lr == CentreTie.outer_lr == 0.7 and node == NodeSettings(
        1, tie=CentreTie(1.0))
    assert "(default 0.7)" in cli.make_parser().format_help()
    for argv in (["--workers", "1", "--tie-every-s", "1", "--tie-outer-lr", "11", "--", "w"],
                 ["--workers", "0", "--", "w"]):
        with pytest.raises(SystemExit):
            read_node_settings(argv)
    err = capsys.readouterr().err
    assert "--tie-outer-lr must be in (0, 10], got 11.0" in err
    assert "--workers must be an integer, at least 1; got 0" in err
    with pytest.raises(SystemExit):
        cli.parse_args(["x", "--hosts", "h", "--tie-every-s", "1", "--tie-outer", "diloco",
                        "--tie-outer-lr", "11"])
    assert "--tie-outer-lr must be in (0, 10], got 11.0" in capsys.readouterr().err
