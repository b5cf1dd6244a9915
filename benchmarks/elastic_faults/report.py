"""The fault race's record: one summary per member over its repetitions, the goals' ratios,
the Markdown table, the files (benchmarks/results/elastic_faults.{json,md})."""

import json
import os
import statistics

from ..slow_link.report import RESULTS

COMMAND = "python -m benchmarks.elastic_faults"
ORDER = ("elastic", "elastic_faults", "mpi_faults", "torchft_faults", "elastic_slow", "mpi",
         "mpi_slow")


def stem(quick, every_s=60.0):
    """The record's name: elastic_faults[_everyN][_quick] (N: the faults' period, where it is
    not the default 60 s)."""
    base = "elastic_faults" if every_s == 60.0 else "elastic_faults_every%g" % every_s
    return base + "_quick" if quick else base


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _restarts(run):
    """A run's joiners grouped by their start command (the MPI job restarts every node at
    once)."""
    groups = {}
    for j in run.get("joiners", ()):
        groups.setdefault(j["started_s"], []).append(j)
    return list(groups.values())


def _slowest(group):
    """The joiner of `group` that contributed last (one that never did, if any)."""
    return max(group, key=lambda j: float("inf") if j["first_contribution_s"] is None
               else j["first_contribution_s"])


def _node_rates(rows):
    """{node: the median over `rows` of its steps a second} (runs that recorded them)."""
    nodes = sorted({n for r in rows for n in r.get("nodes", ())})
    return {n: _median([r["nodes"][n]["steps_per_s"] for r in rows if n in r.get("nodes", ())])
            for n in nodes}


def summarise(runs):
    """One summary per member: median time (a run that missed counts as its cap, and the
    summary is then a bound), steps, useful steps, goodput, bytes, joiners' times."""
    groups = {}
    for r in runs:
        groups.setdefault(r["member"], []).append(r)
    out = {}
    for member, rows in groups.items():
        ok = [r for r in rows if "error" not in r]
        times = sorted(r["time_s"] if r.get("reached") else float("inf") for r in ok)
        time_s = statistics.median_low(times) if times else None
        bound = time_s == float("inf")
        if bound:
            time_s = max(r["cap_s"] for r in ok)
        # (a joiner the target came within JOIN_GOAL_S of is left out: it had no time)
        joiners = [j for j in (_slowest(group) for r in ok for group in _restarts(r))
                   if j["first_contribution_s"] is not None
                   or j.get("window_s", JOIN_GOAL_S) >= JOIN_GOAL_S]
        joins = [j["first_contribution_s"] for j in joiners]
        out[member] = {
            "runs": len(rows), "failed": len(rows) - len(ok),
            "reached": sum(1 for r in ok if r.get("reached")),
            "time_s": time_s, "not_reached": bound,
            "steps": _median([r.get("steps") for r in ok]),
            "useful_steps": _median([r.get("useful_steps") for r in ok]),
            "steps_possible": _median([r.get("steps_possible") for r in ok]),
            "goodput": _median([r.get("goodput") for r in ok]),
            "mb_total": _median([r["bytes_total"] / 1e6 for r in ok if "bytes_total" in r]),
            "faults": _median([sum(1 for f in r.get("faults", ()) if f[1] == "kill")
                               for r in ok]),
            "joiners_s": [j for j in joins if j is not None],
            "joiners_detail": sorted([[j["first_contribution_s"], j.get("worker_started_s"),
                                       j.get("worker_loaded_s"), j.get("healed_s")]
                                      for j in joiners if j["first_contribution_s"] is not None]),
            "joiners_never": sum(1 for j in joins if j is None),
            "survivors_s": [x for r in ok for x in r.get("survivors_go_on_s", ())
                            if x is not None],
            "steps_per_s": _node_rates(ok),
            "slowdown": next((r["slowdown"] for r in ok if r.get("slowdown")), {}),
            "equal": next((r["equal"] for r in ok if r.get("equal")), ""),
            "load": [r["load_before"] for r in rows],
            "errors": [r["error"] for r in rows if "error" in r]}
    return {m: out[m] for m in sorted(out, key=lambda m: (m not in ORDER, ORDER.index(m)
                                                           if m in ORDER else 0, m))}


def _ratio(summary, a, b):
    """[a's time / b's, "=" | "<" | ">" | "?"] (a bound where one missed the target)."""
    sa, sb = summary.get(a), summary.get(b)
    if not sa or not sb or sa["time_s"] is None or sb["time_s"] is None:
        return None
    kind = {(False, False): "=", (False, True): "<", (True, False): ">",
            (True, True): "?"}[(sa["not_reached"], sb["not_reached"])]
    return [sa["time_s"] / sb["time_s"], kind]


# the goals for the elastic job under faults: (name, against, at most)
GOALS = [("vs its own fault-free time", "elastic", 1.15),
         ("vs the fixed-world job's", "mpi_faults", 0.7),
         ("vs torchft's DiLoCo", "torchft_faults", 1.0)]
JOIN_GOAL_S = 4.0
HEARTBEAT_S, ROUND_S = 5.0, 1.0  # the race's heartbeat timeout and its rounds' period


def goals(summary):
    """[(goal, what was measured, met: True, False or None when not measured)] for the
    elastic job under faults."""
    out = []
    for text, other, most in GOALS:
        r = _ratio(summary, "elastic_faults", other)
        met = None if r is None or r[1] == "?" else (r[0] <= most and r[1] in "=<")
        out.append(("%s <= %gx" % (text, most), _fmt_ratio(r), met))
    faults = summary.get("elastic_faults")
    if faults and faults.get("survivors_s"):
        worst = max(faults["survivors_s"])
        out.append(("the survivors go on within the heartbeat timeout (%g s) and a round"
                    % HEARTBEAT_S, "worst %.1f s" % worst, worst <= HEARTBEAT_S + ROUND_S))
    if faults and (faults["joiners_s"] or faults["joiners_never"]):
        worst = max(faults["joiners_s"], default=None)
        shown = "-" if worst is None else "worst %.1f s" % worst
        if faults["joiners_never"]:
            shown += ", %d never contributed" % faults["joiners_never"]
        out.append(("a joiner contributes within %g s of its start command" % JOIN_GOAL_S,
                    shown, not faults["joiners_never"] and worst <= JOIN_GOAL_S))
    return out


UNEQUAL_GOAL = 0.95  # the others' steps/s with one node throttled, of their all-equal rate


def unequal(summary):
    """[(goal, what was measured, met: True, False, None when not measured, or "" for a
    measure without a goal)] for each member with a throttled node: the others' steps a
    second against the same nodes' in its all-equal member, and its time to target
    against that member's."""
    out = []
    for member, s in summary.items():
        slow, equal = s.get("slowdown"), s.get("equal")
        if not slow or not equal:
            continue
        which = "%s against %s, node %s %gx slower" % (
            member, equal, "/".join(slow), max(slow.values()))
        base = summary.get(equal)
        others = [n for n in s["steps_per_s"] if n not in slow]
        rates = [s["steps_per_s"][n] for n in others]
        before = [(base or {}).get("steps_per_s", {}).get(n) for n in others]
        if not rates or None in rates + before or not sum(before):
            ratio, met = "-", None
        else:
            r = sum(rates) / sum(before)
            ratio, met = "%.2fx (%s)" % (r, ", ".join(
                "%s %.1f against %.1f" % (n, a, b) for n, a, b in zip(others, rates, before))), \
                r >= UNEQUAL_GOAL
        out.append(("the others' steps/s with one node %gx slower vs all-equal >= %gx (%s)"
                    % (max(slow.values()), UNEQUAL_GOAL, which), ratio, met))
        t = _ratio(summary, member, equal)
        out.append(("time to target vs all-equal (%s)" % which, _fmt_ratio(t),
                    None if t is None or t[1] == "?" else ""))
    return out


def _fmt_ratio(r):
    if r is None:
        return "-"
    return "?" if r[1] == "?" else {"=": "", "<": "< ", ">": "> "}[r[1]] + "%.2fx" % r[0]


def _fmt_time(s):
    if s["time_s"] is None:
        return "failed"
    return ("not in %.0f s" if s["not_reached"] else "%.1f s") % s["time_s"]


def _fmt(value, fmt):
    return "-" if value is None else fmt % value


def markdown(report):
    meta, summary = report["meta"], report["summary"]
    problem, settings = report["problem"], report["settings"]
    lines = ["<!-- generated from benchmarks/results/%s.json by `%s --render`; do not edit -->"
             % (stem(meta["quick"], meta["every_s"]), COMMAND + (
                 "" if meta["every_s"] == 60.0 else " --every-s %g" % meta["every_s"])), "",
             "### Nodes that come and go: byte-level LSTM to %.2f bits per byte, three hosts, "
             "a fault every ~%.0f s" % (problem["target"], meta["every_s"]), "",
             "Three hosts (network namespaces a, b, c; one worker each) on a switch, each "
             "host's link shaped by `tc` tbf to %s both ways. The problem is "
             "benchmarks/language_model's %s (LSTM %d, batch %d windows of %d bytes), its "
             "workers SGD(lr %g, momentum %g) as tuned for platoon's EAMSGD workers in "
             "benchmarks/results/language_model_tuning.json. Platoon (elastic and fixed-world "
             "MPI): EASGD 0.45 every 4 steps into the node centre, DiLoCo's outer step "
             "(lr %g, Nesterov momentum %g) every %g s in %s across nodes, the slow-link "
             "benchmark's platoon_diloco_int8 (the members named easgd: EASGD across nodes "
             "instead, beta 0.5, the same pace and codec). The MPI job checkpoints every "
             "node's centre every %g s and, after a fault, is restarted whole %g s after the "
             "kill, each node from its last checkpoint (restart time included). "
             "torchft: DiLoCo, its inner "
             "SGD(lr %g, momentum 0.9) as tuned for one process with momentum (between syncs "
             "each replica trains alone; lr 2 stalled at 3.4-3.5 bits per byte on the small "
             "problem), the same outer step, a sync every %d steps (not tuned on this "
             "workload), gloo, its lighthouse. Heartbeat timeouts %g s, at least %d nodes in a "
             "quorum. Faults (seed %d, the same schedule for every member): %s. Time: from the "
             "nodes' start commands (start-up, restarts and evaluations included) to the "
             "start of the first evaluation (any node's centre, or torchft model, every %d "
             "steps) at the target; runs capped at %.0f s. Steps: all workers' steps made; "
             "useful: those the job kept (a killed node loses what it made after its last "
             "contributing round; the MPI job, every node's steps after its last checkpoint); "
             "possible: 3 workers x the time / the median CPU time of a step (%.3f s: "
             "what three workers on a core each would make; here they share the machine's "
             "cores); goodput: useful / possible. MB: what the three hosts' links sent. "
             "Survivors go on: seconds from a kill until every other live node had made a "
             "round again (rounds come every %g s). Joiners: seconds from a restarted node's "
             "start command to its first contributing round (elastic: the node's own report; "
             "MPI: the restarted job's first tie round, on its slowest node; torchft: its "
             "first committed outer step; one the target came within %g s of is left out), "
             "in brackets when its worker's process started (after the node's own start-up: "
             "imports, data plane, controller), when it had imported torch, read the corpus and "
             "built its model, and when it was healed (the elastic node's report). "
             "%d repetition(s) (seeds %s), members interleaved; %s, %s cores, commit %s, %s; "
             "load average %.2f at the start and %.2f at the end; %.0f s in all."
             % (meta["link"], problem["name"],
                problem["hidden"], problem["batch"], problem["bptt"], meta["cfg"]["lr"],
                meta["cfg"]["momentum"], settings["outer_lr"], settings["outer_momentum"],
                settings["tie_every_s"], settings["compress"], settings["checkpoint_every_s"],
                meta["down_s"], meta.get("torchft_cfg", {}).get("lr", float("nan")),
                settings["sync_every"], settings["heartbeat_timeout_s"],
                settings["min_nodes"], meta["fault_seed"], meta["schedule_text"],
                problem["eval_every"], meta["cap_s"], meta.get("step_s") or 0.0,
                settings["tie_every_s"], JOIN_GOAL_S,
                meta["reps"], meta["seeds"], meta["cpu"], meta["cores"], meta["commit"],
                meta["date"], meta["load_start"], meta.get("load_end", float("nan")),
                meta.get("seconds", 0.0)), "",
             "| member | time to target | faults | steps made / useful / possible | goodput "
             "| MB across the links | survivors go on (s) | joiners: first contributing round "
             "[worker started/loaded/healed] (s) | steps/s per node | load at start |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for member, s in summary.items():
        joins = ", ".join("%.1f [%s]" % (j, "/".join(_fmt(x, "%.1f") for x in more))
                          for j, *more in s["joiners_detail"]) or "-"
        if s["joiners_never"]:
            joins += " (%d never)" % s["joiners_never"]
        rates = ", ".join("%s %s%s" % (n, _fmt(r, "%.1f"), " (%gx slower)"
                                       % s["slowdown"][n] if n in s.get("slowdown", {}) else "")
                          for n, r in s.get("steps_per_s", {}).items()) or "-"
        lines.append("| %s | %s | %s | %s / %s / %s | %s | %s | %s | %s | %s | %s |" % (
            member, _fmt_time(s), _fmt(s["faults"], "%d"), _fmt(s["steps"], "%d"),
            _fmt(s["useful_steps"], "%d"), _fmt(s["steps_possible"], "%.0f"),
            _fmt(s["goodput"], "%.2f"), _fmt(s["mb_total"], "%.1f"),
            ", ".join("%.1f" % x for x in sorted(s.get("survivors_s", ()))) or "-", joins,
            rates, ", ".join("%.1f" % x for x in s["load"])))
    verdict = {True: "met", False: "MISSED", None: "not measured", "": "no goal set"}
    lines += ["", "Goals (platoon elastic under faults):"]
    for text, shown, met in goals(summary):
        lines.append("- %s: %s, %s" % (text, shown, verdict[met]))
    slow = unequal(summary)
    if slow:
        lines += ["", "Unequal nodes (a throttled node's worker sleeps after each step so "
                  "that its steps take that many times as long, whatever the load; steps/s "
                  "per node: the steps it made by the target over the seconds its worker "
                  "trained, from its first step; medians over the repetitions):"]
        lines += ["- %s: %s, %s" % (text, shown, verdict[met]) for text, shown, met in slow]
    lines += ["", "Members: " + "; ".join("`%s`: %s" % (m, n) for m, n in
                                           report["members"].items()) + "."]
    failed = [(m, e) for m, s in summary.items() for e in s["errors"]]
    if failed:
        lines += ["", "Failed runs:"] + ["- %s: %s" % (m, e) for m, e in failed]
    if report.get("skipped"):
        lines += ["", "Not run: " + "; ".join(report["skipped"]) + "."]
    lines += ["", "Regenerate: `%s`." % meta["command"]]
    return "\n".join(lines) + "\n"


def write(report, out_dir=RESULTS):
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem(report["meta"]["quick"], report["meta"]["every_s"]))
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(report))
    return base
