"""benchmarks.slow_link: its plan, commands, checks and report as pure logic, and one quick
platoon run across a shaped veth link between two network namespaces (root only)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.slow_link import jobs, link, methods, report

from helpers import ROOT


def _run(method, link_name, time_s, steps, *, cap_s=240.0, bytes_window=None, tie=None,
         metric=2.3):
    row = {"method": method, "link": link_name, "cap_s": cap_s, "reached": time_s is not None,
           "time_s": time_s, "best_metric": metric, "steps": steps,
           "bytes_window": bytes_window, "bytes_job": bytes_window,
           "compute_share": [0.9] * len(steps)}
    if tie:
        row["tie"] = tie
    return row


def _report(runs):
    meta = {"quick": False, "model_bytes": 1483776, "cap_s": 240.0, "reps": 1,
            "cpu": "AMD EPYC", "cores": 2, "commit": "abc1234", "date": "2026-11-27 07:00 UTC",
            "load_start": 0.5, "load_end": 1.5, "seconds": 1400.0,
            "command": "python -m benchmarks.slow_link"}
    problem = {"name": "stdlib", "target": 2.2, "hidden": 256, "batch": 16, "bptt": 64}
    one_host = {n: m.one_host for n, m in methods.METHODS.items()}
    return {"meta": meta, "problem": problem, "methods": {"ddp": "torch DDP, gloo"},
            "skipped": ["platoon_diloco_f32 over 10mbit (no --tie-outer)"],
            "summary": report.summarise(runs, one_host), "runs": runs}


def test_the_table_gives_times_bounds_bytes_and_ratios():
    tie = [{"node": 0, "tie_rounds": 40, "tie_bytes_sent": 6e7, "cpu_s": 2.0},
           {"node": 1, "tie_rounds": 40, "tie_bytes_sent": 6e7, "cpu_s": 2.5}]
    runs = [_run("single", "none", 55.0, [3000]),
            _run("platoon_easgd_f32", "none", 30.0, [1500, 1500]),
            _run("ddp", "100mbit", None, [1700, 1700], bytes_window=[2.5e9, 2.5e9]),
            _run("platoon_easgd_f32", "100mbit", 33.0, [1600, 1650],
                 bytes_window=[6.0e7, 6.1e7], tie=tie),
            _run("platoon_easgd_int8", "100mbit", 36.0, [1700, 1700],
                 bytes_window=[1.5e7, 1.6e7], tie=tie),
            _run("platoon_easgd_f32", "10mbit", None, [900, 950], bytes_window=[3e8, 3e8],
                 metric=2.41)]
    rep = _report(runs)
    rows = {(s["link"], s["method"]): s for s in rep["summary"]}
    f32 = rows["100mbit", "platoon_easgd_f32"]
    assert f32["vs_ddp"] == [33.0 / 240.0, "<"]  # DDP missed: a bound
    assert f32["vs_one_host"] == [1.1, "="] and f32["one_host_ref"] == "platoon_easgd_f32"
    assert abs(f32["bytes_vs_ddp"] - 1.21e8 / 5e9) < 1e-12
    int8 = rows["100mbit", "platoon_easgd_int8"]
    assert int8["one_host_ref"] == "platoon_easgd_f32" and int8["vs_one_host"][0] == 1.2
    slow = rows["10mbit", "platoon_easgd_f32"]
    assert slow["not_reached"] and slow["time_s"] == 240.0 and slow["vs_one_host"][1] == ">"
    text = report.markdown(rep)
    lines = {ln.split(" | ")[0] + "|" + ln.split(" | ")[1]: ln for ln in text.splitlines()
             if ln.startswith("| ") and not ln.startswith("| link")}
    assert "< 0.14x" in lines["| 100 Mbit/s|platoon_easgd_f32"]
    assert "60.0 / 61.0" in lines["| 100 Mbit/s|platoon_easgd_f32"]
    assert "< 1/41" in lines["| 100 Mbit/s|platoon_easgd_f32"]
    assert "1.20x (of platoon_easgd_f32)" in lines["| 100 Mbit/s|platoon_easgd_int8"]
    assert "not in 240 s, best 2.410" in lines["| 10 Mbit/s|platoon_easgd_f32"]
    assert "not in 240 s" in lines["| 100 Mbit/s|ddp"]
    assert "| 40, 40 | 2.0, 2.5 |" in lines["| 100 Mbit/s|platoon_easgd_f32"]
    assert text.index("| one host | single") < text.index("| 10 Mbit/s") \
        < text.index("| 100 Mbit/s | ddp") < text.index("| 100 Mbit/s | platoon_easgd_f32")
    assert "load average 0.50 at the start and 1.50 at the end" in text
    assert "Not run: platoon_diloco_f32 over 10mbit" in text


def test_the_report_round_trips_through_json(tmp_path):
    rep = _report([_run("single", "none", 55.0, [3000]),
                   dict(_run("ddp", "10mbit", None, [100, 100]), error="RuntimeError: x")])
    base = report.write(json.loads(json.dumps(rep)), False, str(tmp_path))
    with open(base + ".md") as f:
        text = f.read()
    assert text == report.markdown(rep)
    assert "Failed runs:\n- ddp over 10mbit: RuntimeError: x" in text


def test_the_plan_and_its_estimate():
    plan = methods.pairs()
    assert ("single", "none") in plan and ("ddp", "10mbit") in plan
    assert all(link_name == "none" for m, link_name in plan if m == "single")
    # every method but the AdamW advice's (the LSTM's SGD was not what it was found for)
    assert {m for m, _ in plan} == set(methods.METHODS) - {"platoon_easgd_every2_f32"}
    assert methods.pairs(["single", "ddp"], ["none", "10mbit"]) == [
        ("single", "none"), ("ddp", "none"), ("ddp", "10mbit")]
    assert methods.pairs(None, ["1gbit"]) == [("ddp", "1gbit"), ("platoon_easgd_f32", "1gbit")]
    with pytest.raises(ValueError, match="unknown method"):
        methods.pairs(["nope"], None)
    with pytest.raises(ValueError, match="unknown link"):
        methods.pairs(None, ["56k"])
    from benchmarks.language_model.methods import FULL
    total = sum(methods.estimate_s(m, lk, 240.0, methods.model_bytes_of(FULL))
                for m, lk in plan)
    assert 15 * 60 < total < 27 * 60  # the default measured run: about 25 minutes
    # DDP at 10 Mbit/s is link-bound: it runs to its cap
    assert methods.estimate_s("ddp", "10mbit", 240.0, 1483776) > 240.0
    lrs = methods.learning_rates()
    assert lrs["platoon_easgd_f32"] == lrs["platoon_diloco_int8"] > 0


def test_a_method_is_its_options_and_needs_them_in_this_checkout():
    diloco = methods.METHODS["platoon_diloco_int8"]
    assert diloco.options[:2] == ("--tie-every-s", "1")
    assert methods.unsupported(diloco, "--tie-every-s --tie-compress") == [
        "--tie-outer", "--tie-outer-lr", "--tie-outer-momentum"]
    assert methods.unsupported(methods.METHODS["ddp"], "") == []


def test_model_bytes_match_the_model():
    torch = pytest.importorskip("torch")
    from benchmarks.language_model.methods import FULL, QUICK
    for problem in (FULL, QUICK):
        net = problem.model(0)
        assert methods.model_bytes_of(problem) == 4 * sum(p.numel() for p in net.parameters())
    del torch


class _Hosts:
    def prefix(self, side):
        return ["in", str(side)]

    def mpiexec(self, mpiexec):
        return ["in", "0", mpiexec, "-n", "2"]


def test_commands_of_each_kind():
    (single,) = jobs.commands("single", "none", "C", "R", 10, "mpiexec")
    assert single[0][-3:] == ["benchmarks.slow_link.train", "C", "0"] and single[1] == {}
    ddp = jobs.commands("ddp", "10mbit", "C", "R", 10, "mpiexec", _Hosts())
    assert [c[:2] for c, _ in ddp] == [["in", "0"], ["in", "1"]]
    assert all(env == {"GLOO_SOCKET_IFNAME": link.DEVICE} for _, env in ddp)
    (node,) = jobs.commands("platoon_easgd_int8", "10mbit", "C", "R", 10, "mpiexec", _Hosts())
    argv, env = node
    assert argv[:5] == ["in", "0", "mpiexec", "-n", "2"] and env == link.MPI_TCP_ENV
    assert argv[argv.index("--controller-args") + 1] == "R 10"
    assert argv[argv.index("--tie-compress") + 1] == "int8"
    assert argv[argv.index("--") + 1:] == [sys.executable, "-m", "benchmarks.slow_link.train",
                                           "C"]
    (local,) = jobs.commands("platoon_easgd_f32", "none", "C", "R", 10, "mpiexec")
    assert local[0][:3] == ["mpiexec", "-n", "2"] and local[1] == {}  # shared memory


def test_a_run_whose_traffic_missed_the_veth_fails_loudly():
    tie = [{"node": n, "tie_rounds": 10, "tie_bytes_sent": 10 * 1000, "cpu_s": 0.1}
           for n in range(2)]
    row = {"link": "100mbit", "tie": tie, "bytes_job": [10500, 300], "steps": [40, 40]}
    with pytest.raises(jobs.LinkNotCrossed, match="node 1's veth end sent 300 bytes"):
        jobs.check_crossed("platoon_easgd_f32", row, 1000)
    jobs.check_crossed("platoon_easgd_f32", dict(row, bytes_job=[10500, 10400]), 1000)
    with pytest.raises(jobs.LinkNotCrossed, match="gloo did not cross"):
        jobs.check_crossed("ddp", dict(row, bytes_job=[40000, 20000]), 1000)
    jobs.check_crossed("local_sgd", dict(row, bytes_job=[3000, 3000]), 1000)  # period 16


def _skip_without_two_hosts():
    why = link.missing()
    if why:
        pytest.skip("two network namespaces: " + why)
    pytest.importorskip("torch")
    try:
        from mpi4py import MPI  # noqa: F401
    except ImportError as exc:
        pytest.skip("mpi4py cannot be imported: %s" % exc)
    from platoon._os.process import find_mpiexec
    if find_mpiexec() is None:
        pytest.skip("no mpiexec: pip install -e '.[mpi]'")


@pytest.mark.slow  # about 15 s idle: start-up, 2 s of training (a tie round a second)
@pytest.mark.timeout(150)
def test_a_quick_platoon_run_crosses_the_shaped_link(tmp_path):
    _skip_without_two_hosts()
    cmd = [sys.executable, "-m", "benchmarks.slow_link", "--quick", "--links", "100mbit",
           "--methods", "platoon_easgd_f32", "--cap-s", "2", "--out", str(tmp_path)]
    before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the benchmark cleans up on SIGTERM
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail("the quick run did not finish in 120 s:\n" + out[-4000:])
    finally:
        link.remove_stale()  # the benchmark's namespaces, if it died before removing them
        _stop_session(proc.pid)
    assert proc.returncode == 0, out[-4000:]
    with open(tmp_path / "slow_link_quick.json") as f:
        rep = json.load(f)
    (run,) = rep["runs"]
    assert "error" not in run, run
    assert run["method"] == "platoon_easgd_f32" and run["link"] == "100mbit"
    assert len(run["steps"]) == 2 and min(run["steps"]) > 0
    assert run["reached"] or run["best_metric"] is not None
    assert all(0 < c <= 1.2 for c in run["compute_share"]), run["compute_share"]
    model = rep["meta"]["model_bytes"]
    rounds = [t["tie_rounds"] for t in run["tie"]]
    assert min(rounds) >= 2, run["tie"]
    for side in range(2):  # each end sent a model per round (float32), but a node that
        # finished first sits out the final one
        assert run["bytes_job"][side] >= (min(rounds) - 1) * model, (run["bytes_job"], rounds)
        assert run["bytes_window"][side] > model, run["bytes_window"]
    (row,) = rep["summary"]
    assert set(row) >= {"time_s", "steps", "bytes_window", "compute_share", "vs_ddp",
                        "vs_one_host", "tie_rounds"}
    with open(tmp_path / "slow_link_quick.md") as f:
        assert "| 100 Mbit/s | platoon_easgd_f32 |" in f.read()
    assert run["left_in_shm"] == [] and not [
        n for n in set(os.listdir("/dev/shm")) - before if "slk%d" % proc.pid in n]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    assert "%s%d" % (link.PREFIX, proc.pid) not in names


def _stop_session(sid):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = jobs._session_pids(sid)  # noqa: SLF001
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def test_skipped_with_the_reason_without_root(monkeypatch, capsys):
    from benchmarks.slow_link import __main__ as cli
    monkeypatch.setattr(link.os, "geteuid", lambda: 1000)
    assert cli.main(["--quick", "--links", "10mbit", "--methods", "ddp"]) == 0
    assert "skipped: not root" in capsys.readouterr().out
    monkeypatch.setattr(link.os, "geteuid", lambda: 0)
    monkeypatch.setattr(link.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    assert cli.main(["--quick", "--links", "10mbit", "--methods", "ddp"]) == 0
    assert "skipped: no `tc` on PATH" in capsys.readouterr().out
    shutil.which("ip")  # (the real one is untouched outside the patch)


def test_committed_results_render_to_the_committed_page():
    path = os.path.join(report.RESULTS, "slow_link.json")
    if not os.path.exists(path):
        pytest.skip("no measured run committed yet: python -m benchmarks.slow_link")
    with open(path) as f:
        rep = json.load(f)
    with open(os.path.join(report.RESULTS, "slow_link.md")) as f:
        assert f.read() == report.markdown(rep), \
            "slow_link.md is stale: python -m benchmarks.slow_link --render"
    assert not rep["meta"]["quick"] and rep["runs"]


def test_the_transformer_workload_takes_its_own_lrs_and_optimizer():
    from benchmarks.slow_link.workloads import TRANSFORMER, optimizer_settings
    from benchmarks.transformer.methods import ADAMW
    with open(TRANSFORMER.tuning) as f:
        chosen = json.load(f)["chosen"]
    lrs = methods.learning_rates(TRANSFORMER)
    assert lrs["single"] == chosen["single"]["lr"] and lrs["ddp"] == chosen["ddp"]["lr"]
    assert lrs["platoon_easgd_f32"] == lrs["platoon_diloco_int8"] == chosen["platoon_easgd"]["lr"]
    assert optimizer_settings(TRANSFORMER) == dict(ADAMW)
    assert report.stem(False, "transformer") == "slow_link_transformer"


def test_the_adamw_advice_runs_every_2_steps_at_one_and_a_half_times_one_process_lr():
    from benchmarks.slow_link.workloads import TRANSFORMER
    advised = methods.METHODS["platoon_easgd_every2_f32"]
    assert advised.settings == {"rule": "easgd", "alpha": 0.45, "tau": 2}
    assert methods.METHODS["platoon_easgd_f32"].settings["tau"] == 4
    lrs = methods.learning_rates(TRANSFORMER)
    assert lrs["platoon_easgd_every2_f32"] == pytest.approx(1.5 * lrs["single"])


@pytest.mark.timeout(120)
def test_a_transformer_run_trains_the_gpt_with_adamw_to_its_horizon(tmp_path):
    pytest.importorskip("torch")
    import dataclasses

    from benchmarks.slow_link.workloads import TRANSFORMER
    problem = dataclasses.replace(TRANSFORMER.problem(), eval_every=10, eval_windows=4,
                                  train_bytes=200_000, valid_bytes=50_000, target=0.5)
    optimizer = {"optimizer": "adamw", "horizon": 20, "lr": 1e-2}
    config = jobs._config("single", "none", problem, optimizer, 60.0, 1, str(tmp_path))  # noqa: SLF001
    assert config["problem_class"] == "GPTText" and config["cfg"]["optimizer"] == "adamw"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "benchmarks.slow_link.train", str(path), "0"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "rank-0.json").read_text())
    assert result["steps"] == 20  # stopped at the schedule's horizon, the target unreached
    assert [s for _, s, _ in result["trace"]] == [10, 20]
