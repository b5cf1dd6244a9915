"""benchmarks.elastic_faults as pure logic: the fault schedule every member shares, the
accounting of a run (useful steps, goodput, a joiner's time to its first contributing round,
each node's steps a second) and the goals the report checks; and one quick race of the member
with a throttled node across three network namespaces (root only)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from benchmarks.elastic_faults import report
from benchmarks.elastic_faults.race import MEMBERS
from benchmarks.elastic_faults.schedule import Incarnation, account, fault_schedule
from benchmarks.slow_link import jobs, link

from helpers import ROOT, long_run


def test_the_fault_schedule_is_the_seeds_alone_and_never_kills_a_node_that_is_down():
    faults = fault_schedule(33, horizon_s=600, every_s=60, down_s=10, jitter_s=5)
    assert faults == fault_schedule(33, horizon_s=600, every_s=60, down_s=10, jitter_s=5)
    assert faults != fault_schedule(34, horizon_s=600, every_s=60, down_s=10, jitter_s=5)
    assert 9 <= len(faults) <= 10 and faults[-1].kill_s < 600
    previous = -30.0  # the first kill half a gap in
    for before, fault in zip([None] + faults, faults):
        assert 55 <= fault.kill_s - previous <= 65 and fault.restart_s == fault.kill_s + 10
        assert before is None or before.node != fault.node
        previous = fault.kill_s
    with pytest.raises(ValueError, match="killed before it is back"):
        fault_schedule(1, 100, every_s=12, down_s=10, jitter_s=5)


def _steps(start, rate, until, every=1.0):
    """(time, steps) every `every` s from `start` to `until` at `rate` steps a second."""
    out, t = [], start
    while t <= until:
        out.append((t, int((t - start) * rate)))
        t += every
    return out


def test_a_killed_node_keeps_only_its_steps_before_its_last_contribution():
    # a and b train 100 s at 10 steps/s; c is killed at 50 s (its last round at 47 s) and
    # started again at 60 s, contributing from 63.5 s (its own report: 3.5 s)
    a = Incarnation("a", 0.0, steps=_steps(0, 10, 100), rounds=[5.0, 47.0, 90.0], step_s=0.05)
    b = Incarnation("b", 0.0, steps=_steps(0, 10, 100), rounds=[5.0, 47.0, 90.0], step_s=0.05)
    c0 = Incarnation("c", 0.0, ended=50.0, steps=_steps(0, 10, 50), rounds=[5.0, 47.0],
                     step_s=0.05)
    c1 = Incarnation("c", 60.0, steps=_steps(60, 10, 100), rounds=[63.5, 90.0], step_s=0.05,
                     first_contribution_s=3.5, loaded=62.0)
    out = account([a, b, c0, c1], start=0.0, end=100.0)
    assert out["steps"] == 1000 + 1000 + 500 + 400
    assert out["useful_steps"] == 1000 + 1000 + 470 + 400  # c lost 47-50 s: 30 steps
    assert out["steps_possible"] == pytest.approx(3 * 100 / 0.05)
    assert out["goodput"] == pytest.approx(2870 / 6000)
    assert account([a, b, c0, c1], 0.0, 100.0, kills=[(50.0, "c")])["survivors_go_on_s"] \
        == [40.0]  # a and b: their next round at 90 s
    assert out["joiners"] == [{"node": "c", "started_s": 60.0, "first_contribution_s": 3.5,
                               "worker_started_s": None, "worker_loaded_s": 2.0,
                               "healed_s": None, "on_the_way": None, "window_s": 40.0}]
    assert out["nodes"]["a"] == {"steps": 1000, "train_s": 0.0, "steps_per_s": None}
    a.trained_from, c0.trained_from, c1.trained_from = 0.0, 0.0, 62.0
    nodes = account([a, b, c0, c1], start=0.0, end=100.0)["nodes"]
    assert nodes["a"] == {"steps": 1000, "train_s": 100.0, "steps_per_s": 10.0}
    assert nodes["c"] == {"steps": 900, "train_s": 88.0, "steps_per_s": 900 / 88.0}  # 50 + 38 s


def test_a_fixed_world_job_goes_back_to_its_checkpoints_and_its_joiners_to_their_first_round():
    # the whole job dies at 50 s (one node killed) and restarts at 60 s from checkpoints of
    # 45 s; each node's first round in the new job comes 7 s after the restart command
    first = [Incarnation(n, 0.0, ended=50.0, steps=_steps(0, 10, 50), rounds=[10.0, 48.0],
                         checkpoints=[40.0, 45.0, 51.0], step_s=0.05) for n in "abc"]
    again = [Incarnation(n, 60.0, steps=_steps(60, 10, 100), rounds=[67.0, 80.0],
                         checkpoints=[70.0], step_s=0.05) for n in "abc"]
    out = account(first + again, start=0.0, end=100.0, kills=[(50.0, "c")])
    assert out["survivors_go_on_s"] == [None]  # no node survives
    assert out["useful_steps"] == 3 * (450 + 400)  # the checkpoint at 51 s came after death
    assert [j["first_contribution_s"] for j in out["joiners"]] == [7.0, 7.0, 7.0]
    never = Incarnation("c", 95.0, steps=[], rounds=[])  # started, no round before the end
    assert account([never], 0.0, 100.0)["joiners"] == []
    assert account(first[2:] + [never], 0.0, 100.0)["joiners"][0]["first_contribution_s"] \
        is None


def _row(member, time_s, joiners=(), cap_s=300.0, rates=None):
    return {"member": member, "cap_s": cap_s, "reached": time_s is not None, "time_s": time_s,
            "nodes": {n: {"steps_per_s": r} for n, r in (rates or {}).items()},
            "slowdown": {"c": 2.0} if member.endswith("_slow") else {},
            "equal": member[:-len("_slow")] if member.endswith("_slow") else "",
            "steps": 4000, "useful_steps": 3900, "steps_possible": 9000, "goodput": 3900 / 9000,
            "bytes_total": 5e7, "faults": [[61.0, "kill", "c"], [71.0, "restart", "c"]],
            "joiners": [{"node": n, "started_s": at, "first_contribution_s": j,
                         "worker_started_s": 1.0, "worker_loaded_s": 2.0} for n, at, j in joiners],
            "load_before": 1.5, "survivors_go_on_s": [5.4] if joiners else []}


def test_the_report_states_each_goal_met_or_missed():
    runs = [_row("elastic", 100.0),
            _row("elastic_faults", 120.0, joiners=[("c", 71.0, 3.1), ("b", 128.0, 4.6)]),
            # the MPI job restarts every node at once: its slowest node counts
            _row("mpi_faults", 200.0, joiners=[(n, 71.0, j) for n, j in zip("abc", [7, 9, 8])]),
            _row("torchft_faults", None)]
    summary = report.summarise(runs)
    assert list(summary) == list(report.ORDER)[:4]
    assert summary["torchft_faults"]["not_reached"] and summary["torchft_faults"]["time_s"] \
        == 300.0
    goals = {text.split(" <=")[0].split(" within")[0]: (shown, met)
             for text, shown, met in report.goals(summary)}
    assert goals["vs its own fault-free time"] == ("1.20x", False)  # over 1.15x: a miss
    assert goals["vs the fixed-world job's"] == ("0.60x", True)
    assert goals["vs torchft's DiLoCo"] == ("< 0.40x", True)  # torchft missed its target
    assert goals["a joiner contributes"] == ("worst 4.6 s", False)
    assert goals["the survivors go on"] == ("worst 5.4 s", True)
    late = dict(runs[1], joiners=[dict(runs[1]["joiners"][0], first_contribution_s=3.1),
                                  dict(runs[1]["joiners"][1], first_contribution_s=None,
                                       window_s=2.0)])  # the target came 2 s after its start
    assert report.goals(report.summarise([late]))[-1][1:] == ("worst 3.1 s", True)
    late["joiners"][1]["window_s"] = 6.0  # it had 6 s and made no round
    assert report.goals(report.summarise([late]))[-1][1:] == (
        "worst 3.1 s, 1 never contributed", False)
    meta = {"quick": True, "every_s": 60.0, "link": "100 Mbit/s", "cfg": {"lr": 2.0,
            "momentum": 0.9}, "torchft_cfg": {"lr": 0.5}, "down_s": 10.0, "fault_seed": 33,
            "schedule_text": "c at 61 s",
            "cap_s": 300.0, "step_s": 0.05, "reps": 1, "seeds": "1", "cpu": "AMD EPYC",
            "cores": 2, "commit": "abc1234", "date": "2026-11-28 08:00 UTC", "load_start": 1.5,
            "load_end": 2.0, "seconds": 900.0, "command": report.COMMAND}
    problem = {"name": "stdlib", "target": 2.2, "hidden": 256, "batch": 16, "bptt": 64,
               "eval_every": 100}
    settings = {"outer_lr": 0.7, "outer_momentum": 0.9, "tie_every_s": 1.0,
                "compress": "int8", "checkpoint_every_s": 5.0, "sync_every": 20,
                "heartbeat_timeout_s": 5.0, "min_nodes": 2}
    text = report.markdown({"meta": meta, "problem": problem, "settings": settings,
                            "members": {"elastic": "platoon elastic, no faults"},
                            "summary": summary, "runs": runs})
    assert ("| elastic_faults | 120.0 s | 1 | 4000 / 3900 / 9000 | 0.43 | 50.0 | 5.4 "
            "| 3.1 [1.0/2.0/-], 4.6 [1.0/2.0/-] |") in text
    assert ("| mpi_faults | 200.0 s | 1 | 4000 / 3900 / 9000 | 0.43 | 50.0 | 5.4 "
            "| 9.0 [1.0/2.0/-] |") in text
    assert "| torchft_faults | not in 300 s |" in text
    assert "vs its own fault-free time <= 1.15x: 1.20x, MISSED" in text
    assert report.stem(False) == "elastic_faults" and report.stem(True, 30.0) \
        == "elastic_faults_every30_quick"  # a record per fault period


def test_the_report_gives_the_others_steps_per_second_against_all_equal():
    equal = {"a": 100.0, "b": 110.0, "c": 105.0}
    runs = [_row("elastic", 100.0, rates=equal), _row("elastic", 104.0, rates=equal),
            _row("elastic_slow", 105.0, rates={"a": 97.0, "b": 106.0, "c": 52.0}),
            _row("mpi", 100.0, rates=equal),
            _row("mpi_slow", 130.0, rates={"a": 90.0, "b": 100.0, "c": 50.0})]
    summary = report.summarise(runs)
    assert summary["elastic_slow"]["slowdown"] == {"c": 2.0}
    assert summary["elastic"]["steps_per_s"] == equal  # medians over the repetitions
    lines = report.unequal(summary)
    assert [(shown.split(" (")[0], met) for _, shown, met in lines] == [
        ("0.97x", True), ("1.05x", ""), ("0.90x", False), ("1.30x", "")]
    assert lines[0][0] == ("the others' steps/s with one node 2x slower vs all-equal >= 0.95x "
                           "(elastic_slow against elastic, node c 2x slower)")
    assert lines[0][1] == "0.97x (a 97.0 against 100.0, b 106.0 against 110.0)"
    assert report.unequal(report.summarise(runs[2:3]))[0][1:] == ("-", None)  # no all-equal
    assert report.unequal(report.summarise(runs[:2])) == []


def _race(args, timeout):
    """Run the race's CLI with `args` (a failure, with its output, past `timeout` s or on a
    non-zero exit): its pid."""
    cmd = [sys.executable, "-m", "benchmarks.elastic_faults"] + args
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the race cleans up on SIGTERM
        try:
            text, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        pytest.fail("the race did not finish in %d s:\n%s" % (timeout, text[-4000:]))
    finally:
        link.remove_stale()  # its namespaces, if it died before removing them
        for pid in jobs._session_pids(proc.pid):  # noqa: SLF001
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, text[-4000:]
    return proc.pid


def _quick_race(out, members, cap_s):
    """Run the race's CLI (--quick: to the small problem's target, or `cap_s`); its record,
    or a failure with its output."""
    pid = _race(["--quick", "--members", members, "--cap-s", str(cap_s), "--out", str(out)],
                   90)
    with open(out / "elastic_faults_quick.json") as f:
        return json.load(f), (out / "elastic_faults_quick.md").read_text(), pid


def _needs_namespaces_and_torch():
    """Skip, saying why, where network namespaces or torch are missing (a race's nodes)."""
    why = link.missing()
    if why:
        pytest.skip("network namespaces: " + why)
    pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(150)
@long_run("three nodes start and train to the small target, about 15 s; the report's "
          "unequal-nodes figures are checked above from a record")
def test_a_throttled_node_makes_about_half_the_others_steps(tmp_path):
    _needs_namespaces_and_torch()
    assert MEMBERS["elastic_slow"].slowdown() == {"c": 2.0}
    rep, text, pid = _quick_race(tmp_path, "elastic_slow", 40)
    (run,) = rep["runs"]
    assert "error" not in run, run
    steps = {n: r["steps"] for n, r in run["nodes"].items()}
    assert set(steps) == {"a", "b", "c"} and min(steps.values()) > 0, run["nodes"]
    # its steps take twice as long: by count, about half the others' (fewer where the
    # others take the core it leaves)
    assert steps["c"] < 0.75 * min(steps["a"], steps["b"]), steps
    assert all(0 < r["train_s"] <= run["run_s"] for r in run["nodes"].values()), run
    assert run["slowdown"] == {"c": 2.0} and run["equal"] == "elastic"
    assert "| steps/s per node |" in text and "(2x slower) |" in text
    assert ("the others' steps/s with one node 2x slower vs all-equal >= 0.95x "
            "(elastic_slow against elastic, node c 2x slower): -, not measured") in text
    assert run["left_in_shm"] == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    assert "%s%d" % (link.PREFIX, pid) not in names


def test_a_joiners_chain_on_a_script_comes_from_its_probe_and_its_nodes_line():
    """The breakdown of `--script`: the probe's events (python's start, the script's first
    line, its imports, the calls of its `main`) and the node's first-contribution line (its
    milestones on the way), in seconds from the start command, in time order."""
    from benchmarks.elastic_faults.script import breakdown
    t = 1000.0
    events = [{"ev": "probe", "t": t + 0.5, "process_started": t + 0.4, "first_line": t + 0.5},
              {"ev": "imported", "name": "torch", "t": t + 2.0},
              {"ev": "imported", "name": "platoon", "t": t + 2.1}] + [
        {"ev": "returned", "name": name, "t": t + at} for name, at in [
            ("ArgumentParser.parse_args", 2.2), ("__getattr__", 2.3),
            ("renamed_keywords.<locals>.decorate.<locals>.accept_old_names", 2.4),
            ("shard", 2.41), ("read_bytes", 2.6), ("batchify", 2.7), ("CharLM.__init__", 2.8),
            ("Module.to", 2.9), ("PeriodicSync.__init__", 3.6)]]
    log = ("2026-11-29 WARNING: node c: first contributing round 3.90 s after its start "
           "(outer round 7; round 2 of its group in quorum 4; on the way: centre 3.00 s, "
           "heartbeating 3.01 s, group 3.30 s, healed 3.50 s)\n")
    steps, first = breakdown(t, events, log)
    assert first == 3.9
    assert steps == [("python started", 0.4), ("the script's first line", 0.5),
                     ("torch imported", 2.0), ("platoon imported", 2.1),
                     ("platoon's Worker class imported", 2.3), ("Worker() registered", 2.4),
                     ("data read", 2.7), ("model built", 2.9),
                     ("node: centre created (init_shared_params)", 3.0),
                     ("node: heartbeating", 3.01), ("node: in its group", 3.3),
                     ("node: healed", 3.5),
                     ("sync set up (its first step from the anchor)", 3.6),
                     ("first contributing round", 3.9)]
    assert breakdown(t, events[:1], "")[1] is None  # killed before: what it reached
    from benchmarks.elastic_faults.race import on_the_way  # (the project race's, too)
    assert on_the_way(log) == (3.9, {"centre": 3.0, "heartbeating": 3.01, "group": 3.3,
                                     "healed": 3.5})
    assert on_the_way("no such line") == (None, {})


@pytest.mark.slow
@pytest.mark.timeout(180)
@long_run("three nodes start, one is killed and started again, about 35 s; its breakdown is "
          "checked above from a probe's and a node's lines")
def test_the_script_race_gives_a_joiners_chain_on_examples_lm(tmp_path):
    _needs_namespaces_and_torch()
    pid = _race(["--script", "--quick", "--out", str(tmp_path)], 150)
    with open(tmp_path / "elastic_faults_script_quick.json") as f:
        (run,) = json.load(f)["runs"]
    steps = dict(run["steps"])
    assert run["first_contribution_s"] == steps["first contributing round"] > 0
    for name in ("python started", "torch imported", "Worker() registered", "model built",
                 "node: centre created (init_shared_params)", "node: healed"):
        assert 0 <= steps[name] <= run["first_contribution_s"], (name, run["steps"])
    assert "| first contributing round |" in (tmp_path / "elastic_faults_script_quick.md"
                                             ).read_text()
    assert run["left_in_shm"] == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    assert "%s%d" % (link.PREFIX, pid) not in names
