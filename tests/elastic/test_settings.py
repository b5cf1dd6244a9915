"""An elastic job's process contracts (platoon._os.elasticsettings): the lighthouse's and each
node's command line made by `to_argv` from one settings object, as platoon-launcher --elastic
builds it, read back whole by the process's own parser, and pinned by a golden file each
(tests/golden/elastic_node_argv.json, lighthouse_argv.json; WRITE_GOLDEN=1 regenerates them
after a deliberate change: read the diff). Pure: no process is started."""

import dataclasses
import io
import os
import sys

import pytest

from platoon._os.elasticsettings import (  # noqa: PLC2701 (the settings' home)
    ElasticNodeSettings,
    LighthouseSettings,
    Limits,
    MembershipSettings,
)
from platoon._os.nodesettings import CentreTie, NodeSettings, elastic_node  # noqa: PLC2701

from helpers import HERE, assert_golden

NODE_GOLDEN = os.path.join(HERE, "golden", "elastic_node_argv.json")
LIGHTHOUSE_GOLDEN = os.path.join(HERE, "golden", "lighthouse_argv.json")
# name: (the launcher's argv, a controller script, which of its nodes (by index))
NODE_LAUNCHES = {
    "defaults": (["train.py", "--hosts", "h1", "h2", "--elastic"], None, 0),
    "float32 (CentreTie's default, not the elastic node's), controller script, slot 1 of 3": (
        ["train.py", "--hosts", "h1", "h1", "h1", "--elastic", "-n", "2", "--controller",
         "ctl.py", "-c", "--steps 5", "--tie-every-s", "0.5", "--tie-compress", "float32",
         "--tie-outer-lr", "0.5", "--tie-outer-momentum", "0.8", "--", "--epochs", "2"],
        "ctl.py", 1),
    "EASGD": (["train.py", "--hosts", "h1", "--elastic", "--tie-outer", "easgd", "--tie-beta",
               "0.25"], None, 0),
}
# name: (the launcher's argv, where the lighthouse binds, its process's label)
LIGHTHOUSE_LAUNCHES = {
    "defaults": (["train.py", "--hosts", "h1", "--elastic"], "127.0.0.1:0", "lighthouse"),
    "min nodes 2, heartbeat timeout 1 s, restarted on its port": (
        ["train.py", "--hosts", "h1", "h2", "--elastic", "--min-nodes", "2",
         "--heartbeat-timeout-s", "1"], "0.0.0.0:29510", "lighthouse.restart1"),
}


def _launch(argv, controller=None):
    """An ElasticLaunch of the launcher's `argv` (its logs in /logs), planned as `run_elastic`
    plans it: the lighthouse at lh:29510, the secret in the log directory."""
    from platoon.launch import cli
    from platoon.launch.elastic import ElasticLaunch
    args = cli.parse_args(argv[:1] + ["--log-dir", "/logs"] + argv[1:])
    launch = ElasticLaunch(args, io.StringIO())
    launch.join, launch.secret_file = "lh:29510", "/logs/elastic.secret"
    launch.node = dataclasses.replace(args.node, controller=controller,
                                      controller_args=args.controller_args if controller else "")
    launch.worker_command = ["worker.py"] + args.worker_argv
    return launch


def test_an_elastic_nodes_argv_is_made_from_one_object_and_read_back_whole():
    from platoon.elastic.node import read_arguments
    from platoon.launch.elastic import elastic_node_arguments
    made = {}
    for name, (argv, controller, index) in NODE_LAUNCHES.items():
        launch = _launch(argv, controller)
        node, host = launch.names[index], launch.args.hosts[index]
        settings = launch.node_settings(node, host, "node-" + node)
        assert settings.slot == (index, len(launch.names))
        assert settings.status_file == "/logs/node-%s.status.json" % node
        cmd = elastic_node_arguments(host, settings, launch.worker_command, python="PYTHON")
        made[name] = cmd
        read, command = read_arguments(cmd[cmd.index("platoon.elastic.node") + 1:])
        assert read == settings, name  # every setting arrives, defaults from the same class
        assert command == [sys.executable] + cmd[cmd.index("--") + 1:]
    assert_golden(made, NODE_GOLDEN)


def test_the_lighthouses_argv_is_made_from_one_object_and_read_back_whole():
    from platoon.elastic.lighthouse import read_arguments
    made = {}
    for name, (argv, bind, label) in LIGHTHOUSE_LAUNCHES.items():
        launch = _launch(argv)
        settings = launch.lighthouse_settings(bind, label)
        assert settings.membership == launch.args.membership
        assert settings.status_file == "/logs/%s.status.json" % label
        made[name] = settings.to_argv()
        assert read_arguments(made[name]) == (settings, None), name
    assert_golden(made, LIGHTHOUSE_GOLDEN)


def test_every_setting_that_is_not_its_default_crosses_the_command_line():
    """Settings the launcher never changes read back too: none is lost on the way."""
    from platoon.elastic.lighthouse import read_arguments as read_lighthouse
    from platoon.elastic.node import read_arguments as read_node
    lighthouse = LighthouseSettings(MembershipSettings(3, 1.5, 0.0), "10.0.0.1:29511", "/s",
                                    Limits(5, 2, 0.5, 100), "/st.json")
    assert read_lighthouse(lighthouse.to_argv()) == (lighthouse, None)
    assert read_lighthouse([]) == (LighthouseSettings(), None)  # its defaults, declared once
    tie = CentreTie(0.5, beta=0.2, compress="int4", outer="easgd", outer_lr=0.3,
                    outer_momentum=0.1)
    node = ElasticNodeSettings(
        "lh:1", "n", NodeSettings(3, "ctl.py", "--a 'b c'", "10.0.0.5", tie, 100.0, 9.0, 4.0),
        "/s", (2, 5), 7.0, 70.0, "/st.json")
    assert read_node(node.to_argv() + ["--", "w"])[0] == node
    bare = read_node(["--join", "lh:1", "--name", "n", "--", "w"])[0]
    assert bare == ElasticNodeSettings("lh:1", "n") and bare.node == elastic_node()
    assert bare.to_argv() == ["--join", "lh:1", "--name", "n", "--workers", "1",
                              "--tie-every-s", "3.0"]


def test_the_elastic_node_takes_the_mpi_runners_node_options_declared_once():
    """The elastic node's node options are the MPI runner's (one declaration,
    NodeSettings.add_arguments), with its own defaults in their help, and no pace in syncs."""
    import argparse

    from platoon.mpi.runner import make_parser
    runner = set(make_parser()._option_string_actions)
    node = argparse.ArgumentParser()
    ElasticNodeSettings.add_arguments(node)
    options = set(node._option_string_actions)
    assert runner - options == {"--tie-every-syncs"}
    assert options - runner == {"--join", "--name", "--secret-file", "--slot", "--slots",
                                "--tie-timeout-s", "--final-timeout-s", "--status-file"}
    text = " ".join(node.format_help().split())
    assert "(default 3.0)" in text and "default int8" in text and "default diloco" in text


@pytest.mark.parametrize("argv, said", [
    (["--tie-every-s", "40"], "--tie-timeout-s must be more than the tie's every_s (40 s)"),
    (["--tie-timeout-s", "200"], "--final-timeout-s must be more than tie_timeout_s (200 s)"),
    (["--slot", "1"], "--slot needs both --slot I and --slots N"),
    (["--slot", "3", "--slots", "2"], "--slot must be I of N node slots, 0 <= I < N"),
    (["--tie-outer-lr", "11"], "--tie-outer-lr must be in (0, 10], got 11.0"),
    (["--workers", "0"], "--workers must be an integer, at least 1; got 0"),
    (["--join", "nowhere"], "--join must be HOST:PORT, got 'nowhere'"),
])
def test_a_bad_elastic_node_setting_is_refused_naming_its_flag(argv, said, capsys):
    from platoon.elastic.node import read_arguments
    base = [] if "--join" in argv else ["--join", "lh:1"]
    with pytest.raises(SystemExit) as exits:
        read_arguments(base + ["--name", "n"] + argv + ["--", "w"])
    assert exits.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--min-nodes", "0"], "--min-nodes must be an integer >= 1, got 0"),
    (["--max-connections-per-source", "-1"],
     "--max-connections-per-source must be an integer, at least 0; got -1"),
    (["--log-period-s", "0"], "--log-period-s must be a number of seconds"),
    (["--max-heartbeats-per-s", "0"],
     "--max-heartbeats-per-s must be an integer, at least 1; got 0"),
    (["--bind", "0.0.0.0"], "--bind must be HOST:PORT (port 0 picks a free one)"),
])
def test_a_bad_lighthouse_setting_is_refused_naming_its_flag(argv, said, capsys):
    from platoon.elastic.lighthouse import read_arguments
    with pytest.raises(SystemExit) as exits:
        read_arguments(argv)
    assert exits.value.code == 2
    assert said in capsys.readouterr().err
