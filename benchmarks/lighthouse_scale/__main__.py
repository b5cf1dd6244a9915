"""python -m benchmarks.lighthouse_scale [--nodes 100 1000] [--nice 10 0] [--procs 4]
[--probe 10] [--seconds 15] [--heartbeat-interval-s 0.1] [--join-grace-s 0.3]
[--max-heartbeats-per-s N] [--write]

Runs the lighthouse scale benchmark (see the package's doc) once per node count and niceness
of the simulators and prints its figures as JSON; --write also writes
benchmarks/results/lighthouse_scale.{json,md}.

The simulators run niced (--nice 10, the goal's figure: nodes on other machines do not
compete for the lighthouse's cores; the probe is never niced) and not (--nice 0: the machine's
cores shared by the lighthouse and the simulators alike). Beside the latencies, what tells the
lighthouse's own work from the cores' scheduling: the requests per read (how many waited when
the lighthouse looked: about 1 when it keeps up) and its thread's CPU per request (from its
log's last line: `Lighthouse.serve`'s counts). Timeouts are counted by cause (`sim`), beside
the kernel's listen queue overflows during the run (TcpExtListenOverflows: the whole network
namespace's) and the requests the lighthouse dropped or refused.

The lighthouse paces its nodes (`--max-heartbeats-per-s`, its default unless given): past
that rate's tenth of nodes its replies ask for heartbeats every live nodes / rate seconds
rather than the nodes' own --heartbeat-interval-s, and the simulated nodes heartbeat at that
pace, as LighthouseClient does; each row says the pace asked ("pace_s": the longest any node
last heard; None: none asked) beside the requests per second it got.

The reply latencies are the probe's: --probe of the nodes simulated by a process of their
own, idle between heartbeats, so that they hold little of a simulator's own delays (the
other simulators, 250 nodes each, send and check most heartbeats on the same cores: their
latencies, reported as "load_reply_p99_ms", hold their own scheduling too). The lighthouse's
CPU per request is its process's CPU time (every thread: ZeroMQ's I/O thread too; its ticks,
which weigh in at low rates) over the requests sent to it."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from .._util import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
JSON_PATH = os.path.join(RESULTS, "lighthouse_scale.json")
MD_PATH = os.path.join(RESULTS, "lighthouse_scale.md")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def listen_overflows():
    """The kernel's count of connections dropped at a full listen queue (this network
    namespace's, since it began)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(values.split()[names.split().index("ListenOverflows")])
    return 0


SERVED = re.compile(r"lighthouse: served (\d+) requests in (\d+) reads .*; dropped (\d+), "
                    r"refused (\d+); its thread's CPU ([\d.]+) s")


def served(log_text):
    """The lighthouse's last line's counts (`Lighthouse.serve`), or {} when it has none."""
    found = SERVED.findall(log_text)
    if not found:
        return {}
    requests, reads, dropped, refused, cpu = found[-1]
    return {"requests_read": int(requests), "reads": int(reads), "dropped": int(dropped),
            "refused": int(refused), "thread_cpu_s": float(cpu)}


def wait_for_line(path, proc, text, timeout_s=30.0):
    """The first line of file `path` (written by process `proc`) holding `text`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(path) as f:
            for line in f:
                if text in line:
                    return line
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(path) as f:
        raise RuntimeError("the lighthouse did not start: %r" % f.read()[-2000:])


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def run(count, procs, probe, seconds, interval, grace, nice=0, timeout_s=120.0,
        heartbeats_per_s=None):
    """One run at `count` simulated nodes, the simulators (not the probe) at niceness
    `nice`, the lighthouse at `heartbeats_per_s` (its --max-heartbeats-per-s; None: its
    default): its figures."""
    rate = [] if heartbeats_per_s is None else ["--max-heartbeats-per-s", str(heartbeats_per_s)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT)
    log_text = ""
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = os.path.join(tmp, "secret")
        subprocess.run([sys.executable, "-m", "platoon.elastic.lighthouse", "--new-secret",
                        secret_file], check=True, env=env, stdout=subprocess.DEVNULL)
        log_path = os.path.join(tmp, "lighthouse.log")  # (a file: a pipe left unread fills)
        with open(log_path, "w") as log_file:
            lighthouse = subprocess.Popen(
                [sys.executable, "-m", "platoon.elastic.lighthouse", "--bind", "127.0.0.1:0",
                 "--secret-file", secret_file, "--min-nodes", str(count), "--join-grace-s",
                 str(grace), "--heartbeat-timeout-s", "5"] + rate,
                cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True)
        sims = []
        try:
            line = wait_for_line(log_path, lighthouse, "serving on tcp://")
            address = line.split("tcp://")[1].split()[0]
            started, cpu0 = time.monotonic(), cpu_s(lighthouse.pid)
            overflows0 = listen_overflows()
            probe = min(probe, count)
            load = count - probe
            per = max(1, -(-load // procs))
            parts = [(first, min(per, load - first)) for first in range(0, load, per)]
            parts.append((load, probe))  # the probe: its own process, last
            sims = [subprocess.Popen(
                [sys.executable, "-m", "benchmarks.lighthouse_scale.sim", address, secret_file,
                 str(first), str(size), str(count), str(interval), str(seconds),
                 str(nice if first < load else 0)], cwd=ROOT,
                env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
                for first, size in parts if size]
            rows = []
            deadline = time.monotonic() + timeout_s
            for sim in sims:
                out, _ = sim.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if sim.returncode != 0:
                    raise RuntimeError("a simulator failed (exit %s)" % sim.returncode)
                rows.append(json.loads(out.splitlines()[-1]))
            cpu = cpu_s(lighthouse.pid) - cpu0
            wall = time.monotonic() - started
            overflows = listen_overflows() - overflows0
            lighthouse.send_signal(signal.SIGTERM)  # (it logs its counts as it ends)
            lighthouse.wait(30)
            with open(log_path) as f:
                log_text = f.read()
        finally:
            for proc in sims + [lighthouse]:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait(10)
    joined = [t for r in rows for t in r["joined"]]
    saw_all = [t for r in rows for t in r["saw_all"] if t is not None]
    latencies = rows[-1]["latencies"] if probe else []  # the probe's
    loaded = [x for r in (rows[:-1] if probe else rows) for x in r["latencies"]]
    last_join = max(joined) if None not in joined else None
    sent = sum(r["sent"] for r in rows)

    def ms(values, q):
        return None if not values else 1000 * percentile(values, q)

    counts = served(log_text)
    timeouts = {cause: sum(r["timeouts"][cause] for r in rows) for cause in rows[0]["timeouts"]}

    return {"nodes": count, "simulators_nice": nice, "probe_nodes": probe,
            "heartbeat_interval_s": interval, "max_heartbeats_per_s": heartbeats_per_s,
            "pace_s": max((r["pace_s"] for r in rows if r.get("pace_s") is not None),
                          default=None),
            "join_grace_s": grace, "registered": sum(t is not None for t in joined),
            "last_join_to_quorum_of_all_s": None if last_join is None or not saw_all
            else min(saw_all) - last_join,
            "saw_quorum_of_all": len(saw_all),
            "reply_p50_ms": ms(latencies, 0.5), "reply_p99_ms": ms(latencies, 0.99),
            "load_reply_p50_ms": ms(loaded, 0.5), "load_reply_p99_ms": ms(loaded, 0.99),
            "replies": len(latencies) + len(loaded), "requests": sent,
            "requests_per_s": sent / wall,
            "timeouts": sum(timeouts.values()), "timeouts_by_cause": timeouts,
            "listen_overflows": overflows,
            "refused": sum(r["refused"] for r in rows),
            "lighthouse_dropped": counts.get("dropped"),
            "lighthouse_refused": counts.get("refused"),
            "lighthouse_log_warnings": sum("dropped requests" in line or "refused a" in line
                                           for line in log_text.splitlines()),
            "requests_per_read": counts["requests_read"] / counts["reads"]
            if counts.get("reads") else None,
            "lighthouse_cpu_share": cpu / wall,
            "lighthouse_cpu_us_per_request": 1e6 * cpu / sent if sent else None,
            "lighthouse_thread_cpu_us_per_request": 1e6 * counts["thread_cpu_s"]
            / counts["requests_read"] if counts.get("requests_read") else None,
            "simulators_cpu_s": sum(r["cpu_s"] for r in rows), "seconds": wall}


def render(record):
    lines = ["# The lighthouse at scale", "",
             "`python -m benchmarks.lighthouse_scale`: one lighthouse process, simulated "
             "heartbeat-only nodes in %d processes and a probe of %d nodes in one more, %s; "
             "load average %s at the start. Goals: the quorum of all within 1 s of the join "
             "grace window after the last registration; heartbeat replies under 50 ms at p99, "
             "judged with the simulators niced (nice 10: nodes on other machines do not compete "
             "for the lighthouse's cores; the probe is not niced); nice 0 shows the cores shared "
             "alike. Reply latencies are the probe's (a process idle between heartbeats: little "
             "of its own delay); the load generators' p99 holds their own scheduling too. CPU "
             "per request: the lighthouse process's CPU time (its ZeroMQ I/O thread and its "
             "membership ticks too) over the requests sent to it; its thread's: the serving "
             "thread's alone. Requests per read: how many waited each time the lighthouse "
             "looked (about 1: it keeps up; near 64: it falls behind). Timeouts (no reply within "
             "1 s) by cause: on a connection's first request / on a connection answered before; "
             "listen overflows: the kernel's, during the run. Pace: how often the lighthouse "
             "asks each node to heartbeat at most (live nodes / its --max-heartbeats-per-s; a "
             "node's own interval when longer, here %s s)."
             % (record["procs"], record["probe"], record["machine"], record["load"],
                "/".join(sorted({"%g" % row["heartbeat_interval_s"]
                                 for row in record["rows"]}))),
             "",
             "| nodes | simulators' nice | pace | requests/s | last join to quorum of all | "
             "grace | reply p50 | reply p99 | load generators' p99 | lighthouse CPU | "
             "CPU per request | its thread's CPU per request | requests per read | timeouts "
             "(connecting / registered) | listen overflows |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def num(value, form):
        return "-" if value is None else form % value

    for row in record["rows"]:
        causes = row["timeouts_by_cause"]
        lines.append("| %d | %d | %s | %.0f | %s | %g s | %s | %s | %s | %.0f%% | %s | %s | %s | "
                     "%d (%d / %d) | %d |"
                     % (row["nodes"], row["simulators_nice"],
                        num(row.get("pace_s"), "%.3g s"), row["requests_per_s"],
                        num(row["last_join_to_quorum_of_all_s"], "%.3f s"),
                        row["join_grace_s"], num(row["reply_p50_ms"], "%.2f ms"),
                        num(row["reply_p99_ms"], "%.2f ms"),
                        num(row["load_reply_p99_ms"], "%.2f ms"),
                        100 * row["lighthouse_cpu_share"],
                        num(row["lighthouse_cpu_us_per_request"], "%.0f µs"),
                        num(row["lighthouse_thread_cpu_us_per_request"], "%.0f µs"),
                        num(row["requests_per_read"], "%.1f"), row["timeouts"],
                        causes["connecting"], causes["registered"], row["listen_overflows"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lighthouse_scale")
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--nice", type=int, nargs="+", default=[10, 0],
                        help="the simulators' niceness (not the probe's): a run for each")
    parser.add_argument("--procs", type=int, default=4, help="simulator processes")
    parser.add_argument("--probe", type=int, default=10,
                        help="nodes simulated by the probe process, whose latencies are shown")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--heartbeat-interval-s", type=float, default=0.1)
    parser.add_argument("--join-grace-s", type=float, default=0.3)
    parser.add_argument("--max-heartbeats-per-s", type=int, default=None,
                        help="the lighthouse's (default: its own default)")
    parser.add_argument("--write", action="store_true",
                        help="write benchmarks/results/lighthouse_scale.{json,md}")
    args = parser.parse_args(argv)
    load = "%.1f" % os.getloadavg()[0]
    rows = [run(count, args.procs, args.probe, args.seconds, args.heartbeat_interval_s,
                args.join_grace_s, nice, heartbeats_per_s=args.max_heartbeats_per_s)
            for count in args.nodes for nice in args.nice]
    record = {"procs": args.procs, "probe": args.probe, "load": load,
              "machine": "%d cores" % os.cpu_count(), "rows": rows}
    print(json.dumps(record, indent=1))
    if args.write:
        with open(JSON_PATH, "w") as f:
            json.dump(record, f, indent=1)
        with open(MD_PATH, "w") as f:
            f.write(render(record))
        print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
