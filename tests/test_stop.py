"""The job-wide stop signal, with real controller and worker processes and shared memory."""

import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from platoon import Controller, StopRequested, Worker
from platoon._centre.shmem import remove_stale_segments, segment_owner
from platoon._centre.stopsignal import CONTROLLER, MAX_REASON_BYTES, JobStop, StopSignal
from platoon._os.process import job_segments

from helpers import EXPERIMENTS, ROOT


class Ping(Controller):
    def handle_control(self, req, worker_id, req_info):
        if req == "ping":
            return "pong"
        raise ValueError("unknown request %r" % (req,))


def stop_segment_exists(job_id):
    return bool(job_segments(job_id, kind="stop"))


# -- the segment itself --

def test_the_flag_carries_who_asked_and_why_and_the_first_request_wins():
    job = "test-stop-%d" % os.getpid()
    owner = StopSignal.create(job)
    try:
        assert owner.name.startswith("/platoon-%s-stop-" % job)
        reader = StopSignal.attach(owner.name)
        assert not reader.is_set() and reader.state() == (None, None)
        assert owner.set(3, "target reached")
        assert reader.is_set() and reader.state() == (3, "target reached")
        assert not owner.set(CONTROLLER, "second")  # the first reason is kept
        assert reader.state() == (3, "target reached")
        reader.close()
        reader.close()  # idempotent, and the last state stays readable
        assert reader.is_set() and reader.state() == (3, "target reached")
        assert stop_segment_exists(job)  # only the owner unlinks
        # It is a platoon segment like the centre: the stale-segment scan knows its owner.
        assert segment_owner("/dev/shm" + owner.name) == os.getpid()
    finally:
        owner.close()
    assert not stop_segment_exists(job)


def test_a_long_reason_is_cut_and_a_missing_one_reads_as_none():
    job = "test-stop-long-%d" % os.getpid()
    with_reason, without = JobStop(job), JobStop(job + "-b")
    with_reason.open()
    without.open()
    try:
        assert with_reason.request(0, "\u00e9" * 2000)
        reader = StopSignal.attach(with_reason.segment)
        by, reason = reader.state()
        assert by == 0 and len(reason.encode()) <= MAX_REASON_BYTES
        reader.close()
        without.request(CONTROLLER, None)
        reader = StopSignal.attach(without.segment)
        assert reader.state() == (CONTROLLER, None)
        reader.close()
    finally:
        with_reason.close()
        without.close()


def test_a_stop_segment_left_by_a_dead_controller_is_removed(tmp_path):
    # The dead process says where its segment is: a controller starting in a test running
    # beside this one (pytest-xdist) may remove it too, before this test looks for it.
    job = "test-stale-%d" % os.getpid()
    code = ("import os; from platoon._centre.stopsignal import StopSignal; "
            "from platoon._os.process import job_segments; "
            "s = StopSignal.create(%r); (path,) = job_segments(%r, kind='stop'); "
            "print(path, flush=True); os._exit(0)" % (job, job))
    done = subprocess.run([sys.executable, "-c", code], check=True, timeout=30,
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    path = done.stdout.strip()
    assert path.startswith("/dev/shm/platoon-" + job), done.stdout
    removed = remove_stale_segments()
    assert not os.path.exists(path), removed


# -- with workers --

def test_a_worker_asks_and_a_worker_that_only_syncs_sees_it(procs):
    ctl = procs("stop_controller.py", 2)
    port = int(ctl.wait_for_line("PORT").split()[1])
    job = ctl.wait_for_line("JOB").split()[1]
    syncer = procs("stop_worker.py", port, "sync")
    syncer.wait_for_line("SYNCING")
    asker = procs("stop_worker.py", port, "ask")
    asker_id = int(asker.wait_for_line("ID").split()[1])
    assert syncer.wait(30) == 0, syncer.output
    assert asker.wait(30) == 0, asker.output
    assert ctl.wait(30) == 0, ctl.output
    assert int(syncer.wait_for_line("SAW").split()[1]) > 0
    assert syncer.wait_for_line("SAW").endswith(" target reached")
    assert asker.wait_for_line("SAW").split()[1] == "5"  # it sees its own request at once
    assert "stop requested by worker %d: target reached" % asker_id in ctl.output
    assert "SERVED True target reached" in ctl.output
    assert not stop_segment_exists(job)


def test_a_second_request_does_nothing_not_even_an_info_line(procs):
    ctl = procs("stop_controller.py", 2)  # logs at INFO to its output
    port = int(ctl.wait_for_line("PORT").split()[1])
    first = procs("stop_worker.py", port, "leave")
    assert first.wait(30) == 0, first.output
    ctl.wait_for_line("platoon.controller: stop requested by worker")
    second = procs("stop_worker.py", port, "leave")  # asks again, then leaves
    assert second.wait(30) == 0, second.output
    assert ctl.wait(30) == 0, ctl.output
    assert "SERVED True target reached" in ctl.output
    assert ctl.output.count("stop requested by") == 1
    assert "already asked" not in ctl.output, ctl.output


def test_the_controller_asks_and_both_kinds_of_worker_see_it(serve, procs):
    ctl = Ping(control_port=0, num_workers=2)
    serving = serve(ctl)
    syncer = procs("stop_worker.py", ctl.control_port, "sync")
    requester = procs("stop_worker.py", ctl.control_port, "request")
    syncer.wait_for_line("SYNCING")
    requester.wait_for_line("REQUESTING")
    asked = threading.Thread(target=ctl.request_stop, args=("enough",))  # any thread may ask
    asked.start()
    asked.join(10)
    for proc in (syncer, requester):
        assert proc.wait(30) == 0, proc.output
        assert proc.wait_for_line("SAW").endswith(" enough")
    serving.join()  # serve returns normally once both have left
    assert ctl.stop_requested and ctl.stop_reason == "enough"
    ctl.request_stop("too late")  # after the job: harmless, the first reason stays
    ctl.close()
    ctl.request_stop("closed")
    assert ctl.stop_reason == "enough"
    assert not stop_segment_exists(ctl.job_id)


def test_a_worker_waiting_at_a_barrier_passes_it_when_the_asker_leaves(serve, procs):
    ctl = Ping(control_port=0, num_workers=2)
    serving = serve(ctl)
    waiter = procs("stop_worker.py", ctl.control_port, "barrier")
    waiter.wait_for_line("WAITING")
    leaver = procs("stop_worker.py", ctl.control_port, "leave")
    assert leaver.wait(30) == 0, leaver.output
    # The barrier is not broken by the stop: it is passed as usual, once every worker still
    # in the job is waiting (the asker left); then the stop is there to see.
    assert waiter.wait(30) == 0, waiter.output
    assert waiter.wait_for_line("PASSED") == "PASSED True target reached"
    serving.join()


def test_a_worker_waiting_in_recv_mb_leaves_its_with_block_quietly(serve, procs):
    ctl = Ping(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    worker = procs("stop_worker.py", ctl.control_port, "mb", ctl.data_port)
    for i in range(3):
        ctl.send_mb([np.array([i])], timeout_s=20)
    worker.wait_for_line("GOT 2")
    started = time.monotonic()
    ctl.request_stop("enough data")
    assert worker.wait(30) == 0, worker.output  # StopRequested ended the with block, quietly
    assert worker.wait_for_line("LEFT") == "LEFT True enough data"
    assert "Traceback" not in worker.output
    assert time.monotonic() - started < 10  # within its poll, not at its 30 s timeout
    with pytest.raises(StopRequested, match="enough data"):
        ctl.send_mb([np.array([3])], timeout_s=20)
    serving.join()


def test_a_feeder_waiting_in_send_mb_is_woken_by_the_stop(serve):
    ctl = Ping(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    errors = []

    def feed():
        try:
            ctl.send_mb([np.zeros(3)], timeout_s=30)  # no worker ever asks
        except StopRequested as exc:
            errors.append(exc)

    with Worker(ctl.control_port, timeout_s=10) as w:
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        w.request_stop("no more data needed")
        feeder.join(10)
        assert not feeder.is_alive(), "send_mb still waiting after the stop"
        assert errors and "worker %d asked" % w.worker_id in str(errors[0])
        assert w.stop_requested
        with pytest.raises(StopRequested):  # the recv_mb loop of such a worker ends too
            w.init_mb_sock(ctl.data_port)
            w.recv_mb()
    serving.join()


def test_the_stop_request_reads_and_sets_the_state_for_workers_without_the_segment(
        serve, raw_client):
    """The request a worker on another machine uses instead of the shared byte."""
    from platoon import protocol

    ctl = Ping(control_port=0, num_workers=1)
    serving = serve(ctl)
    sock = raw_client(ctl)

    def ask(req, info=None):
        sock.send(protocol.encode_request(None, req, info, 1))
        return protocol.decode_reply(sock.recv())[1]

    reply = ask(protocol.REGISTER, {"pid": os.getpid(), "host": socket.gethostname()})
    assert ["/dev/shm" + reply["stop_segment"]] == job_segments(ctl.job_id, kind="stop")
    assert ask(protocol.STOP, {"request": False}) == {"stop": False, "by": None, "reason": None}
    assert "reason must be a string" in str(ask(protocol.STOP, {"request": True, "reason": 3}))
    assert ask(protocol.STOP, {"request": True, "reason": "r"}) == {"stop": True, "by": 0,
                                                                    "reason": "r"}
    assert ask(protocol.DONE) is None
    serving.join()
    # After the job, the controller's after-job replies accept a stop request too.
    assert ask(protocol.STOP, {"request": True})["stop"] is True


def test_a_launched_job_ends_with_success_when_its_workers_stop_on_the_signal(tmp_path):
    args = [sys.executable, "-m", "platoon.launch.cli",
            os.path.join(EXPERIMENTS, "stopping"), "-n", "2",
            "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    logs = tmp_path / "logs"
    assert "SERVED stop requested by a worker: True (target reached)" in \
        (logs / "controller.log").read_text()
    for k in range(2):
        assert "stopped after" in (logs / ("worker%d.log" % k)).read_text()
    job = re.search(r"job ([0-9a-f]{16})", out).group(1)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("platoon-%s" % job)]
