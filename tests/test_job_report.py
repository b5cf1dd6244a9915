"""What a job reports: a controller thread's failure leads it, and progress counts itself."""

import json
import os
import re
import sys
import threading
import time
import traceback

import pytest

from platoon.errors import ProtocolError, StopRequested
from platoon._controller.threadfailures import ThreadFailures
from test_launcher import EXPERIMENTS, assert_job_gone, job_id_of, launcher_cmd, run_launcher


def test_a_failing_controller_thread_fails_the_job_at_once_and_leads_the_report(tmp_path):
    started = time.monotonic()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "feederfails"), "-n", "2"),
                             tmp_path, timeout=90)
    took = time.monotonic() - started
    assert code == 1, out
    # The workers wait 40 s for a minibatch: the job must not end by their timeout.
    assert took < 25, (took, out)
    report = [line for line in out.splitlines() if "stopped the job" in line]
    assert report and re.match(
        r"platoon-launcher: the controller failed \(exit code 1\): ProtocolError: .*object.*"
        r" \(in thread 'feeder'\)", report[0]), out
    assert not re.search(r"^platoon-launcher: worker\d failed", out, re.M), out
    assert "MinibatchTimeout" not in out, out
    assert_job_gone(job_id_of(out))


def test_serve_raises_a_thread_failure_and_stops_the_workers(procs):
    ctl = procs("feeder_controller.py")
    control, data = ctl.wait_for_line("PORTS").split()[1:]
    worker = procs("mb_worker.py", control, data, "take", 2)  # waits for a second minibatch
    worker.wait_for_line("GOT 0")
    line = ctl.wait_for_line("SERVE RAISED", timeout=15)
    assert re.match(r"SERVE RAISED ProtocolError: .*object", line), ctl.output
    assert ctl.wait_for_line("THREAD FRAMES") == "THREAD FRAMES True", ctl.output
    assert ctl.wait(15) == 0, ctl.output
    # The worker is told to stop (StopRequested ends its `with Worker` as done), at once.
    assert worker.wait(15) == 0, worker.output
    assert "GOT 1" not in worker.output


def test_syncs_and_minibatches_are_counted_without_reports(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "counted"), "-n", "2",
                                          "--status-every-s", "0.5"), tmp_path, timeout=60)
    assert code == 0, out
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    assert status["minibatches"] == 40 and status["syncs"] == 40, status
    assert status["elapsed_s"] > 0 and status["syncs_per_s"] > 0, status
    lines = [line for line in out.splitlines() if "workers alive" in line]
    assert re.search(r"elapsed \d+:\d\d:\d\d \| minibatches 40 \| syncs 40 \([\d.]+/s\)",
                     lines[-1]), out
    assert_job_gone(job_id_of(out))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_thread_failures_keep_the_first_real_failure_and_restore_the_hook():
    def run(target, name):
        thread = threading.Thread(target=target, name=name)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()

    def stopped():
        raise StopRequested("a stop was requested")

    def broken():
        raise ProtocolError("minibatch array 0 has dtype object")

    called = []
    before = threading.excepthook
    failures = ThreadFailures(on_failure=lambda exc, name: called.append(name),
                              ignore=(StopRequested,))
    failures.watch()
    try:
        run(stopped, "feeder")  # an orderly end: not a failure
        run(sys.exit, "quitter")
        assert failures.first is None and not called
        run(broken, "feeder")
        run(broken, "second")
        exc, thread = failures.first
        assert isinstance(exc, ProtocolError) and thread == "feeder" and called == ["feeder"]
        assert "broken" in [f.name for f in traceback.extract_tb(exc.__traceback__)]
    finally:
        failures.close()
    assert threading.excepthook is before
