"""all_reduce within one node: exact results for every op and dtype, and its failures."""

import sys
import threading

import numpy as np
import pytest

from platoon import Controller, RemoteError, Worker
from platoon.collectives import average_gradients

from helpers import PROCS

sys.path.insert(0, PROCS)
from mpi_worker import CASES, contribution  # noqa: E402  (the same contributions on one node and many)

N = 3


def run_all(workers, fn, timeout=20.0):
    """Run fn(worker) in one thread per worker; return the results in worker order."""
    results, errors = [None] * len(workers), []

    def body(k, w):
        try:
            results[k] = fn(w)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k, w)) for k, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker is stuck in a collective"
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def job(serve):
    ctl = Controller(control_port=0, num_workers=N)
    serving = serve(ctl)
    workers = [Worker(ctl.control_port, timeout_s=10) for _ in range(N)]
    workers.sort(key=lambda w: w.worker_id)
    yield ctl, workers
    for w in workers:
        w.close()
    serving.join()



def test_every_op_and_dtype_is_exact_on_every_worker(job):
    ctl, workers = job

    def body(w):
        got = {}
        for op, dt in CASES:
            a = contribution(w.worker_id, dt)
            got[op, dt] = w.all_reduce(a, op).copy()  # in place
        return got

    results = run_all(workers, body)
    for op, dt in CASES:
        parts = [contribution(k, dt) for k in range(N)]
        want = {"sum": sum(parts[1:], parts[0].copy()), "max": np.maximum.reduce(parts),
                "min": np.minimum.reduce(parts)}.get(op)
        if op == "mean":
            want = (parts[0] + parts[1] + parts[2]) / np.array(N, dt)
        for k in range(N):
            got = results[k][op, dt]
            assert got.dtype == np.dtype(dt)
            np.testing.assert_array_equal(got, want.astype(dt), err_msg="%s %s" % (op, dt))
    assert ctl.all_reduce_rounds == len(CASES)


def test_rounds_of_uneven_workers_stay_exact_and_pass_no_request(job):
    """One node: the workers meet in shared memory, a fast worker starting the next round
    while a slow one still reads this one (the slots alternate between two sets)."""
    ctl, workers = job
    rounds = 60

    def body(w):
        rng = np.random.default_rng(w.worker_id)
        got = []
        for r in range(rounds):
            if w.worker_id == 1 and rng.random() < 0.3:
                threading.Event().wait(0.002)  # a slow worker, now and then
            a = np.arange(1000, dtype=np.float64) * (r + 1) + w.worker_id
            got.append(w.all_reduce(a, "sum").copy())
        return got

    w0 = workers[0]
    w0_requests = []
    send = w0.send_req

    def counting(req, *args, **kwargs):
        w0_requests.append(req)
        return send(req, *args, **kwargs)

    w0.send_req = counting
    results = run_all(workers, body)
    for r in range(rounds):
        want = np.arange(1000, dtype=np.float64) * (r + 1) * N + sum(range(N))
        for k in range(N):
            np.testing.assert_array_equal(results[k][r], want)
    assert ctl.all_reduce_rounds == rounds
    assert w0_requests == ["platoon-allreduce-setup"], w0_requests  # then shared memory only


def test_out_argument_and_non_contiguous_input(job):
    _, workers = job

    def body(w):
        base = np.arange(40.0).reshape(8, 5) * (w.worker_id + 1)
        view = base[::2, 1:]  # non-contiguous; left untouched when out is given
        out = np.empty(view.shape)
        result = w.all_reduce(view, "max", out=out)
        assert result is out
        np.testing.assert_array_equal(view, (np.arange(40.0).reshape(8, 5)
                                             * (w.worker_id + 1))[::2, 1:])
        scalar = np.array(float(w.worker_id))
        w.all_reduce(scalar, "sum")
        return out, float(scalar)

    for out, scalar in run_all(workers, body):
        np.testing.assert_array_equal(out, (np.arange(40.0).reshape(8, 5) * N)[::2, 1:])
        assert scalar == 0 + 1 + 2


def test_average_gradients_is_the_mean_of_each_array(job):
    _, workers = job

    def body(w):
        grads = [np.full((2, 3), w.worker_id, np.float32), np.full(4, 2.0 * w.worker_id),
                 np.full(3, 1.0 + w.worker_id, np.float32)]
        return average_gradients(w, grads)

    for grads in run_all(workers, body):
        np.testing.assert_array_equal(grads[0], np.full((2, 3), 1.0, np.float32))
        np.testing.assert_array_equal(grads[1], np.full(4, 2.0))
        np.testing.assert_array_equal(grads[2], np.full(3, 2.0, np.float32))


def test_bad_op_or_dtype_is_refused_before_anything_is_sent(job):
    _, workers = job
    w = workers[0]
    with pytest.raises(ValueError, match="op must be one of sum, mean, max, min"):
        w.all_reduce(np.zeros(3), "prod")
    with pytest.raises(TypeError, match="'mean' needs a float array"):
        w.all_reduce(np.zeros(3, np.int32), "mean")
    with pytest.raises(TypeError, match="not defined for complex"):
        w.all_reduce(np.zeros(3, complex), "max")
    with pytest.raises(ValueError, match="input's shape"):
        w.all_reduce(np.zeros(3), "sum", out=np.zeros(4))


def test_different_ops_fail_on_every_worker_and_the_next_round_works(job):
    _, workers = job

    def body(w):
        with pytest.raises(RemoteError, match="different ops: worker 0: sum, worker 1: max"):
            w.all_reduce(np.ones(4), "sum" if w.worker_id == 0 else "max")
        return w.all_reduce(np.ones(4), "sum")

    for got in run_all(workers, body):
        np.testing.assert_array_equal(got, np.full(4, float(N)))


def test_a_worker_leaving_fails_the_waiting_all_reduce(serve):
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    a, b = Worker(ctl.control_port, timeout_s=10), Worker(ctl.control_port, timeout_s=10)
    errors = []

    def wait_in_all_reduce():
        try:
            a.all_reduce(np.ones(3))
        except RemoteError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait_in_all_reduce)
    t.start()
    b.close()  # before or after a joins: either way a's all_reduce fails at once
    t.join(10)
    assert not t.is_alive()
    assert errors and "worker 1 has left the job" in str(errors[0]), errors
    a.close()
    serving.join()


def test_all_reduce_needs_num_workers(serve):
    ctl = Controller(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(RemoteError, match="pass num_workers=N to the Controller"):
            w.all_reduce(np.ones(2))
    serving.join()


def test_a_worker_that_times_out_withdraws_from_the_round(job):
    from platoon import ControllerTimeout
    _, workers = job
    with pytest.raises(ControllerTimeout):
        workers[0].all_reduce(np.full(4, 100.0), timeout_s=0.3)  # the others are not there yet
    # Worker 0 withdrew: a round of the other two must not complete without it ...
    with pytest.raises(ControllerTimeout):
        run_all(workers[1:], lambda w: w.all_reduce(np.full(4, 1.0), timeout_s=0.5))
    # ... and a full round afterwards sums exactly the three new contributions.
    results = run_all(workers, lambda w: w.all_reduce(np.full(4, float(w.worker_id + 1))))
    for r in results:
        np.testing.assert_array_equal(r, 6.0)


def test_the_number_of_buffers_a_worker_can_make_is_bounded(job, monkeypatch):
    from platoon._controller import collectives  # noqa: PLC2701 (the controller's bound)
    monkeypatch.setattr(collectives, "MAX_REDUCTION_BUFFERS", 2)
    _, workers = job
    for size in (1, 2):
        run_all(workers, lambda w, size=size: w.all_reduce(np.zeros(size)))
    with pytest.raises(RemoteError, match="already has 2 all_reduce buffers"):
        run_all(workers, lambda w: w.all_reduce(np.zeros(3)))
