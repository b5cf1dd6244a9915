"""Faults with real processes: workers and controllers killed, stale memory, checkpoints."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from platoon import (
    EASGD,
    SGD,
    Adam,
    Controller,
    ControllerGone,
    ControllerTimeout,
    DiLoCo,
    Downpour,
    LayoutMismatch,
    PlatoonError,
    Worker,
    WorkerDied,
)
from platoon._centre import checkpoint
from platoon._centre.shmem import HEADER, MAGIC, SharedCentre, remove_stale_segments
from platoon._os.process import job_segments
from platoon.protocol import layout_of


class Tolerant(Controller):
    """Carries on when a worker dies, remembering when it heard of it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.deaths = []

    def handle_control(self, req, worker_id, req_info):
        return None

    def handle_worker_death(self, worker_id, exit_info):
        self.deaths.append((worker_id, exit_info, time.monotonic()))


def test_worker_killed_holding_the_lock_mid_update(serve, procs):
    ctl = Tolerant(control_port=0, liveness_interval_s=0.2)
    serving = serve(ctl)
    victim = procs("die_worker.py", ctl.control_port, "hold")
    victim.wait_for_line("HOLDING")
    with Worker(ctl.control_port, timeout_s=10) as survivor:
        params = [np.zeros(100000)]
        init = threading.Thread(target=survivor.init_shared_params, args=(params, EASGD(0.5)))
        init.start()
        init.join(0.3)
        assert init.is_alive()  # waiting for the lock: the victim holds it
        killed_at = time.monotonic()
        victim.kill()
        init.join(10)
        assert not init.is_alive()
        params[0] += 2.0
        survivor.sync_params()  # the kernel released the dead holder's lock
        lock_recovered_s = time.monotonic() - killed_at
        # Each element of the centre was either written by the victim (5) or not (0); the
        # survivor started from it, added 2 and synced halfway: 5 -> 6, 0 -> 1.
        centre = survivor.shared_params[0]
        assert lock_recovered_s < 10.0  # (0.1 s idle; a held lock waits out its timeout)
        wait = time.monotonic() + 15
        while not ctl.deaths and time.monotonic() < wait:
            survivor.send_req("poke")  # request-driven and bounded: no sleep
        assert ctl.deaths, "controller did not notice the death"
        worker_id, info, noticed_at = ctl.deaths[0]
        assert info["pid"] == victim.pid and worker_id == 0
        assert noticed_at - killed_at < 15.0
        np.testing.assert_array_equal(centre[:50000], 6.0)
        np.testing.assert_array_equal(centre[50000:], 1.0)
    serving.join()  # the dead worker counts as done, so serve returns


# -- a pusher of a momentum rule killed part-way through a push (tests/procs/momentum_pusher.py)

PUSHER_SHAPE, PUSHER_STEP = (1 << 20,), 0.015625
PUSHER_RULES = {  # as in momentum_pusher.py
    "diloco": lambda: DiLoCo(0.7, 0.9, workers=2),
    "momentum": lambda: Downpour(SGD(0.5, 0.9)),
    "nesterov": lambda: Downpour(SGD(0.5, 0.9, nesterov=True)),
    "adam": lambda: Downpour(Adam(0.01, 0.9, 0.99)),
}


class OneElement:
    """A `RuleContext` for replaying pushes on one-element arrays."""

    num_workers = 2

    def __init__(self):
        self.shared_params, self.states = [np.zeros(1)], {}

    def shared_state(self, name, layout):
        if name not in self.states:
            self.states[name] = [np.zeros(e["shape"], e["dtype"]) for e in layout]
        return self.states[name]


def after_pushes(make_rule, pushes, last_counted=True):
    """The centre and per-element state arrays of an element after the pusher's first
    `pushes` pushes of g = STEP and the keeper's push of g = 0. `last_counted` False: Adam's
    step count misses the pusher's last push (cut part-way, it is not counted)."""
    ctx, keeper, pusher = OneElement(), make_rule(), make_rule()
    for rule in (keeper, pusher):
        rule.check([np.zeros(1)])
        rule.attach(ctx)
        rule.setup([np.zeros(1)])
    x = np.zeros(1)
    for _ in range(pushes):
        x -= PUSHER_STEP
        pusher.update_params([x], ctx.shared_params)
    if not last_counted:
        pusher.state[-1][0] -= 1
    keeper.update_params([np.zeros(1)], ctx.shared_params)
    return [a[0] for a in ctx.shared_params + per_element(pusher.state, (1,))]


def per_element(state, shape):
    """The arrays of a rule's state shaped like its one parameter (not Adam's step count)."""
    return [a for a in state if a.shape == shape]


@pytest.mark.parametrize("name, kernels", [("diloco", "compiled"), ("diloco", "numpy"),
                                           ("momentum", "numpy"), ("nesterov", "numpy"),
                                           ("nesterov", "compiled"), ("adam", "compiled")])
def test_a_pusher_killed_mid_push_leaves_no_element_torn(serve, procs, name, kernels):
    # The pusher dies at its second push's first write to a chosen page of the centre.
    # Each element must then hold the centre and the momentum of one push or of two (a
    # block of the push lands whole or not at all; the keeper's next sync completes one the
    # pusher committed), never a momentum of two pushes beside a centre of one (before the
    # journal: the rest of the 65,536-element block with numpy's passes, DiLoCo's always).
    ctl = Tolerant(control_port=0, liveness_interval_s=0.2)
    serving = serve(ctl, 90)
    make_rule = PUSHER_RULES[name]
    with Worker(ctl.control_port, timeout_s=30) as keeper:
        rule = make_rule()
        keeper.init_shared_params([np.zeros(PUSHER_SHAPE)], rule)
        pusher = procs("momentum_pusher.py", ctl.control_port, name,
                       env={"PLATOON_SYNC_KERNELS": kernels})
        pusher.wait_for_line("READY", 60)
        assert pusher.wait(60) == -signal.SIGSEGV, pusher.output
        keeper.sync_params()  # takes every stripe, recovering any committed block first
        assert keeper.shared_params is not None and rule.state
        got = [a.copy() for a in keeper.shared_params + per_element(rule.state, PUSHER_SHAPE)]
        steps = rule.state[-1].copy()
    serving.join()
    once = after_pushes(make_rule, 1)
    twice = after_pushes(make_rule, 2, last_counted=name != "adam")
    at_once = np.logical_and.reduce([a == w for a, w in zip(got, once)])
    at_twice = np.logical_and.reduce([a == w for a, w in zip(got, twice)])
    torn = np.flatnonzero(~(at_once | at_twice))
    assert not torn.size, "%d elements whose centre and state are of no whole number of " \
        "pushes (first: element %d, centre and state %r; one push: %r; two: %r)" % (
            torn.size, torn[0], [a[torn[0]] for a in got], once, twice)
    assert at_once.any() and at_twice.any(), "the kill did not cut the second push part-way"
    if name == "adam":  # the pusher's first push and the keeper's: the cut one is not counted
        np.testing.assert_array_equal(steps, [2.0])


def test_by_default_a_dead_worker_ends_serve(procs):
    with Controller(control_port=0, liveness_interval_s=0.2) as ctl:
        victim = procs("die_worker.py", ctl.control_port, "sync")
        errors = []

        def run():
            try:
                ctl.serve(timeout_s=20)
            except WorkerDied as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        victim.wait_for_line("READY")
        victim.kill()
        t.join(10)
        assert errors and "worker 0 (pid %d) died" % victim.pid in str(errors[0])
        assert "--restart" in str(errors[0])


@pytest.mark.parametrize("mode", ["barrier", "sync"])
def test_workers_notice_a_dead_controller(procs, tmp_path, mode):
    ctl = procs("step_controller.py", 2, tmp_path / "c.npz", 30)
    port = int(ctl.wait_for_line("PORT").split()[1])
    job_id = ctl.wait_for_line("JOB").split()[1]
    worker = procs("die_worker.py", port, mode)
    worker.wait_for_line("READY")
    assert job_segments(job_id, kind="centre") and job_segments(job_id, kind="stop")
    killed_at = time.monotonic()
    ctl.kill()
    assert worker.wait(10) != 0
    line = worker.wait_for_line("RAISED")
    assert "ControllerGone" in line and "has exited" in line, worker.output
    assert time.monotonic() - killed_at < 15.0  # (seconds idle; a hang waits forever)
    # A SIGKILLed controller cannot clean up; the next controller to start on this machine
    # does (possibly one of a suite running beside this one).
    with Controller():
        assert not job_segments(job_id)


def test_stale_segments_of_dead_jobs_are_removed_live_ones_kept(procs, tmp_path):
    dead = procs("step_controller.py", 1, tmp_path / "c.npz", 0.01)
    dead.wait()
    live = procs("step_controller.py", 1, tmp_path / "d.npz", 30)
    live.wait_for_line("PORT")
    layout = layout_of([np.zeros(3)])
    made = {}
    for owner, proc in (("dead", dead), ("live", live)):
        centre = SharedCentre.create("stale%s%s" % (owner, os.urandom(4).hex()), layout)
        HEADER.pack_into(centre._map, 0, MAGIC, proc.pid, 64, 1)  # as if that process owned it
        made[owner] = centre
    try:
        removed = remove_stale_segments()  # (or a controller starting beside this test)
        assert not os.path.exists("/dev/shm" + made["dead"].name), removed
        assert os.path.exists("/dev/shm" + made["live"].name)
        with Controller():  # a new controller cleans up on start, too
            pass
    finally:
        for centre in made.values():
            centre.close()
            centre.unlink()


def _release_and_remove(fifo):
    """Let any process blocked opening `fifo` for reading go on (a suite beside this one
    running older code, say), then remove it."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waiting (ENXIO), or already gone
    try:
        os.unlink(fifo)
    except FileNotFoundError:
        pass


def test_a_fifo_or_symlink_named_like_a_segment_never_blocks_a_controller(tmp_path):
    tag = os.urandom(4).hex()
    fifo = "/dev/shm/platoon-fifo%s-centre" % tag
    outside = str(tmp_path / "fifo")
    link = "/dev/shm/platoon-link%s-centre" % tag
    fifos = [fifo, outside]
    try:
        os.mkfifo(fifo, 0o600)
        os.mkfifo(outside, 0o600)
        os.symlink(outside, link)
        script = ("from platoon import Controller\n"
                  "from platoon._centre.shmem import segment_owner\n"
                  "print('OWNERS', segment_owner(%r), segment_owner(%r), flush=True)\n"
                  "with Controller():\n"
                  "    print('STARTED', flush=True)\n" % (fifo, link))
        try:  # run() kills the child if it is still blocked when the time is up
            done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                  text=True, timeout=15)
        except subprocess.TimeoutExpired as exc:
            pytest.fail("a controller blocked on a FIFO named like a segment: %s" % exc)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "OWNERS None None" in done.stdout and "STARTED" in done.stdout
        assert os.path.exists(fifo) and os.path.islink(link)  # not ours to remove
    finally:
        for path in fifos:
            _release_and_remove(path)
        if os.path.islink(link):
            os.unlink(link)


def test_checkpoint_and_bit_identical_resume(serve, tmp_path):
    path = str(tmp_path / "ckpt" / "centre.npz")
    ctl = Tolerant(control_port=0, checkpoint_path=path)
    serving = serve(ctl)
    rng = np.random.default_rng(3)
    saved = [rng.normal(size=(30, 7)).astype(np.float32), rng.normal(size=5)]
    with Worker(ctl.control_port, timeout_s=5) as w:
        w.init_shared_params([a.copy() for a in saved], EASGD(0.5))
    serving.join()
    arrays, meta = checkpoint.load(str(tmp_path / "ckpt"))
    assert meta["job_id"] == ctl.job_id
    for a, b in zip(arrays, saved):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)

    resumed = Tolerant(control_port=0, resume_from=path)
    serving = serve(resumed)
    with Worker(resumed.control_port, timeout_s=5) as w:
        mine = [np.zeros((30, 7), np.float32), np.zeros(5)]
        w.init_shared_params(mine, EASGD(0.5))  # the checkpoint, not these zeros, is the centre
        for a, b in zip(mine, saved):
            assert a.tobytes() == b.tobytes()
        with Worker(resumed.control_port, timeout_s=5) as other:
            with pytest.raises(LayoutMismatch):
                other.init_shared_params([np.zeros(3)], EASGD(0.5))
    serving.join()


def test_a_crash_while_writing_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "centre.npz")
    checkpoint.save(path, [np.arange(4.0)], {"n": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated crash mid-write)")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(path, [np.zeros(4)], {"n": 2})
    arrays, meta = checkpoint.load(path)
    np.testing.assert_array_equal(arrays[0], np.arange(4.0))
    assert meta == {"n": 1} and os.listdir(tmp_path) == ["centre.npz"]
    with pytest.raises(PlatoonError, match="cannot read checkpoint"):
        checkpoint.load(str(tmp_path / "missing.npz"))


def test_sigterm_to_a_serving_controller_cleans_up(procs, tmp_path):
    ctl = procs("step_controller.py", 2, tmp_path / "c.npz", 30)
    port = int(ctl.wait_for_line("PORT").split()[1])
    job_id = ctl.wait_for_line("JOB").split()[1]
    worker = procs("die_worker.py", port, "barrier")
    worker.wait_for_line("READY")
    assert job_segments(job_id, kind="centre")
    os.kill(ctl.pid, signal.SIGTERM)
    assert ctl.wait(10) == 128 + signal.SIGTERM
    assert not job_segments(job_id)
    assert worker.wait(10) != 0  # the worker noticed


def test_a_worker_failing_in_its_with_block_ends_serve_by_default(serve):
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5):
        with pytest.raises(RuntimeError):
            with Worker(ctl.control_port, timeout_s=5):
                raise RuntimeError("training diverged")
        with pytest.raises(WorkerDied, match="worker 1 .* failed: RuntimeError: training "
                                             "diverged"):
            serving.join(10)
        serving.error = None


def test_replacement_registering_before_the_death_is_noticed(serve, procs):
    ctl = Tolerant(control_port=0, num_workers=1, restarts=1, liveness_interval_s=5)
    serving = serve(ctl)
    victim = procs("die_worker.py", ctl.control_port, "sync")
    victim.wait_for_line("READY")
    victim.kill()
    with Worker(ctl.control_port, timeout_s=5) as replacement:  # long before the next pid check
        params = [np.zeros(100000)]
        replacement.init_shared_params(params, EASGD(0.5))
        assert replacement.worker_id == 0  # it takes the failed worker's id
    serving.join()
    assert ctl.workers == [0] and not ctl.deaths  # within the restart budget


def test_a_worker_that_gives_up_on_a_barrier_withdraws(serve):
    ctl = Tolerant(control_port=0, num_workers=3)
    serving = serve(ctl)
    workers = [Worker(ctl.control_port, timeout_s=10) for _ in range(3)]
    try:
        with pytest.raises(ControllerTimeout):
            workers[0].barrier(timeout_s=0.3)
        passed = []
        others = [threading.Thread(target=lambda w=w: passed.append(_barrier(w, 0.5)))
                  for w in workers[1:]]
        for t in others:
            t.start()
        for t in others:
            t.join(10)
        assert passed == [False, False]  # worker 0 is not waiting any more
        everyone = [threading.Thread(target=lambda w=w: passed.append(_barrier(w, 10)))
                    for w in workers]
        for t in everyone:
            t.start()
        for t in everyone:
            t.join(15)
        assert passed[2:] == [True, True, True]
    finally:
        for w in workers:
            w.close()
    serving.join()


def _barrier(worker, timeout):
    try:
        worker.barrier(timeout_s=timeout)
        return True
    except ControllerTimeout:
        return False


def test_recv_mb_notices_a_dead_controller(procs, tmp_path):
    ctl = procs("step_controller.py", 1, tmp_path / "c.npz", 30)
    port = int(ctl.wait_for_line("PORT").split()[1])
    data_port = int(ctl.wait_for_line("DATA").split()[1])
    with Worker(port, data_port, timeout_s=10) as w:
        ctl.kill()
        start = time.monotonic()
        with pytest.raises(ControllerGone):
            w.recv_mb(timeout_s=None)
        assert time.monotonic() - start < 10.0  # (1 s idle; a hang waits forever)
    Controller().close()  # the next controller removes what the killed one left
