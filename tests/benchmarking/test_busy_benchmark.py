"""benchmarks.bench_busy (`python -m benchmarks --only busy`) at its smallest: every row is
measured, idle and beside the busy neighbour, and rendered; the neighbour is gone after.
(No figure is checked: only a quiet machine gives meaningful ones.)"""

import os

from benchmarks import bench_busy, run


def test_the_busy_rows_run_and_render():
    with bench_busy.neighbour() as busy:
        minibatches = bench_busy.minibatches((4, 4), 20, 2, busy)
        syncs = bench_busy.start_sync_vs_sync(1000, 2, 1, busy)
    for condition in ("idle", "busy"):
        assert len(minibatches[condition]["ratios"]) == 2
        assert minibatches[condition]["ratio"] > 0
        assert syncs[condition]["ratio"] > 0
        cpu = minibatches[condition]["cpu_us"]  # each side's CPU per minibatch, counted
        assert all(cpu[mode][side] > 0 for mode in ("raw", "platoon")
                   for side in ("sender", "receiver"))
    results = {"busy": {"16 KiB": minibatches, "sync": syncs, "rounds": 2}}
    rows = [r for r in run.table(results) if "busy neighbour" in r[0] or "idle (" in r[0]]
    assert len(rows) == 4 and all(r[3].endswith("x") for r in rows)
    assert all("CPU us per minibatch" in r[0] for r in rows if "minibatches" in r[0])


def test_the_neighbour_spins_on_this_process_s_cores_and_dies_with_the_block():
    with bench_busy.neighbour() as busy:
        busy(True)
        children = _children()
        assert len(children) == 1
        (pid,) = children
        assert os.sched_getaffinity(pid) == os.sched_getaffinity(0)
        busy(False)
    assert pid not in _children()


def _children():
    me = str(os.getpid())
    out = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/stat" % p) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                out.add(int(p))
    return out
