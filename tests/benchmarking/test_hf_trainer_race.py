"""benchmarks.hf_trainer_race: the command line of each method, the report, and (with
PLATOON_LONG_TESTS=1) a platoon job of the race end to end with a straggler."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.hf_trainer_race.__main__ import (
    METHODS,
    QUICK,
    SCRIPT,
    best_point,
    command,
    crossing_step,
    markdown,
    summarise,
    tuning_table,
)

from helpers import ROOT, long_run


def test_each_method_runs_as_its_own_kind_of_job():
    """One process is the script; DDP is torchrun with 2 ranks; platoon is the launcher with
    2 workers, the script's arguments after --; the slowed rank and settings reach the
    script."""
    argv = {m: command(m, {"lr": 0.01, "sync_every": 20}, "/out", 3, 1, QUICK) for m in METHODS}
    tail = ["/out", "--method"]
    assert argv["single"][1:3] == [SCRIPT, "/out"]
    assert argv["ddp"][1:7] == ["-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", "2", SCRIPT]
    for name in ("platoon_easgd", "platoon_diloco"):
        line = argv[name]
        assert line[1:5] == ["-m", "platoon.launch.cli", "-n", "2"]
        assert line[line.index(SCRIPT) + 1:line.index(SCRIPT) + 4] == ["--"] + tail
    for name, line in argv.items():
        args = line[line.index("/out"):]
        assert args[args.index("--method") + 1] == name
        for flag, value in (("--seed", "3"), ("--slow-rank", "1"), ("--lr", "0.01"),
                            ("--sync-every", "20"), ("--target", str(QUICK["target"]))):
            assert args[args.index(flag) + 1] == value, (name, flag)


def test_the_report_gives_ratios_and_every_runs_load():
    def run(method, seed, slow, reached, load):
        return {"method": method, "settings": {"lr": 0.01}, "seed": seed, "slow_rank": slow,
                "load_before": load, "reached": reached, "steps": 900, "ranks": []}
    runs = [run("single", 1, -1, [80.0, 2000], 1.5), run("ddp", 1, -1, [50.0, 1100], 2.5),
            run("platoon_easgd", 1, -1, [40.0, 1300], 2.25),
            run("platoon_easgd", 2, -1, None, 3.0), run("ddp", 1, 1, [90.0, 1100], 2.0),
            run("platoon_easgd", 1, 1, [45.0, 1400], 2.0)]
    summary = summarise(runs)
    assert summary["platoon_easgd"]["measure"] == {"runs": 2, "reached": 1, "time_s": 40.0,
                                                   "steps": 1300.0}
    report = {"summary": summary, "runs": runs, "problem": {"target": 1.6},
              "chosen": {m: {"lr": 0.01} for m in METHODS},
              "meta": {"commit": "abc", "date": "today", "cpu": "cpu", "reps": 1,
                       "seconds": 300.0}}
    text = markdown(report)
    assert "| platoon_easgd | lr 0.01 | 1/2 | 40.0 s | 1300 | 0.50x | 0.80x |" in text
    assert "| platoon_easgd | 1/1 | 45.0 s | 1400 | 0.50x |" in text  # against DDP slowed
    assert "| platoon_easgd | 2 | - | 3.0 | not reached | 900 |" in text
    assert "| ddp | 1 | rank 1 | 2.0 | 90.0 s | 1100 |" in text


def test_tuning_picks_the_fewest_steps_by_the_interpolated_crossing():
    """Two lrs that first see the target at the same evaluation are told apart by where
    their loss crossed it between evaluations (the job's earliest rank); a run that never
    reached it loses; the table marks the chosen point."""
    def run(lr, *traces):
        ranks = [{"trace": [[step, step / 20.0, loss] for step, loss in trace]}
                 for trace in traces]
        last = traces[0][-1]
        reached = [last[0] / 20.0, last[0]] if last[1] <= 1.6 else None
        return {"settings": {"lr": lr}, "ranks": ranks, "reached": reached,
                "load_before": 1.0}
    late = run(0.01, [(100, 2.0), (200, 1.7), (300, 1.5)])  # crossed at 250
    early = run(0.02, [(100, 2.0), (200, 1.9), (300, 1.5)],  # rank 0 at 275
                [(100, 2.0), (200, 1.61), (300, 1.56)])  # rank 1 at 220
    never = run(0.04, [(100, 2.0), (200, 1.9), (300, 1.8)])
    assert crossing_step(late, 1.6) == pytest.approx(250.0)
    assert crossing_step(early, 1.6) == pytest.approx(220.0)
    assert crossing_step(never, 1.6) is None
    assert best_point([never, late, early], 1.6) == {"lr": 0.02}
    table = tuning_table({"single": {"chosen": {"lr": 0.02}, "runs": [late, early, never]}}, 1.6)
    assert "| single | lr 0.02 | yes | 300 (220) | 15.0 s | 1.0 |" in table
    assert "| single | lr 0.04 |  | not reached (best 1.8) | - | 1.0 |" in table


@pytest.mark.slow
@pytest.mark.timeout(240)
@long_run("the race end to end runs two Trainer processes (~20 s on 2 cores)")
def test_a_platoon_job_of_the_race_runs_with_a_straggler(tmp_path):
    """--quick: a platoon job (EASGD) with rank 1 slowed 2x reaches the (easy) target, both
    workers evaluate the centre, and the report records it with its load."""
    pytest.importorskip("transformers")
    cmd = [sys.executable, "-m", "benchmarks.hf_trainer_race", "--quick", "--methods",
           "platoon_easgd", "--reps", "0", "--straggler-reps", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "hf_trainer_race.json").read_text())
    (run,) = report["runs"]
    assert "error" not in run, run["error"]
    assert run["slow_rank"] == 1 and run["reached"][1] == QUICK["eval_every"]
    assert sorted(r["rank"] for r in run["ranks"]) == [0, 1]
    assert "| platoon_easgd | 1 | rank 1 |" in (tmp_path / "hf_trainer_race.md").read_text()


def test_tuning_keeps_the_points_already_recorded(tmp_path, monkeypatch):
    """A grid extended after a --tune runs only its new points; the file holds all of them
    and the choice is made over all."""
    from benchmarks.hf_trainer_race import __main__ as race
    monkeypatch.setitem(race.METHODS, "single", [{"lr": 1.0}, {"lr": 2.0}, {"lr": 3.0}])

    def ran(lr, steps):
        trace = [[100, 5.0, 2.0], [steps, 10.0, 1.5]]
        return {"settings": {"lr": lr}, "ranks": [{"trace": trace}], "reached": [10.0, steps],
                "load_before": 0.0}
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"single": {"chosen": {"lr": 1.0}, "runs": [ran(1.0, 900)]}}))
    asked = []
    monkeypatch.setattr(race, "run_once", lambda name, point, *rest: asked.append(point) or
                        ran(point["lr"], 600 if point["lr"] == 3.0 else 1200))
    tuned = race.tune(["single"], {"target": 1.6}, str(path), print)
    assert asked == [{"lr": 2.0}, {"lr": 3.0}]
    assert tuned["single"]["chosen"] == {"lr": 3.0}
    assert [r["settings"]["lr"] for r in json.loads(path.read_text())["single"]["runs"]] == \
        [1.0, 2.0, 3.0]


def test_render_writes_the_markdown_again_with_the_grid_as_extended(tmp_path):
    """--render runs nothing: the recorded runs' tables, and the tuning table as it is now."""
    from benchmarks.hf_trainer_race import __main__ as race
    run = {"method": "single", "settings": {"lr": 0.01}, "seed": 1, "slow_rank": -1,
           "load_before": 1.0, "reached": [80.0, 2000], "steps": 2000,
           "ranks": [{"trace": [[1000, 40.0, 2.0], [2000, 80.0, 1.5]]}]}
    report = {"meta": {"commit": "abc", "date": "today", "cpu": "cpu", "reps": 1,
                       "seconds": 90.0, "complete": True},
              "problem": {"target": 1.6}, "chosen": {"single": {"lr": 0.01}}, "runs": [run],
              "summary": summarise([run])}
    (tmp_path / "hf_trainer_race.json").write_text(json.dumps(report))
    tuned = dict(run, settings={"lr": 0.02})
    (tmp_path / "hf_trainer_race_tuning.json").write_text(json.dumps(
        {"single": {"chosen": {"lr": 0.01}, "runs": [run, tuned]}}))
    race.main(["--render", "--out", str(tmp_path)])
    text = (tmp_path / "hf_trainer_race.md").read_text()
    assert "| single | lr 0.01 | 1/1 | 80.0 s | 2000 | 1.00x | - |" in text
    assert "| single | lr 0.02 |  | 2000 (1800) | 80.0 s | 1.0 |" in text
    assert "INCOMPLETE" not in text
