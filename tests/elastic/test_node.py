"""python -m platoon.elastic.node, real processes on 127.0.0.1: nodes (controller and worker)
stopped and continued, and joiners refused at the door."""

import contextlib
import os
import re
import signal

import numpy as np

from elastic_helpers import SLACK_S, _c_is_dropped_and_rejoins_repaired, quorum_of


def test_a_stopped_node_is_dropped_the_others_go_on_and_it_rejoins_repaired(job, tmp_path):
    """Node c (controller and worker) is stopped past the heartbeat timeout: a and b go on in
    a quorum of two once their round has timed out (--tie-timeout-s 3); continued, c rejoins,
    its stale anchor is repaired from a peer, and the three end on one saved centre."""
    lighthouse = job.lighthouse(min_nodes=2)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"))
             for name in ("a", "b", "c")}
    _c_is_dropped_and_rejoins_repaired(
        lighthouse, nodes, stop, tmp_path, lambda: os.killpg(nodes["c"].pid, signal.SIGSTOP),
        lambda: os.killpg(nodes["c"].pid, signal.SIGCONT))


def test_joiners_with_another_codec_or_model_are_refused_alone_and_the_others_end_on_one_centre(
        job, tmp_path):
    """Nodes a and b train (int8, DiLoCo); c joins with --tie-compress int4 and d with another
    model (512 features where the job has 256). Each is refused at the door of its first round,
    before any payload travels (no gloo abort: the others' processes live on): it ends alone
    (exit 3, naming the setting); a and b drop that round, go on between themselves, and end on
    one saved, finite centre. Given their slots (0 and 1 of 2), a's and b's workers each shard
    the data their own part; c's, started without one, are refused a shard, saying why. Each
    node's worker was forked once its node imported torch, and found it loaded
    (`platoon.node.prefork`); d's, with PLATOON_PREFORK=0, was started as a new process."""
    from platoon import load_centre
    lighthouse = job.lighthouse(min_nodes=2)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              node_args=["--slot", slot, "--slots", 2])
             for slot, name in enumerate(("a", "b"))}
    shards = [set(nodes[n].wait_for_match(r".* SHARD ([\d ]+)$", 30)[0].group(1).split())
              for n in "ab"]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(map(str, range(12)))
    nodes["a"].wait_for_match(r".* WARNING: node a: first contributing round", 30)
    _, index = quorum_of(lighthouse, ["a", "b"])
    codec = job.runner("c", 60, stop, node_args=["--tie-compress", "int4"])
    model = job.runner("d", 60, stop, 512, node_env={"PLATOON_PREFORK": "0"})
    codec.wait_for_match(r".* SHARD refused: shard\(items, w\): worker 0 is on elastic node c, "
                         r"started without --slot I --slots N", 30)
    assert codec.wait(30) == 3, codec.output  # EXIT_REFUSED: the launcher does not restart it
    assert "node c is refused by the job's other nodes" in codec.output
    assert re.search(r"its --tie-compress int4 where a, b(, d)? have int8", codec.output)
    assert model.wait(30) == 3, model.output
    for node in (nodes["a"], nodes["b"], codec):
        assert "TORCH LOADED True" in node.output, node.output
    assert "TORCH LOADED False" in model.output, model.output
    assert re.search(r"node d is refused by the job's other nodes \(quorum \d+: a, b(, c)?, d\): "
                     r"its model differs from the job's: its centre holds 1 array\(s\): 512 "
                     r"float32, where a, b(, c)? hold 1 array\(s\): 256 float32", model.output)
    for n in ("a", "b"):
        nodes[n].wait_for_match(r".* refused at the door", 10)
        nodes[n].wait_for_match(r".* WARNING: node %s: outer rounds go on in quorum \d+ "
                                r"\(a, b\)" % n, 10 + SLACK_S)
    stop.write_text("")
    for node in nodes.values():
        assert node.wait(30) == 0, node.output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "ab"]
    assert np.array_equal(centres[0], centres[1]) and np.isfinite(centres[0]).all()


_PORTS_WORKER = (
    "import os, sys; open(sys.argv[1], 'a').close()\n"
    "print('ENV', os.environ.get('PLATOON_CONTROL_PORT'), 'PLATOON_PORTS_FD' in os.environ,\n"
    "      flush=True)\n"
    "from platoon._worker.ports import await_ports\n"
    "env = await_ports(30)\n"
    "print('PORTS', env.control_port, env.data_port, 'PLATOON_PORTS_FD' in os.environ,\n"
    "      os.environ.get('PLATOON_DATA_PORT'), flush=True)\n")


@contextlib.contextmanager
def _node_workers(tmp_path, failures):
    """A node runner's Workers (one worker running `_PORTS_WORKER`), its controller's
    announcement pipe's write end (a file: closing it is the controller dying) and the file
    the worker makes as it starts; the pipes are closed as the block ends."""
    import sys

    from platoon.node.runner import Workers

    from helpers import ROOT
    started = tmp_path / "started"
    started.unlink(missing_ok=True)
    ready_fd, announce_fd = os.pipe()
    reaper_r, reaper_w = os.pipe()  # what the reaper would read: pids, unread here
    announce = os.fdopen(announce_fd, "wb", buffering=0)
    try:
        workers = Workers([sys.executable, "-c", _PORTS_WORKER, str(started)], 1, "127.0.0.1",
                          ready_fd, reaper_w, failures.append, 30.0,
                          dict(os.environ, PYTHONPATH=ROOT, PLATOON_CONTROL_PORT="9"), 1,
                          "node-t")
        yield workers, announce, started
    finally:
        announce.close()
        os.close(reaper_r)
        os.close(reaper_w)


def _announce(announce, control_port, data_port=None):
    import json
    announce.write(json.dumps({"control_port": control_port, "data_port": data_port}).encode()
                   + b"\n")


def test_a_nodes_workers_start_while_its_controller_starts_and_get_its_ports_once_it_serves(
        tmp_path, capfd, monkeypatch):
    """A node runner starts its workers at once, not once its controller serves (their
    imports, data and model overlap its start-up), with the ports it holds for the controller
    in their environment (PLATOON_CONTROL_PORT, for a script that reads it itself) and in its
    own (the controller binds them); `Worker()` waits (`await_ports`) for the ports the
    controller announces, which the runner hands over when it serves. A controller that
    listens elsewhere has its workers started again with its ports; one that never serves
    fails the node."""
    from helpers import wait_until
    monkeypatch.setenv("PLATOON_CONTROL_PORT", "0")  # as a node runner sets it
    failures = []
    with _node_workers(tmp_path, failures) as (workers, announce, started):
        held = workers.ports["control_port"]
        assert os.environ["PLATOON_CONTROL_PORT"] == str(held) != "9"  # for its controller
        wait_until(started.exists, 20, "the worker to start before its controller serves")
        assert not workers.started.is_set()
        _announce(announce, held)  # (no data port opened)
        assert workers.finished.wait(30)
        assert workers.procs[0].wait(10) == 0 and failures == []
        workers.drain()  # its last lines relayed (as a node does before it ends)
        out = capfd.readouterr().out
        assert "ENV %d True" % held in out
        assert "PORTS %d None False None" % held in out  # the held data port dropped

    failures = []
    with _node_workers(tmp_path, failures) as (workers, announce, started):
        wait_until(started.exists, 20, "the worker to start before its controller serves")
        _announce(announce, 4321, 4322)  # its script chose its own ports
        assert workers.finished.wait(30)
        assert [p.returncode for p in workers.procs] == [0] and failures == []
        workers.drain()
        out = capfd.readouterr().out
        # the first worker stopped as it waited; started again with the controller's ports
        assert "ENV 4321 False" in out and out.count("PORTS") == 1, out
        assert "PORTS 4321 4322 False 4322" in out

    failures = []
    with _node_workers(tmp_path, failures) as (workers, announce, started):
        wait_until(started.exists, 20, "the worker to start before its controller serves")
        announce.close()  # the controller died before it served
        assert workers.finished.wait(30)
        assert workers.procs[0].wait(10) != 0  # ended with its runner's thread
        assert "did not start serving" in failures[0]


def test_a_worker_waiting_for_its_ports_is_told_when_its_controller_never_serves(monkeypatch):
    """`await_ports`: the runner's pipe closed before any ports came is ControllerGone, no
    ports within the timeout ControllerTimeout, each saying what to do."""
    import pytest

    from platoon._worker.ports import await_ports
    from platoon.errors import ControllerGone, ControllerTimeout
    monkeypatch.delenv("PLATOON_CONTROL_PORT", raising=False)
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    monkeypatch.setenv("PLATOON_PORTS_FD", str(read_fd))
    with pytest.raises(ControllerGone, match="controller failed to start: see the node's log"):
        await_ports(10)
    read_fd, write_fd = os.pipe()
    monkeypatch.setenv("PLATOON_PORTS_FD", str(read_fd))
    try:
        with pytest.raises(ControllerTimeout, match="give the worker a longer timeout_s"):
            await_ports(0.1)
    finally:
        os.close(write_fd)
    assert "PLATOON_PORTS_FD" not in os.environ
