"""benchmarks.lighthouse_scale: one small real run (a lighthouse process, two simulators and
a probe, niced) and its report."""

import pytest

from benchmarks.lighthouse_scale.__main__ import render, run, served


def test_a_small_run_reports_timeouts_by_cause_and_the_lighthouses_own_work():
    # (a lighthouse of 100 heartbeats a second: 20 nodes at its pace, 0.2 s, not their 0.1 s)
    row = run(20, procs=2, probe=4, seconds=1.5, interval=0.1, grace=0.1, nice=10,
              heartbeats_per_s=100)
    assert row["registered"] == 20 and row["saw_quorum_of_all"] == 20
    assert row["pace_s"] == pytest.approx(0.2) and row["max_heartbeats_per_s"] == 100
    assert row["simulators_nice"] == 10
    assert set(row["timeouts_by_cause"]) == {"connecting", "registered"}
    assert row["timeouts"] == sum(row["timeouts_by_cause"].values())
    assert row["listen_overflows"] >= 0
    # the lighthouse's own counts, from its last log line: none of these nodes dropped
    assert row["lighthouse_dropped"] == 0 and row["lighthouse_refused"] == 0
    assert row["requests_per_read"] >= 1 and row["lighthouse_thread_cpu_us_per_request"] > 0
    record = {"procs": 2, "probe": 4, "load": "0.5", "machine": "2 cores", "rows": [row]}
    table = render(record).splitlines()
    assert "timeouts (connecting / registered)" in table[-3]
    assert table[-1].startswith("| 20 | 10 | 0.2 s | ")


def test_the_lighthouses_last_line_is_read_for_its_counts():
    line = ("lighthouse: served 1200 requests in 300 reads (4 a read); dropped 2, refused 1; "
            "its thread's CPU 0.030 s (25 us a request)")
    assert served("lighthouse: quorum 1: a\n" + line + "\n") == {
        "requests_read": 1200, "reads": 300, "dropped": 2, "refused": 1, "thread_cpu_s": 0.03}
    assert served("lighthouse: killed before its last line\n") == {}
