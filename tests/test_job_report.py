"""What a job reports: a controller thread's failure leads it, and progress counts itself."""

import io
import json
import os
import re
import sys
import threading
import time
import traceback

import pytest
from test_launcher import EXPERIMENTS, assert_job_gone, job_id_of, launcher_cmd, run_launcher

from platoon._controller.status import Progress
from platoon._controller.threadfailures import ThreadFailures
from platoon._os.statusfile import MAX_METRICS, MAX_TEXT
from platoon.errors import ProtocolError, StopRequested
from platoon.launch.cli import Launch, parse_args


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


def test_reported_metrics_are_bounded_and_what_is_not_kept_is_counted(tmp_path):
    """Six reports of 40,000 names made an 8.6 MB status.json and 3.8 MB status lines: the
    first MAX_METRICS names are kept, long names dropped, long values cut, and the rest
    counted, in the status file and in the launcher's summary."""
    path = tmp_path / "status.json"
    progress = Progress(str(path), lambda: (1, 0))
    started = time.monotonic()
    for _ in range(6):
        progress.add(0, 1, 0, {"m%05d" % i: float(i) for i in range(40000)})
    progress.add(1, 1, 0, {"n" * 65: 1.0, "text": "t" * 1000, "big": 10 ** 400,
                           "nested": {"a": list(range(1000))}, "m00000": -1.0})
    progress.write(force=True)
    assert time.monotonic() - started < 5
    assert path.stat().st_size < 10_000, path.stat().st_size
    status = json.loads(path.read_text())
    assert sorted(status["metrics"]) == ["m%05d" % i for i in range(MAX_METRICS)]
    assert status["metrics"]["m00000"] == -1.0  # a kept name takes its latest value
    assert status["reports"]["0"]["metrics_dropped"] == 6 * (40000 - MAX_METRICS)
    worker1 = status["reports"]["1"]
    assert worker1["metrics_dropped"] == 1  # the long name (4 not kept in the job's metrics)
    assert worker1["metrics"]["text"] == "t" * (MAX_TEXT - 1) + "…"
    assert worker1["metrics"]["big"] == "an integer of 1329 bits"
    assert len(worker1["metrics"]["nested"]) == MAX_TEXT and "n" * 65 not in worker1["metrics"]
    assert status["metrics_dropped"] == 6 * (40000 - MAX_METRICS) + 4
    launch = Launch(parse_args(["x.py", "--log-dir", str(tmp_path)]), out=io.StringIO())
    summary = "\n".join(launch.summary())
    assert "worker 0 last reported: m00000 0, m00001 1, " in summary, summary
    assert "(6 minibatches, 0 syncs, 239808 metrics not kept)" in summary, summary
    assert ("  239812 reported metrics were not kept: the controller keeps the first %d metric "
            "names (of up to 64 characters) for the job and for each worker; report fewer"
            % MAX_METRICS) in summary, summary
    assert len(summary) < 5000
