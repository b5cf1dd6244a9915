"""A node of an elastic job that says its last word, for tests: it heartbeats to the lighthouse
with platoon's NodeStatus (its status file at STATUS_FILE) over a stand-in of its centre tie;
once a quorum holds it, it leaves (as its tie does after the final round) and ends "finished"
with the final result loss LOSS (as the node that evaluated the agreed centre does).

usage: elastic_last_word.py LIGHTHOUSE NAME STATUS_FILE LOSS
prints "quorum ID" once a quorum holds it, then "ended".
"""

import sys

from platoon.elastic import LighthouseClient
from platoon.elastic.nodestatus import NodeStatus

lighthouse, name, status_file, loss = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])


class Tie:
    """What NodeStatus reads of an ElasticTie."""

    quorums, rounds, gave_up, client = [], 0, False, None


class Link:
    """What NodeStatus reads of an ElasticLink."""

    tie_thread, final_result = Tie(), None


link = Link()
with NodeStatus(status_file, name, link) as status:
    with LighthouseClient(lighthouse, name, "127.0.0.1:1") as client:
        link.tie_thread.client = client
        quorum = client.wait_for_quorum(timeout_s=20)
        link.tie_thread.quorums, link.tie_thread.rounds = [quorum.id], 1
        print("quorum %d" % quorum.id, flush=True)
    link.final_result = {"metrics": {"loss": loss}, "worker": 0}
    status.end("finished")
print("ended", flush=True)
