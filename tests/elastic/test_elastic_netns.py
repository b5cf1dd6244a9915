"""Elastic nodes on three hosts (network namespaces, as root) on a switch where the lighthouse
runs: a link cut and back, a data plane the others cannot reach."""


import numpy as np

from elastic_helpers import SWITCH_IP, _c_is_dropped_and_rejoins_repaired, quorum_of


def test_a_node_whose_link_is_cut_is_dropped_and_rejoins_when_it_is_back(job, switch,
                                                                          tmp_path):
    """Three hosts on a switch (network namespaces), the lighthouse on the switch. Host c's
    link is cut (its port down) after its first round: a and b go on in a quorum of two once
    their round has timed out; the link back, c rejoins, its stale anchor repaired, and the
    three end on one saved centre."""
    hosts, sw, cut = switch
    lighthouse = job.lighthouse(min_nodes=2, host=SWITCH_IP, netns=sw)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              host="10.219.7.%d" % index, netns=hosts[name])
             for index, name in enumerate("abc", 1)}
    _c_is_dropped_and_rejoins_repaired(lighthouse, nodes, stop, tmp_path, lambda: cut("c"),
                                       lambda: cut("c", up=True))


def test_a_node_whose_data_plane_the_others_cannot_reach_is_left_out_and_told_why(
        job, switch, tmp_path):
    """Three hosts on a switch; a gives --host 127.0.0.1 (the node's default, an address only
    it sees), yet reaches the lighthouse. As rank 0 it hosts its quorum's store, so the group
    cannot form; b and c, whose probes of a's data plane are refused, report it, and the
    lighthouse leaves a out of the next quorum and tells it why: b and c make their rounds
    between themselves and end on one centre (before, every group failed to form for as long
    as a stayed)."""
    from platoon import load_centre
    hosts, sw, _ = switch
    lighthouse = job.lighthouse(min_nodes=2, host=SWITCH_IP, netns=sw)
    stop = tmp_path / "stop"
    nodes = {name: job.runner(name, 60, stop, checkpoint=tmp_path / (name + ".npz"),
                              host="10.219.7.%d" % index if name != "a" else "127.0.0.1",
                              netns=hosts[name],
                              node_args=["--final-timeout-s", 4] if name == "a" else [])
             for index, name in enumerate("abc", 1)}
    # a's first quorum holds a and whoever came with it (b and c; only one of them when the
    # other starts late): those who probed a's data plane report it
    out, index = lighthouse.wait_for_match(
        r"lighthouse: node a is out of the quorums: its data plane at 127\.0\.0\.1:\d+ was "
        r"unreachable from (b|c|b, c):", 30 + 10)
    quorum_of(lighthouse, ["b", "c"], index + 1, timeout=10)
    for n in out.group(1).split(", "):
        nodes[n].wait_for_match(r".* WARNING: node %s: the data plane of a \(quorum \d+\) is "
                                r"unreachable from here" % n, 5)
    for n in ("b", "c"):
        nodes[n].wait_for_match(r".* WARNING: node %s: first contributing round" % n, 30)
    nodes["a"].wait_for_match(r".*node a: the lighthouse \S+ keeps this node out of the "
                              r"quorums: its data plane at 127\.0\.0\.1", 10)
    stop.write_text("")
    for n in "abc":  # a, left out, gives the final round up and keeps its own centre
        assert nodes[n].wait(30) == 0, nodes[n].output
    assert "no final round within 4 s: it kept its own centre" in nodes["a"].output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "bc"]
    assert np.array_equal(centres[0], centres[1]) and np.isfinite(centres[0]).all()
