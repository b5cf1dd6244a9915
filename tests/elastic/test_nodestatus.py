"""platoon.elastic.nodestatus: an elastic node's status file (what platoon-launcher --elastic
shows of it), in-process with a real ElasticLink (no lighthouse, no tie thread yet)."""

import os

import pytest

from helpers import wait_until


def _link():
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    return ElasticLink(1, connect=None, name="a", tie=CentreTie(1.0, outer="diloco"),
                       timeout_s=5.0, on_failure=print)


def test_a_node_writes_its_state_and_final_result_and_its_last_word_stays(tmp_path):
    from platoon._os.statusfile import read_status
    from platoon.elastic.nodestatus import NodeStatus
    path = tmp_path / "made" / "node-a.status.json"  # its folder is made
    link = _link()
    with NodeStatus(str(path), "a", link) as status:
        assert read_status(str(path)) == {
            "name": "a", "pid": os.getpid(), "state": "running", "quorum": None,
            "quorums": [], "rounds": 0, "kept_own_centre": False}
        assert os.stat(path).st_mode & 0o777 == 0o600
        link.final_result = {"metrics": {"loss": 0.5}, "worker": 0}  # the agreed centre's
        wait_until(lambda: "final_result" in read_status(str(path)), 5,
                   "the final result in the status file")
        status.end("finished")
        status.end("failed", "too late")  # the first end is the last word
        with pytest.raises(ValueError, match="state must be one of running, finished"):
            status.end("gone")
    said = read_status(str(path))
    assert said["state"] == "finished" and "error" not in said
    assert said["final_result"] == {"metrics": {"loss": 0.5}, "worker": 0}


def test_a_node_that_ends_without_saying_how_has_failed_and_no_path_writes_nothing(tmp_path):
    from platoon._os.statusfile import read_status
    from platoon.elastic.nodestatus import NodeStatus
    path = str(tmp_path / "node-a.status.json")
    with NodeStatus(path, "a", _link()):
        pass
    assert read_status(path)["state"] == "failed"
    with NodeStatus(None, "a", _link()) as status:
        status.end("finished")
    assert os.listdir(tmp_path) == ["node-a.status.json"]
