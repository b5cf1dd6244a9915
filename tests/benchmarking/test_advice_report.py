"""benchmarks.hf_trainer_race.advice's report, from a record: medians of steps to each target
per cell, the second workload's cells named by corpus and model, an earlier record read with
the new one, and --only keeping one plan's cells."""

import json

from benchmarks.hf_trainer_race import advice


def _run(method, settings, seed, trace, load=2.0):
    return {"method": method, "settings": settings, "seed": seed, "load_before": load,
            "wall_s": 100.0, "ranks": [{"trace": [[s, s / 10.0, loss] for s, loss in trace]}]}


def test_report_reads_both_records_and_keeps_only_the_plans_cells(tmp_path, capsys):
    prose = dict(advice.PROSE, lr=advice.PROSE_LR, warmup=0.05)
    earlier = [_run("single", prose, 1, [(50, 2.4), (100, 2.0), (150, 1.9)]),
               _run("single", {"lr": advice.ONE, "warmup": 0.05}, 1, [(50, 2.0)])]
    newer = [dict(_run("single", prose, 2, [(50, 2.4), (100, 2.2), (150, 1.9)], load=7.5),
                  load_after=12.25),
             _run("single", prose, 3, [(50, 2.5), (100, 2.3), (150, 2.1)])]
    prior, out = tmp_path / "prior.json", tmp_path / "out.json"
    prior.write_text(json.dumps(earlier))
    out.write_text(json.dumps(newer))
    advice.main(["--report", "--prior", str(prior), "--out", str(out), "--only", "prose",
                 "--targets", "2.1,2.0"])
    text = capsys.readouterr().out
    cell = ("single corpus docstrings, horizon 600, lr %g, model wide, warmup 0.05"
            % advice.PROSE_LR)
    # to 2.1 (interpolated): seed 1 at 87.5, seed 2 at 116.7, seed 3 at 150: median 117;
    # to 2.0: seed 1 at 100, seed 2 at 133.3, seed 3 never: the median is seed 2's
    assert "| %s | 1,2,3 | 117 | 133 |" % cell in text
    assert "| %s | 2 | 7.5 / 12.2 | 100 s | 117 | 133 | 1.900 |" % cell in text
    assert "| %s | 1 | 2.0 | 100 s |" % cell in text  # recorded before load_after was
    assert "single lr 0.012" not in text  # not a cell of the plan


def test_a_run_recorded_in_either_record_is_not_run_again():
    """The identity of a run rounds its floats as they are recorded."""
    settings = {"lr": advice.ONE * 1.5, "warmup": 0.05}
    recorded = json.loads(json.dumps(advice._rounded(settings)))
    assert advice._key("platoon_easgd", settings, 3) == \
        advice._key("platoon_easgd", recorded, 3)
    assert advice._key("platoon_easgd", settings, 3) != advice._key("platoon_easgd", settings, 2)


def test_versus_gives_each_cell_steps_as_a_multiple_of_ddp_s_on_its_own_workload(
        tmp_path, capsys):
    """--versus PLAN: the reference is that plan's DDP cell with the same corpus, model and
    horizon (one per workload), medians over its seeds; the plan's other methods are not."""
    stand_in = {"lr": advice.ONE, "warmup": 0.05}
    prose = dict(advice.PROSE, lr=advice.PROSE_LR, warmup=0.05)
    runs = [_run("ddp", stand_in, 1, [(50, 2.5), (100, 2.0)]),
            _run("ddp", stand_in, 2, [(50, 2.5), (100, 2.1), (150, 2.0)]),
            _run("single", stand_in, 1, [(50, 2.5), (200, 2.0)]),
            _run("ddp", prose, 1, [(50, 2.0)]),
            _run("platoon_easgd", dict(stand_in, sync_every=2), 1, [(50, 2.5), (150, 2.0)]),
            _run("platoon_easgd", dict(prose, sync_every=2), 1, [(50, 2.5), (100, 2.0)])]
    out = tmp_path / "out.json"
    out.write_text(json.dumps(runs))
    advice.main(["--report", "--prior", "", "--out", str(out), "--only",
                 "three_seeds,prose,gain_winner,prose_every2", "--targets", "2.0",
                 "--versus", "three_seeds"])
    text = capsys.readouterr().out
    # stand-in DDP: 100 and 150 steps, median 125; prose has no DDP cell in three_seeds
    assert "| platoon_easgd lr 0.012, sync every 2, warmup 0.05 | 1 | 150 (1.20x) |" in text
    assert "| single lr 0.012, warmup 0.05 | 1 | 200 (1.60x) |" in text
    assert "model wide, sync every 2, warmup 0.05 | 1 | 100 |" in text
    advice.main(["--report", "--prior", "", "--out", str(out), "--targets", "2.0", "--versus",
                 "prose", "--workload", "prose"])
    text = capsys.readouterr().out
    assert "model wide, sync every 2, warmup 0.05 | 1 | 100 (2.00x) |" in text
    assert "lr 0.012" not in text  # the stand-in's runs: not of the workload


def test_a_median_that_did_not_reach_a_target_is_a_dash(tmp_path, capsys):
    """Of 2 seeds, one never reaching the target makes the median never."""
    runs = [_run("ddp", {"lr": advice.ONE, "warmup": 0.05}, seed, trace)
            for seed, trace in ((1, [(50, 2.5), (100, 2.0)]), (2, [(50, 2.5), (100, 2.1)]))]
    out = tmp_path / "out.json"
    out.write_text(json.dumps(runs))
    advice.main(["--report", "--prior", "", "--out", str(out), "--targets", "2.1,2.0"])
    assert "| ddp lr 0.012, warmup 0.05 | 1,2 | 95 | - |" in capsys.readouterr().out
    advice.main(["--report", "--prior", "", "--out", str(out), "--targets", "2.1,2.0",
                 "--seeds", "1"])  # --seeds keeps those seeds' runs
    assert "| ddp lr 0.012, warmup 0.05 | 1 | 90 | 100 |" in capsys.readouterr().out
