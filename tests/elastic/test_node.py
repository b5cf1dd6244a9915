"""python -m platoon.elastic.node, real processes on 127.0.0.1: nodes (controller and worker)
stopped and continued, and joiners refused at the door."""

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
    the data their own part; c's, started without one, are refused a shard, saying why."""
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
    model = job.runner("d", 60, stop, 512)
    codec.wait_for_match(r".* SHARD refused: shard\(items, w\): worker 0 is on elastic node c, "
                         r"started without --slot I --slots N", 30)
    assert codec.wait(30) == 3, codec.output  # EXIT_REFUSED: the launcher does not restart it
    assert "node c is refused by the job's other nodes" in codec.output
    assert re.search(r"its --tie-compress int4 where a, b(, d)? have int8", codec.output)
    assert model.wait(30) == 3, model.output
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
