"""The fault race on an ordinary script (issue 44's joiner measure): examples/lm/train.py
(an ordinary PyTorch char-LSTM script, `platoon.Worker` as docs/porting-a-script.md shows) as
each node's worker under ``python -m platoon.elastic.node``, three nodes on the race's shaped
links (`hosts`), node c killed -9 `kill_at_s` in and started again `down_s` later; the run
ends a little after the restarted node's first contributing round (or at the cap).

usage: python -m benchmarks.elastic_faults --script [--quick] [--reps N]
                                           [--kill-at-s 40] [--down-s 10]

Reported per joiner: seconds from its start command to its first contributing round and the
chain on the way, each step from the start command: python started, the script's first line,
torch and platoon imported, platoon's Worker class, Worker() registered, the data read, the
model built, the node's centre created (init_shared_params), the node heartbeating, in its
group, healed, the script's sync set up (its first step from the anchor), the first
contributing round. The script's steps come from `probe` (which runs it unchanged), the
node's from its first-contribution line ("on the way: ..."). Written to
benchmarks/results/elastic_faults_script{,_quick}.{json,md}.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from .._util import ROOT
from . import hosts as net
from .race import (
    MEMBERS,
    Run,
    Settings,
    _env,
    _read_events,
    _wait_listening,
    lighthouse_command,
    on_the_way,
    tear_down,
)
from .schedule import NODES

SCRIPT = os.path.join(ROOT, "examples", "lm", "train.py")
PROBE = os.path.join(ROOT, "benchmarks", "elastic_faults", "probe.py")
SCRIPT_ARGS = ["--epochs", "1000000"]  # until the race stops it
QUICK_ARGS = ["--nhid", "64", "--valid-bytes", "2000"]
NODE = "c"  # the node killed and started again
AFTER_S = 2.0  # the run goes on this long after the joiner's first contribution
POLL_S = 0.2
NODE_STEPS = {"centre": "node: centre created (init_shared_params)",
              "heartbeating": "node: heartbeating", "group": "node: in its group",
              "healed": "node: healed"}


def worker_command(events_dir, quick=False):
    """`node_commands`' worker: the script under the probe, its events beside the node's."""
    def command(node, incarnation):
        return [sys.executable, PROBE, os.path.join(events_dir, "%s-%d-worker.jsonl"
                                                    % (node, incarnation)),
                SCRIPT] + SCRIPT_ARGS + (QUICK_ARGS if quick else [])
    return command


def _first(events, name, after=None):
    """The time of the first "returned" event named `name` (after time `after`), or None."""
    return next((e["t"] for e in events if e["ev"] == "returned" and e["name"] == name
                 and (after is None or e["t"] >= after)), None)


def _before(events, name):
    """The time of the event just before the first "returned" one named `name`, or None."""
    previous = None
    for e in events:
        if e["ev"] == "returned" and e["name"] == name:
            return previous
        previous = e["t"]
    return None


def breakdown(started, events, log_text):
    """[(step, seconds from the start command `started`)] of one joiner, in time order, from
    its probe's `events` and its node's `log_text`; and its first contribution (s, or None)."""
    probe = next((e for e in events if e["ev"] == "probe"), {})
    imported = {e["name"]: e["t"] for e in events if e["ev"] == "imported"}
    steps = {"python started": probe.get("process_started"),
             "the script's first line": probe.get("first_line"),
             "torch imported": imported.get("torch"),
             "platoon imported": imported.get("platoon")}
    worker_class = _first(events, "__getattr__", imported.get("platoon"))
    steps["platoon's Worker class imported"] = worker_class
    steps["Worker() registered"] = _before(events, "shard")
    steps["data read"] = _before(events, "CharLM.__init__")
    model = _first(events, "CharLM.__init__")
    steps["model built"] = _first(events, "Module.to", model) or model
    steps["sync set up (its first step from the anchor)"] = _first(
        events, "PeriodicSync.__init__") or _first(events, "Worker.init_shared_params")
    out = [(k, round(v - started, 3)) for k, v in steps.items() if v is not None]
    first, node_steps = on_the_way(log_text)
    if first is not None:
        out += [(NODE_STEPS[name], t) for name, t in node_steps.items() if name in NODE_STEPS]
        out.append(("first contributing round", first))
    return sorted(out, key=lambda kv: kv[1]), first


def _log_of(workdir, node, index):
    try:
        with open(os.path.join(workdir, "%s-%d.log" % (node, index)), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def run_script(settings, kill_at_s, down_s, cap_s, rate_bits_s, quick, log, tag=""):
    """One run: the row of its joiner (node `NODE` started again), with "error" when it
    failed."""
    from platoon.elastic import generate_secret
    member = MEMBERS["elastic_faults"]
    workdir = tempfile.mkdtemp(prefix="slk%d-efs-" % os.getpid())
    row = {"kill_at_s": kill_at_s, "down_s": down_s, "cap_s": cap_s,
           "load_before": os.getloadavg()[0]}
    shm_before = set(glob.glob("/dev/shm/*"))
    hosts = run = lighthouse = lighthouse_log = None
    try:
        hosts = net.Hosts(rate_bits_s, tag).__enter__()
        secret = generate_secret(os.path.join(workdir, "secret"))
        events_dir = os.path.join(workdir, "events")
        run = Run(member, settings, hosts, workdir, os.path.join(workdir, "none.json"), None,
                  secret, worker=worker_command(events_dir, quick))
        lighthouse_log = open(os.path.join(workdir, "lighthouse.out"), "w")
        lighthouse = subprocess.Popen(
            hosts.switch_prefix() + lighthouse_command("elastic", settings, secret), cwd=ROOT,
            env=_env(), stdout=lighthouse_log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_listening(hosts, 30.0, lighthouse)
        t0 = time.time()
        run.start(NODES)
        killed = restarted = None
        while time.time() - t0 < cap_s:
            now = time.time() - t0
            if killed is None and now >= kill_at_s:
                run.kill(NODE)
                killed = now
                log("  %.1f s: kill %s" % (now, NODE))
            if killed is not None and restarted is None and now >= kill_at_s + down_s:
                run.restart(NODE)
                restarted = time.time()
                log("  %.1f s: restart %s" % (now, NODE))
            if restarted is not None and on_the_way(_log_of(workdir, NODE, 1))[0] is not None:
                time.sleep(AFTER_S)
                break
            time.sleep(POLL_S)
        run.stop_all()
        if restarted is None:
            raise RuntimeError("the run ended before node %s was started again" % NODE)
        events = _read_events(os.path.join(events_dir, "%s-1-worker.jsonl" % NODE))
        steps, first = breakdown(restarted, events, _log_of(workdir, NODE, 1))
        row.update(first_contribution_s=first, steps=steps, killed_s=round(killed, 3),
                   restarted_s=round(restarted - t0, 3),
                   run_s=round(time.time() - t0, 3))
        if first is None:
            raise RuntimeError("node %s made no contributing round within %.0f s of its "
                               "start" % (NODE, cap_s - kill_at_s - down_s))
    except (RuntimeError, OSError, ValueError) as exc:
        row["error"] = "%s: %s" % (type(exc).__name__, exc)
        row["output_tail"] = run.tail() if run is not None else ""
        log("FAILED: %s\n%s" % (row["error"], row["output_tail"][-6000:]))
    finally:
        row["left_in_shm"] = tear_down(run, lighthouse, lighthouse_log, hosts, shm_before,
                                       workdir, log)
    return row


def markdown(report):
    """The record as Markdown: one column per run, one row per step of the chain."""
    meta, runs = report["meta"], report["runs"]
    ok = [r for r in runs if "error" not in r]
    lines = ["# The fault race on an ordinary script (%s)" % os.path.relpath(SCRIPT, ROOT), "",
             "`%s`: commit %s, %s, %s (%d cores), load %.2f at the start, %.2f at the end; "
             "links %s; node %s killed -9 %g s in, started again %g s later%s."
             % (meta["command"], meta["commit"], meta["date"], meta["cpu"], meta["cores"],
                meta["load_start"], meta["load_end"], meta["link"], NODE, meta["kill_at_s"],
                meta["down_s"], " (quick: a smaller model)" if meta["quick"] else ""), "",
             "Seconds from the restarted node's start command; each step's own share in "
             "brackets.", ""]
    if ok:
        names = []
        for r in ok:
            for name, _ in r["steps"]:
                if name not in names:
                    names.append(name)
        lines.append("| step | " + " | ".join("run %d (load %.1f)" % (i + 1, r["load_before"])
                                              for i, r in enumerate(ok)) + " |")
        lines.append("|---|" + "---|" * len(ok))
        for name in names:
            cells = []
            for r in ok:
                times = [t for _, t in r["steps"]]
                at = dict(r["steps"]).get(name)
                if at is None:
                    cells.append("-")
                    continue
                earlier = [t for t in times if t < at]
                cells.append("%.2f [%.2f]" % (at, at - max(earlier, default=0.0)))
            lines.append("| %s | %s |" % (name, " | ".join(cells)))
    for r in runs:
        if "error" in r:
            lines.append("")
            lines.append("FAILED: %s" % r["error"])
    return "\n".join(lines) + "\n"


def main(args, log, meta):
    """`python -m benchmarks.elastic_faults --script`: `args.reps` runs; returns the exit
    code."""
    from ..slow_link import link as slow_link
    kill_at_s = args.kill_at_s if args.kill_at_s is not None else (15.0 if args.quick else 40.0)
    down_s = args.down_s if args.down_s is not None else (3.0 if args.quick else 10.0)
    cap_s = args.cap_s if args.cap_s is not None else kill_at_s + down_s + 40.0
    meta.update(kill_at_s=kill_at_s, down_s=down_s, cap_s=cap_s, script=SCRIPT_ARGS)
    runs = []
    out = args.out
    base = os.path.join(out, "elastic_faults_script" + ("_quick" if args.quick else ""))
    for rep in range(args.reps):
        log("[%d/%d] %s under platoon.elastic.node ..." % (rep + 1, args.reps,
                                                             os.path.relpath(SCRIPT, ROOT)))
        row = run_script(Settings(), kill_at_s, down_s, cap_s, slow_link.rate_bits(args.link),
                         args.quick, log, "s%d" % rep)
        if "error" not in row:
            log("first contributing round %.2f s after its start command: %s" % (
                row["first_contribution_s"], ", ".join("%s %.2f" % kv for kv in row["steps"])))
        runs.append(row)
        meta["load_end"] = os.getloadavg()[0]
        report = {"meta": meta, "runs": runs}
        os.makedirs(out, exist_ok=True)
        with open(base + ".json", "w") as f:
            json.dump(report, f, indent=1)
        with open(base + ".md", "w") as f:
            f.write(markdown(report))
    print()
    print(markdown({"meta": meta, "runs": runs}))
    log("wrote %s.json and %s.md" % (base, base))
    return 1 if any("error" in r for r in runs) else 0
