"""The worker's credit window: several minibatches per request, acknowledged cumulatively,
and never a finished minibatch left unacknowledged while its worker waits for the next."""

import threading

import numpy as np
import pytest

from platoon import Controller, MinibatchTimeout, Worker


def test_a_worker_waiting_in_recv_mb_has_acknowledged_all_it_finished(serve):
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    got, waiting, errors = [], threading.Event(), []

    def work():
        try:
            with Worker(ctl.control_port, timeout_s=10) as w:
                w.init_mb_sock(ctl.data_port, prefetch=8)
                for _ in range(28):
                    got.append(int(w.recv_mb()[0][0]))
                waiting.set()
                # Waits for the 29th, with 6 asked for still: no refill due, but an ack is.
                got.append(int(w.recv_mb(timeout_s=10)[0][0]))
        except Exception as exc:  # reported by the assertions below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    for i in range(28):
        ctl.send_mb([np.array([i])], timeout_s=10)
    assert waiting.wait(10)
    ctl.flush_mb(timeout_s=5)  # every one acknowledged although the worker has not left
    assert ctl.send_mb([np.array([28])], timeout_s=10) is not None
    worker.join(15)
    assert not errors and got == list(range(29))
    assert ctl.resent_minibatches == 0
    serving.join()


def test_prefetch_sets_the_window(serve):
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        w.init_mb_sock(ctl.data_port, prefetch=8)
        assert (w._mb.window, w._mb.refill_at) == (9, 4)
        sender = threading.Thread(target=lambda: [ctl.send_mb([np.array([i])], timeout_s=10)
                                                  for i in range(40)])
        sender.start()
        assert [int(w.recv_mb()[0][0]) for _ in range(40)] == list(range(40))
        sender.join(10)
        with pytest.raises(MinibatchTimeout):
            w.recv_mb(timeout_s=0.1)
    serving.join()
