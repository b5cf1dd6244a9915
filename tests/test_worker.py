"""The worker against a real controller: timeouts, shared parameters, lock, minibatches."""

import signal
import sys
import threading
import time

import numpy as np
import pytest

from platoon import (
    ASGD,
    EASGD,
    Controller,
    ControllerTimeout,
    LockTimeout,
    MinibatchTimeout,
    ParamSyncRule,
    PlatoonError,
    ProtocolError,
    Worker,
    WorkerClosed,
    shard,
)
from platoon._os.process import job_segments


class CountController(Controller):
    count = 0

    def handle_control(self, req, worker_id, req_info):
        self.count += 1
        return [req, self.count]


def test_no_controller_fails_within_the_timeout_naming_the_address():
    with Controller(control_port=0) as ctl:
        port = ctl.control_port
    start = time.monotonic()
    with pytest.raises(ControllerTimeout, match="tcp://127.0.0.1:%d within 0.3 s" % port):
        Worker(port, timeout_s=0.3)
    assert time.monotonic() - start < 2.0


def test_timed_out_request_leaves_the_worker_usable(serve):
    release = threading.Event()

    class SlowOnce(CountController):
        def handle_control(self, req, worker_id, req_info):
            if req == "slow":
                release.wait(10)  # answers only after the worker gave up
            return super().handle_control(req, worker_id, req_info)

    ctl = SlowOnce(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(ControllerTimeout, match="no reply to 'slow'"):
            w.send_req("slow", timeout_s=0.2)
        release.set()  # the late reply to 'slow' now arrives and must be ignored
        assert w.send_req("second") == ["second", 2]
        assert w.send_req("third") == ["third", 3]
    serving.join()


def test_closed_worker(serve):
    ctl = CountController(control_port=0)
    serving = serve(ctl)
    w = Worker(ctl.control_port, timeout_s=5)
    w.close()
    w.close()
    with pytest.raises(PlatoonError, match="closed"):
        w.send_req("x")
    serving.join()


@pytest.mark.parametrize("code, fails", [(0, False), (None, False), (3, True)])
def test_sys_exit_inside_a_with_block_fails_the_worker_only_if_non_zero(serve, code, fails):
    """sys.exit(0) in `with Worker()` told the controller the worker failed ("SystemExit: 0")
    while its process exited 0: the launcher and the controller disagreed."""
    deaths = []

    class Recording(Controller):
        def handle_worker_death(self, worker_id, exit_info):
            deaths.append(exit_info.get("error"))

    ctl = Recording(control_port=0, num_workers=1)
    serving = serve(ctl)
    with pytest.raises(SystemExit):
        with Worker(ctl.control_port, timeout_s=5):
            sys.exit(code)
    serving.join()
    assert deaths == (["SystemExit: 3"] if fails else [])


def test_every_method_of_a_closed_worker_says_it_is_closed(serve):
    """Each public method raises WorkerClosed after close() (sync_params and start_sync
    raised a TypeError from a closed socket), also for a worker that shared parameters."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl)
    w = Worker(ctl.control_port, timeout_s=5)
    w.init_shared_params([np.zeros(8)], EASGD(0.5))
    w.init_mb_sock(ctl.data_address)
    w.close()
    calls = {"sync_params": lambda: w.sync_params(), "start_sync": lambda: w.start_sync(),
             "snapshot_centre": lambda: w.snapshot_centre(), "lock": lambda: w.lock(1),
             "unlock": lambda: w.unlock(), "barrier": lambda: w.barrier(),
             "report": lambda: w.report(1), "request_stop": lambda: w.request_stop(),
             "all_reduce": lambda: w.all_reduce(np.ones(2)),
             "shared_state": lambda: w.shared_state("s", [{"dtype": "float64", "shape": [2]}]),
             "init_shared_params": lambda: w.init_shared_params([np.zeros(8)], EASGD(0.5)),
             "init_mb_sock": lambda: w.init_mb_sock(ctl.data_address),
             "recv_mb": lambda: w.recv_mb(timeout_s=1), "send_req": lambda: w.send_req("x"),
             "final_evaluation": lambda: w.final_evaluation(dict),
             "start_together": lambda: w.start_together()}
    for name, call in calls.items():
        with pytest.raises(WorkerClosed, match=r"worker 0 is closed .*%s\(\) needs an open "
                                               r"worker" % name):
            call()
    assert issubclass(WorkerClosed, PlatoonError)
    assert w.syncs == 0 and not w.stop_requested  # its counters stay readable
    serving.join()


@pytest.mark.parametrize("params, rule, error, message", [
    ([], EASGD(0.5), ValueError, "at least one"),
    ([[1.0, 2.0]], EASGD(0.5), TypeError, "parameter 0 is a builtins.list"),
    ([np.zeros(2), np.frombuffer(b"\0" * 16)], EASGD(0.5), TypeError, "parameter 1 is read-only"),
    ([np.zeros(2, np.int64)], EASGD(0.5), TypeError, "floating-point"),
    ([np.zeros(2)], "easgd", TypeError, "ParamSyncRule"),
])
def test_unusable_parameters_are_refused_before_anything_is_shared(serve, params, rule, error,
                                                                   message):
    ctl = CountController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(error, match=message):
            w.init_shared_params(params, rule)
        assert ctl.centre is None
        with pytest.raises(PlatoonError, match="init_shared_params"):
            w.sync_params()
    serving.join()


def test_later_workers_start_from_the_centre_and_sync(serve):
    ctl = CountController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as a, Worker(ctl.control_port, timeout_s=5) as b:
        pa, pb = [np.full(4, 2.0)], [np.zeros(4)]
        a.init_shared_params(pa, EASGD(0.5))
        b.init_shared_params(pb, EASGD(0.5), cleanup=True)
        np.testing.assert_array_equal(pb[0], 2.0)
        with pytest.raises(PlatoonError, match="already called"):
            b.init_shared_params(pb, EASGD(0.5))
        pa[0] += 4.0
        a.sync_params()
        np.testing.assert_array_equal(pa[0], 4.0)
        np.testing.assert_array_equal(a.shared_params[0], 4.0)
        np.testing.assert_array_equal(b.shared_params[0], 4.0)
        b.sync_params()
        np.testing.assert_array_equal(pb[0], 3.0)
    serving.join()


def test_lock_blocks_other_workers_and_sync_releases_it_on_errors(serve):
    class Exploding(ParamSyncRule):
        def update(self, index, local, central):
            raise RuntimeError("rule failed")

    ctl = CountController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=2) as a, Worker(ctl.control_port, timeout_s=5) as b:
        a.init_shared_params([np.ones(2)], ASGD())
        b.init_shared_params([np.ones(2)], Exploding())
        a.lock()
        with pytest.raises(LockTimeout):
            b.lock(timeout_s=0.1)
        a.unlock()
        with pytest.raises(RuntimeError, match="rule failed"):
            b.sync_params()
        a.sync_params()  # would time out after 2 s if b still held the lock
        a.lock()
        a.sync_params(synchronous=False)
        a.unlock()
    serving.join()


def test_minibatches_flow_while_the_controller_serves(serve):
    ctl = CountController(control_port=0, data_port=0)
    serving = serve(ctl)
    batches = [[np.arange(12, dtype=np.float32).reshape(3, 4) + i,
                np.asfortranarray(np.ones((2, 3), np.int64) * i),
                np.arange(10.0)[::2]] for i in range(5)]
    sender = threading.Thread(target=lambda: [ctl.send_mb(b, timeout_s=10) for b in batches])
    with Worker(ctl.control_port, data_port=ctl.data_port, timeout_s=10) as w:
        sender.start()
        for i, want in enumerate(batches):
            got = w.recv_mb()
            assert w.send_req("progress", i) == ["progress", i + 1]  # control is not blocked
            for a, b in zip(want, got):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)
            assert got[1].flags.f_contiguous
        with pytest.raises(MinibatchTimeout, match="within 0.1 s"):
            w.recv_mb(timeout_s=0.1)
    sender.join(10)
    serving.join()


def test_malformed_minibatch_frames_raise(serve, raw_data_socket):
    push, port = raw_data_socket, raw_data_socket.port
    ctl = CountController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, data_port=port, timeout_s=5) as w:
        push.send([b'[{"dtype": "<f8", "shape": [4]}]', b"short"])
        with pytest.raises(ProtocolError, match="5 bytes arrived"):
            w.recv_mb()
        push.send([b"\x00\x01"])
        with pytest.raises(ProtocolError, match="minibatch header"):
            w.recv_mb()
    serving.join()


def test_send_mb_needs_a_data_socket_and_times_out_without_workers():
    with Controller(control_port=0) as ctl:
        with pytest.raises(PlatoonError, match="init_data"):
            ctl.send_mb([np.zeros(1)])
        ctl.init_data(0, hwm=1)
        with pytest.raises(MinibatchTimeout, match="no worker asked"):
            ctl.send_mb([np.zeros(1)], timeout_s=0.1)


def test_lock_works_as_a_context_manager_releasing_on_exit_and_on_errors(serve):
    ctl = CountController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as a, Worker(ctl.control_port, timeout_s=5) as b:
        a.init_shared_params([np.ones(2)], ASGD())
        b.init_shared_params([np.ones(2)], ASGD())
        with a.lock(timeout_s=1.0):
            with pytest.raises(LockTimeout):
                b.lock(timeout_s=0.05)
            a.sync_params()  # under the caller's lock: the whole centre, no deadlock
        with pytest.raises(RuntimeError, match="inside"):
            with b.lock(1.0):
                raise RuntimeError("inside")
        with a.lock(timeout_s=1.0):  # b released it when the exception left the block
            pass
        a.lock()  # and without `with`, as before
        a.unlock()
        b.sync_params()
    serving.join()


def test_old_duration_keywords_still_work_and_warn(serve):
    from platoon import average_gradients
    from platoon.compat.channel import Worker as OriginalWorker

    ctl = CountController(control_port=0, data_port=0, num_workers=2)
    serving = serve(ctl)
    with pytest.warns(DeprecationWarning, match=r"Worker.__init__\(timeout=...\) is deprecated: "
                                                r"call it with timeout_s="):
        w = Worker(ctl.control_port, data_port=ctl.data_port, timeout=5)
    with w, OriginalWorker(port=ctl.control_port, socket_timeout=2500) as original:
        assert w.timeout_s == w.timeout == 5 and original.timeout_s == 2.5
        w.timeout = 4  # the old attribute is still writable
        assert w.timeout_s == 4
        for call, name in [(lambda: w.send_req("x", timeout=1), "send_req"),
                           (lambda: w.recv_mb(timeout=0.05), "recv_mb")]:
            with pytest.warns(DeprecationWarning, match=r"Worker.%s\(timeout=" % name):
                try:
                    call()
                except MinibatchTimeout:
                    pass
        threads = [threading.Thread(target=original.barrier),
                   threading.Thread(target=lambda: original.all_reduce(np.ones(2)))]
        threads[0].start()
        with pytest.warns(DeprecationWarning, match=r"Worker.barrier\(timeout="):
            w.barrier(timeout=5)
        threads[0].join(5)
        threads[1].start()
        with pytest.warns(DeprecationWarning, match=r"Worker.all_reduce\(timeout="):
            assert list(w.all_reduce(np.ones(2), timeout=5)) == [2.0, 2.0]
        threads[1].join(5)
        threads[0] = threading.Thread(target=lambda: average_gradients(original, [np.ones(2)]))
        threads[0].start()
        with pytest.warns(DeprecationWarning, match=r"average_gradients\(timeout="):
            average_gradients(w, [np.ones(2)], timeout=5)
        threads[0].join(5)
        w.init_shared_params([np.ones(2)], EASGD(0.5))
        original.init_shared_params([np.ones(2)], EASGD(0.5))
        with pytest.warns(DeprecationWarning, match=r"Worker.lock\(timeout="):
            w.lock(timeout=1)
        w.unlock()
        with pytest.warns(DeprecationWarning, match=r"SyncHandle.wait\(timeout="):
            w.start_sync().wait(timeout=5)
    serving.join()


# -- a script run by itself; one final result --

def test_a_worker_without_port_or_launcher_runs_a_one_worker_job(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("PLATOON_")]:
        monkeypatch.delenv(name)
    with Worker(timeout_s=10) as w:  # before: ValueError, "needs the controller's port"
        assert (w.worker_id, w.num_workers) == (0, 1)
        assert (w.global_rank, w.global_size) == (0, 1)
        assert sorted(shard(10, w)) == list(range(10))  # alone: the whole of the data
        x = np.ones(4)
        w.init_shared_params([x], EASGD(0.5))
        assert w.start_together() is True  # the job is this one worker
        x += 2.0
        w.sync_params()
        np.testing.assert_array_equal(w.shared_params[0], np.full(4, 2.0))
        assert w.final_evaluation(lambda: {"value": np.float32(2.5)}) == {"value": 2.5}
    assert not [t for t in threading.enumerate() if t.name == "platoon-own-controller"]


def test_a_launched_worker_without_a_port_is_still_refused(monkeypatch):
    monkeypatch.setenv("PLATOON_LAUNCHER_PID", "1")
    monkeypatch.delenv("PLATOON_CONTROL_PORT", raising=False)
    with pytest.raises(ValueError, match="control_port.*PLATOON_CONTROL_PORT"):
        Worker()


def test_one_final_result_is_kept_from_the_last_worker_past_its_last_sync(serve):
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    w0, w1 = sorted((Worker(ctl.control_port, timeout_s=10) for _ in range(2)),
                    key=lambda w: w.worker_id)
    calls = []
    assert w0.final_evaluation(lambda: calls.append(0) or {"a": 1}) is None  # w1 trains
    assert ctl.final_result is None
    with pytest.raises(TypeError, match="dict of metrics"):
        w1.final_evaluation(lambda: 0.5)
    assert ctl.final_result is None and calls == []
    w0.close()
    w1.close()
    serving.join()
    ctl2 = Controller(control_port=0, num_workers=2)
    serving = serve(ctl2)
    w0, w1 = (Worker(ctl2.control_port, timeout_s=10) for _ in range(2))
    assert w0.final_evaluation(lambda: {"x": 1}) is None
    w0.close()  # a worker that left after its last sync does not hold the result up
    assert w1.final_evaluation(lambda: {"accuracy": 0.89}) == {"accuracy": 0.89}
    assert ctl2.final_result == {"metrics": {"accuracy": 0.89}, "worker": w1.worker_id}
    assert w1.final_evaluation(lambda: {"accuracy": 0.5}) is None  # once per job
    w1.close()
    serving.join()


# -- a script run alone, ended by a signal (issue 35, item 15) --

def _alone(procs, *args):
    proc = procs("alone_script.py", *args)
    job_id = proc.wait_for_line("READY").split()[1]
    assert job_segments(job_id)  # the centre and the stop signal
    return proc, job_id


def test_a_script_run_alone_leaves_no_segments_when_terminated(procs):
    proc, job_id = _alone(procs)
    proc.popen.send_signal(signal.SIGTERM)  # a scheduler's time limit, `timeout`
    assert proc.wait(10) == 128 + signal.SIGTERM  # before: killed, its segments left behind
    assert job_segments(job_id) == []
    assert "Traceback" not in proc.output


def test_sigterm_still_reaches_a_script_run_alones_own_handler(procs):
    proc, job_id = _alone(procs, "own-handler")
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 3
    assert "the script's own handler" in proc.output
    assert job_segments(job_id) == []


def test_ctrl_c_of_a_script_run_alone_shows_only_its_own_traceback(procs):
    proc, job_id = _alone(procs)
    proc.popen.send_signal(signal.SIGINT)
    assert proc.wait(10) != 0
    out = proc.output
    # before: a second traceback, "WorkerDied ... run the launcher with --restart N", from
    # the controller in the process, after "worker 0 (pid N) failed: KeyboardInterrupt"
    assert out.count("Traceback") == 1 and out.rstrip().endswith("KeyboardInterrupt"), out
    assert "WorkerDied" not in out and "failed" not in out, out
    assert job_segments(job_id) == []
