"""The slow-link benchmark's record: ratios between its runs, the Markdown table, the files."""

import json
import os
import statistics

from .._util import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
COMMAND = "python -m benchmarks.slow_link"
LINK_NAMES = {"none": "one host", "10mbit": "10 Mbit/s", "100mbit": "100 Mbit/s",
              "1gbit": "1 Gbit/s"}


def stem(quick, workload="lstm"):
    base = "slow_link" if workload == "lstm" else "slow_link_" + workload
    return base + "_quick" if quick else base


def _median_time(rows):
    """(median time over the rows, whether it is only a lower bound): a run that missed the
    target counts as slower than any that reached it, and as its cap."""
    times = sorted(r["time_s"] if r.get("reached") else float("inf") for r in rows)
    if not times:
        return None, False
    med = statistics.median_low(times)
    if med == float("inf"):
        return max(r["cap_s"] for r in rows), True
    return med, False


def summarise(runs, one_host=None):
    """One summary per (link, method) over its repetitions: median time (or the cap, as a
    bound), median steps per worker, bytes, compute share, and the ratios to DDP and to local
    SGD on the same link and to the same method on one host (or to the method that
    `one_host` names for it, when that one was not run on one host)."""
    one_host = one_host or {}
    groups = {}
    for r in runs:
        groups.setdefault((r["link"], r["method"]), []).append(r)
    out = []
    for (link, method), rows in groups.items():
        ok = [r for r in rows if "error" not in r]
        time_s, bound = _median_time(ok)

        def med(key, ok=ok):
            cols = [r[key] for r in ok if r.get(key)]
            return [statistics.median(c) for c in zip(*cols)] if cols else None
        out.append({"link": link, "method": method, "runs": len(rows),
                    "failed": len(rows) - len(ok),
                    "reached": sum(1 for r in ok if r.get("reached")),
                    "time_s": time_s, "not_reached": bound,
                    "cap_s": max(r["cap_s"] for r in rows),
                    "best_metric": min((r["best_metric"] for r in ok
                                        if r.get("best_metric") is not None), default=None),
                    "steps": med("steps"), "bytes_window": med("bytes_window"),
                    "bytes_job": med("bytes_job"), "compute_share": med("compute_share"),
                    "tie_rounds": [statistics.median(c) for c in
                                   zip(*[[t["tie_rounds"] for t in r["tie"]]
                                         for r in ok if r.get("tie")])] or None,
                    "tie_cpu_s": [statistics.median(c) for c in
                                  zip(*[[t["cpu_s"] for t in r["tie"]]
                                        for r in ok if r.get("tie")])] or None,
                    "errors": [r["error"] for r in rows if "error" in r]})
    index = {(s["link"], s["method"]): s for s in out}
    for s in out:
        s["vs_ddp"] = _ratio(s, index.get((s["link"], "ddp")))
        s["vs_local_sgd"] = _ratio(s, index.get((s["link"], "local_sgd")))
        ref = s["method"]
        if ("none", ref) not in index and one_host.get(ref):
            ref = one_host[ref]
        s["one_host_ref"] = ref if ("none", ref) in index else None
        s["vs_one_host"] = (_ratio(s, index.get(("none", ref)))
                            if s["link"] != "none" else None)
        ddp = index.get((s["link"], "ddp"))
        s["bytes_vs_ddp"] = (sum(s["bytes_window"]) / sum(ddp["bytes_window"])
                             if s["bytes_window"] and ddp and ddp is not s
                             and ddp["bytes_window"]
                             and sum(ddp["bytes_window"]) else None)
    order = {"none": 0, "10mbit": 1, "100mbit": 2, "1gbit": 3}
    out.sort(key=lambda s: (order.get(s["link"], 9), s["method"] != "single",
                            s["method"] != "ddp", s["method"] != "local_sgd", s["method"]))
    return out


def _ratio(s, base):
    """[ratio, "=" | "<" | ">" | "?"]: exact when both reached the target; "<" when only
    the base missed (it would have taken longer than its cap), ">" when only `s` did."""
    if not base or base is s or s["time_s"] is None or base["time_s"] is None:
        return None
    value = s["time_s"] / base["time_s"]
    kind = {(False, False): "=", (False, True): "<", (True, False): ">",
            (True, True): "?"}[(s["not_reached"], base["not_reached"])]
    return [value, kind]


def _fmt_ratio(r):
    if r is None:
        return "-"
    value, kind = r
    if kind == "?":
        return "?"
    return {"=": "", "<": "< ", ">": "> "}[kind] + "%.2fx" % value


def _fmt_bytes_ratio(s):
    """What `s` sent as a fraction of DDP's bytes on the same link ("< " where DDP stopped at
    its cap: it would have sent more)."""
    r = s["bytes_vs_ddp"]
    if r is None:
        return "-"
    if r <= 0:
        return "0"
    ddp_capped = s["vs_ddp"] is not None and s["vs_ddp"][1] in "<?"
    return ("< " if ddp_capped else "") + ("1/%.0f" % (1 / r) if r < 1 else "%.1fx" % r)


def _fmt_time(s):
    if s["time_s"] is None:
        return "failed"
    if s["not_reached"]:
        best = "" if s["best_metric"] is None else ", best %.3f" % s["best_metric"]
        return "not in %.0f s%s" % (s["time_s"], best)
    return "%.1f s" % s["time_s"]


def _fmt_mb(values):
    if not values:
        return "-"
    return " / ".join("%.1f" % (v / 1e6) for v in values)


def _fmt_list(values, fmt):
    return "-" if not values else ", ".join(fmt % v for v in values)


def markdown(report):
    meta, problem = report["meta"], report["problem"]
    workload = meta.get("workload", "lstm")
    model = "LSTM %d" % problem["hidden"] if workload == "lstm" else "GPT %d wide, %s layers" % (
        problem["hidden"], problem.get("layers"))
    render = COMMAND + ("" if workload == "lstm" else " --workload " + workload)
    lines = ["<!-- generated from benchmarks/results/%s.json by `%s --render`; do not edit -->"
             % (stem(meta["quick"], workload), render), "",
             "### Across a slow link: byte-level %s to %.2f bits per byte, one worker per host"
             % ("LSTM" if workload == "lstm" else "GPT (AdamW)", problem["target"]), "",
             "Two hosts are network namespaces joined by a veth pair, each end shaped by `tc` "
             "tbf to the link's rate (no added delay); MPI over TCP on the veth. The problem "
             "is %s's (%s: %s, batch %d windows of %d bytes; a "
             "%.2f MB float32 model), lrs from its tuning record, %s and one `python -m "
             "platoon.mpi` rank per host. Time: wall time from a barrier after start-up to the "
             "evaluation that reached the target, evaluation excluded; runs capped at %.0f s. "
             "Bytes: what each veth end sent (`tx_bytes`) while the clock ran, host A / host "
             "B (\"bytes vs DDP\": of all that crossed, against DDP on the same link). "
             "Compute share: the CPU time of each worker's training thread (its steps and "
             "syncs) over the wall time. "
             "%d repetition(s); %s, %s cores, commit %s, %s; load average %.2f at the start "
             "and %.2f at the end; %.0f s in all."
             % ("benchmarks/language_model" if workload == "lstm" else
                "benchmarks/transformer", problem["name"], model, problem["batch"],
                problem["bptt"], meta["model_bytes"] / 1e6,
                meta.get("workload_text", "momentum 0.9 everywhere; platoon's workers EAMSGD "
                         "(EASGD 0.45 every 4 steps)"), meta["cap_s"], meta["reps"], meta["cpu"],
                meta["cores"], meta["commit"], meta["date"], meta["load_start"],
                meta.get("load_end", float("nan")), meta.get("seconds", 0.0)), "",
             "| link | method | time to target | steps per worker | MB sent A / B | bytes vs DDP "
             "| compute share | vs DDP | vs local SGD | vs one host | tie rounds "
             "| controller CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report["summary"]:
        vs_one = _fmt_ratio(s["vs_one_host"])
        if s["vs_one_host"] and s["one_host_ref"] != s["method"]:
            vs_one += " (of %s)" % s["one_host_ref"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            LINK_NAMES.get(s["link"], s["link"]), s["method"], _fmt_time(s),
            _fmt_list(s["steps"], "%d"), _fmt_mb(s["bytes_window"]),
            _fmt_bytes_ratio(s),
            _fmt_list(s["compute_share"], "%.2f"), _fmt_ratio(s["vs_ddp"]),
            _fmt_ratio(s["vs_local_sgd"]), vs_one, _fmt_list(s["tie_rounds"], "%d"),
            _fmt_list(s["tie_cpu_s"], "%.1f")))
    loads = [r["load_before"] for r in report["runs"] if "load_before" in r]
    if loads:
        lines += ["", "Load average (1 minute) as each run started: %.1f-%.1f, median %.1f."
                  % (min(loads), max(loads), sorted(loads)[len(loads) // 2])]
    lines += ["", "Methods: " + "; ".join("`%s`: %s" % (n, d)
                                          for n, d in report["methods"].items()) + "."]
    failed = [s for s in report["summary"] if s["errors"]]
    if failed:
        lines += ["", "Failed runs:"] + ["- %s over %s: %s" % (s["method"], s["link"], e)
                                         for s in failed for e in s["errors"]]
    if report.get("skipped"):
        lines += ["", "Not run: " + "; ".join(report["skipped"]) + "."]
    lines += ["", "Regenerate: `%s`." % meta["command"]]
    return "\n".join(lines) + "\n"


def write(report, quick, out_dir=RESULTS):
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem(quick, report["meta"].get("workload", "lstm")))
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(report))
    return base
