"""Tuning each method's lr on a grid, then the measured and straggler repetitions, all
methods alternating; medians per method."""

import json
import os
import statistics
import time
from dataclasses import asdict

from .harness import Job, run_one


def _median(values):
    return float(statistics.median(values)) if values else None


def _score(result, dataset):
    """Sort key of a tuning run: time to target, else (after every run that reached it)
    how close it got: the rank of its best metric."""
    if result.get("reached"):
        return (0, result["reached"][0])
    return (1, min((dataset.shortfall(a) for _, _, a in result.get("trace", [])),
                   default=float("inf")))


def tune_and_measure(ctx, dataset, table, tune, reps, straggler_reps, log):
    """Tune (or take each grid's middle value), then measure, then the straggler runs."""
    data = dataset.load()
    runs = []
    # Caps are set for an idle machine; under load every step takes longer.
    load_factor = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    cap_s = dataset.cap_s * load_factor

    def run(name, cfg, seed, straggler, cap_s, phase):
        world, fixed, _ = table[name]
        job = Job(name, dict(fixed, **cfg), seed, straggler, cap_s, dataset, world)
        wall, load = time.monotonic(), os.getloadavg()[0]
        result = run_one(ctx, job, data)
        result["wall_s"] = time.monotonic() - wall
        result["load_before"] = load  # the 1-minute load average as the run started
        reached = result.get("reached")
        log("%s %-26s %-34s seed %d%s: %s (run %.1f s, load %.1f before)" % (
            dataset.name, name, json.dumps(cfg), seed, " straggler" if straggler else "",
            result["error"].splitlines()[0] if "error" in result else
            ("%.2f s, %d steps" % tuple(reached)) if reached else "not reached in %.1f s"
            % cap_s, result["wall_s"], load))
        runs.append({"phase": phase, "method": name, "cfg": job.cfg, "seed": seed,
                     "straggler": straggler, "cap_s": cap_s, **result})
        return result

    # Tuning: seed 0, every grid value, methods alternating. A run's cap is at most twice
    # the best time its method has reached so far (a slower setting cannot win).
    best = {name: None for name in table}
    chosen = {}
    for i in range(max(len(g) for _, _, g in table.values()) if tune else 0):
        for name, (_, _, grid) in table.items():
            if i >= len(grid):
                continue
            cap = cap_s
            if best[name] is not None and best[name][1].get("reached"):
                cap = min(cap, 2 * best[name][1]["reached"][0] + 0.5)
            result = run(name, grid[i], 0, False, cap, "tune")
            if "error" not in result and (best[name] is None or _score(result, dataset) <
                                          _score(best[name][1], dataset)):
                best[name] = (grid[i], result)
    for name, (_, _, grid) in table.items():
        chosen[name] = best[name][0] if best[name] is not None else grid[len(grid) // 2]

    # Measurement: new seeds, all methods alternating within each repetition.
    for rep in range(reps):
        for name in table:
            run(name, chosen[name], 1 + rep, False, cap_s, "measure")
    # Straggler: every multi-process method, alternating, with the same seeds.
    for rep in range(straggler_reps):
        for name, (world, _, _) in table.items():
            if world > 1:
                run(name, chosen[name], 1 + rep, True, cap_s, "straggler")
    return {"dataset": asdict(dataset), "tuned": tune, "cap_s": cap_s,
            "load_factor": load_factor,
            "grids": {n: g for n, (_, _, g) in table.items()},
            "fixed": {n: f for n, (_, f, _) in table.items()}, "chosen": chosen,
            "summary": summarise(runs, table), "runs": runs}


def summarise(runs, table):
    """Per method: medians over the measured runs that reached the target, and how many."""
    out = {}
    for name in table:
        row = {}
        for phase in ("measure", "straggler"):
            mine = [r for r in runs if r["method"] == name and r["phase"] == phase]
            if not mine:
                continue
            hit = [r for r in mine if r.get("reached")]
            row[phase] = {
                "runs": len(mine), "reached": len(hit),
                "time_s": _median([r["reached"][0] for r in hit]),
                "steps": _median([r["reached"][1] for r in hit]),
                "setup_s": _median([max(k["setup_s"] for k in r["ranks"]) for r in mine
                                    if "ranks" in r]),
                "steps_per_s": _median([k["steps"] / k["clock_s"] for r in mine
                                        if "ranks" in r for k in r["ranks"]]),
                "sync_ms_per_step": _median([1000 * k["sync_s"] / k["steps"] for r in mine
                                             if "ranks" in r for k in r["ranks"]
                                             if "sync_s" in k]),
                "lock_wait_ms_per_sync": _median([1000 * k["lock_wait_s"] / max(1, k["syncs"])
                                                  for r in mine if "ranks" in r
                                                  for k in r["ranks"] if "syncs" in k]),
                "lock_hold_ms_per_sync": _median([1000 * k["lock_hold_s"] / max(1, k["syncs"])
                                                  for r in mine if "ranks" in r
                                                  for k in r["ranks"] if "syncs" in k]),
            }
        out[name] = row
    return out

