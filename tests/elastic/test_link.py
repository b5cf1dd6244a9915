"""platoon.elastic.link: the controller's node link in an elastic job, in-process (a real
controller and workers, a stand-in lighthouse): what it refuses, the final round's waits."""

import time

import numpy as np
import pytest

from platoon.errors import PlatoonError

from elastic_helpers import SLACK_S, _NoLighthouse, _tie


def test_an_elastic_node_refuses_cross_node_collectives_and_a_tie_paced_in_syncs():
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    link = ElasticLink(2, connect=None, name="a", tie=CentreTie(1.0, outer="diloco"),
                       timeout_s=5.0, on_failure=print)
    with pytest.raises(PlatoonError, match="all_reduce across nodes does not exist in an "
                                           "elastic job"):
        link.all_reduce(np.zeros(3, np.float32), "sum")
    with pytest.raises(PlatoonError, match="a barrier across nodes does not exist"):
        link.barrier()
    assert link.topology(1) == {"global_rank": 1, "global_size": 2, "elastic_node": "a",
                                "placed_in_job": False}
    with pytest.raises(PlatoonError, match="rounds come every so many seconds"):
        ElasticLink(1, None, "a", CentreTie(None, every_syncs=4, outer="easgd"), 5.0, print)


def test_an_elastic_workers_final_evaluation_waits_past_its_timeout_for_the_final_round(
        serve):
    """An elastic node's last worker waits for the final round, which comes once the other
    nodes are done (here 1 s after this one), however short its own timeout."""
    from platoon import EASGD, Controller, Worker
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie

    class SlowFinal(ElasticLink):  # the other nodes finish 1 s after this one
        done_at = None

        def start(self, controller):
            pass

        def trained(self):
            self.done_at = time.monotonic()
            return True

        def final_centre(self):
            return None if time.monotonic() < self.done_at + 1.0 else True

        def finish(self):
            pass

    link = SlowFinal(1, None, "a", CentreTie(1.0, outer="diloco"), 5.0, print)
    ctl = Controller(control_port=0, num_workers=1, node_link=link)
    serve(ctl)
    with Worker(ctl.control_port, timeout_s=0.3) as w:
        assert w.elastic_node == "a"
        w.init_shared_params([np.zeros(3, np.float32)], EASGD(0.5))
        assert w.final_evaluation(lambda: {"loss": 1.5}) == {"loss": 1.5}


def test_a_done_node_whose_group_makes_no_round_gives_up_the_final_round_in_time():
    """Node a is done (handed over), and then no quorum comes (its peer died, too few nodes
    for --min-nodes): after final_timeout_s without a round it ends, keeping its centre (the
    last anchor), and does not evaluate it as the agreed one."""
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    tie, centre, failures = _tie([2.0, 2.0], [2.0, 2.0], running=True, final_timeout_s=0.3)
    tie._handed_over = True
    link = ElasticLink(1, None, "a", CentreTie(1.0, outer="diloco"), 1.0, print)
    link._tie_thread = tie
    started = time.monotonic()
    link.finish()  # returns: the node saves its centre and ends
    assert 0.3 <= time.monotonic() - started < 0.3 + SLACK_S
    assert tie.gave_up and tie.final.is_set() and not failures
    assert link.final_centre() is False  # not the agreed centre: no one evaluates it
    np.testing.assert_array_equal(centre.arrays[0], [2.0, 2.0])
    assert "no final round within 0.3 s: it kept its own centre" in tie.summary()


def test_a_node_serves_on_while_its_tie_decides_where_the_centre_starts(serve):
    """A node's first init_shared_params waits for its tie to decide whether a live peer
    gives the centre's first values (here none comes: no quorum, 1 s): meanwhile its
    controller serves (another worker registers within its 0.3 s timeout), and the waiting
    worker, however short its own timeout, is answered once the tie has decided."""
    import threading

    from platoon import EASGD, Controller, Worker
    from platoon.elastic.link import ElasticLink
    from platoon.node.tie import CentreTie
    failures, outcome = [], {}
    link = ElasticLink(2, _NoLighthouse, "a", CentreTie(0.05, outer="diloco",
                                                        compress="float32"),
                       0.5, failures.append, final_timeout_s=0.3)
    ctl = Controller(control_port=0, num_workers=2, node_link=link)
    serve(ctl)

    def first_worker():
        try:
            with Worker(ctl.control_port, timeout_s=0.3) as w:
                started = time.monotonic()
                w.init_shared_params([np.full(3, 7.0, np.float32)], EASGD(0.5))
                outcome["first"] = (w.is_first, time.monotonic() - started)
        except Exception as exc:
            outcome["error"] = exc

    waiting = threading.Thread(target=first_worker)
    waiting.start()
    try:
        deadline = time.monotonic() + 10
        while link.tie_thread is None or not link.tie_thread._awaiting.is_set():
            assert time.monotonic() < deadline and waiting.is_alive(), outcome
            time.sleep(0.01)
        with Worker(ctl.control_port, timeout_s=0.3) as other:  # registered meanwhile
            waiting.join(10)
            assert "error" not in outcome, outcome["error"]
            is_first, took = outcome["first"]
            assert is_first and took >= 0.9  # its workers write the first values
            params = [np.zeros(3, np.float32)]
            other.init_shared_params(params, EASGD(0.5))
            assert not other.is_first and (params[0] == 7.0).all()
    finally:
        waiting.join(10)
    assert not failures
