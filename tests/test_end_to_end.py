"""A controller and several worker processes, all real, syncing through shared memory."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "procs"))
from shared_math import initial_params, local_delta  # noqa: E402

from platoon._os.process import job_segments  # noqa: E402


def run_job(procs, tmp_path, num_workers, rounds, mode, rule):
    centre_out = tmp_path / "centre.npz"
    ctl = procs("step_controller.py", num_workers, centre_out)
    port = int(ctl.wait_for_line("PORT").split()[1])
    workers = [procs("sync_worker.py", port, num_workers, rounds, mode, rule,
                     str(tmp_path / "worker%d.npz"))
               for _ in range(num_workers)]
    for w in workers:
        assert w.wait(60) == 0, w.output
    assert ctl.wait(30) == 0, ctl.output
    def load(path):
        return [f["arr_%d" % i] for f in [np.load(path)] for i in range(len(f.files))]

    centre = load(centre_out)
    locals_ = [load(tmp_path / ("worker%d.npz" % k)) for k in range(num_workers)]
    return ctl, centre, locals_


def test_three_workers_easgd_in_turn_match_the_rule_exactly(procs, tmp_path):
    n, rounds = 3, 4
    _, centre, locals_ = run_job(procs, tmp_path, n, rounds, "ordered", "easgd")
    c = initial_params(np.float32)
    xs = [initial_params(np.float32) for _ in range(n)]
    for r in range(rounds):
        for k in range(n):
            for x, d in zip(xs[k], local_delta(k, r, np.float32)):
                x += d
        for k in range(n):
            for x, ci in zip(xs[k], c):
                diff = 0.5 * (x - ci)
                x -= diff
                ci += diff
    for got, want in zip(centre, c):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    for k in range(n):
        for got, want in zip(locals_[k], xs[k]):
            np.testing.assert_array_equal(got, want)
    assert not np.array_equal(centre[0], initial_params(np.float32)[0])


@pytest.mark.parametrize("rule", ["easgd", "asgd"])
def test_three_free_running_workers_conserve_what_the_rule_conserves(procs, tmp_path, rule):
    n, rounds = 3, 30
    ctl, centre, locals_ = run_job(procs, tmp_path, n, rounds, "free", rule)
    assert "STEPS %d" % (n * rounds) in ctl.output
    init = initial_params(np.float64)
    total_delta = [sum(local_delta(k, r, np.float64)[i] for k in range(n) for r in range(rounds))
                   for i in range(len(init))]
    for i in range(len(init)):
        if rule == "easgd":
            # x -= d; c += d: the sum of all locals and the centre moves only by local changes.
            got = centre[i] + sum(x[i] for x in locals_)
            want = (n + 1) * init[i] + total_delta[i]
        else:
            # Every local change reaches the centre exactly once.
            got, want = centre[i], init[i] + total_delta[i]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_centre_is_removed_when_the_job_ends(procs, tmp_path):
    ctl, centre, _ = run_job(procs, tmp_path, 2, 2, "free", "easgd")
    job_id = ctl.wait_for_line("JOB").split()[1]
    assert len(centre) == 2  # the centre existed during the job
    assert not job_segments(job_id)
