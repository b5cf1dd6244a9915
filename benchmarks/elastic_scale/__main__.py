"""python -m benchmarks.elastic_scale [--nodes 2 4 8 16] [--values N] [--rounds R] [--render]

Runs the scale benchmark (see the package's doc) and writes benchmarks/results/
elastic_scale.{json,md}; --render writes the .md again from the recorded JSON."""

import argparse
import json
import os
import subprocess
import sys
import time

from .._util import ROOT
from ..slow_link import link as slow_link

RESULTS = os.path.join(ROOT, "benchmarks", "results")
JSON_PATH = os.path.join(RESULTS, "elastic_scale.json")
MD_PATH = os.path.join(RESULTS, "elastic_scale.md")
SUBNET = "10.219.9."


class Switch(slow_link.Namespaces):
    """`count` hosts (namespaces, SUBNET.1...) each joined by a veth pair to a bridge in a
    switch namespace; unshaped."""

    def __init__(self, count):
        super().__init__()
        base = "%s%dz" % (slow_link.PREFIX, os.getpid())
        self.switch = base + "s"
        self.hosts = [base + "%02d" % i for i in range(count)]

    def make(self):
        ip, sw = slow_link.ip, self.switch
        for ns in [sw] + self.hosts:
            self.add(ns)
        ip("-n", sw, "link", "add", "br0", "type", "bridge")
        ip("-n", sw, "link", "set", "br0", "up")
        for index, ns in enumerate(self.hosts):
            port, end = "p" + ns, "e" + ns
            ip("link", "add", port, "type", "veth", "peer", "name", end)
            ip("link", "set", port, "netns", sw)
            ip("-n", sw, "link", "set", port, "master", "br0")
            ip("-n", sw, "link", "set", port, "up")
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "link", "set", end, "name", "eth0")
            ip("-n", ns, "addr", "add", "%s%d/24" % (SUBNET, index + 1), "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")


def run(count, values, rounds, timeout_s=900.0):
    """One run at `count` nodes: every member's JSON lines."""
    ips = ["%s%d" % (SUBNET, i + 1) for i in range(count)]
    member = [sys.executable, "-m", "benchmarks.elastic_scale.member"]
    with Switch(count) as switch:
        procs = [subprocess.Popen(
            ["ip", "netns", "exec", ns] + member + [str(rank), str(count), str(values),
                                                    str(rounds)] + ips,
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
            for rank, ns in enumerate(switch.hosts)]
        deadline = time.monotonic() + timeout_s
        rows = []
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise RuntimeError("a member failed (exit %s)" % proc.returncode)
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def summary(rows):
    """Per (nodes, way): the median member's bytes per round (link and counted) and round
    time, against 2 m (m: one member's whole message)."""
    table = {}
    for row in rows:
        table.setdefault((row["size"], row["way"]), []).append(row)
    out = []
    for (size, way), members in sorted(table.items()):
        link = sorted(r["link_bytes"] / r["rounds"] for r in members)[len(members) // 2]
        counted = sorted(r["counted_bytes"] / r["rounds"] for r in members)[len(members) // 2]
        message = members[0]["message_bytes"]
        out.append({"nodes": size, "way": way, "link_bytes_per_round": link,
                    "counted_bytes_per_round": counted, "message_bytes": message,
                    "vs_two_messages": link / (2 * message),
                    "round_s": sorted(r["round_s"] for r in members)[len(members) // 2]})
    return out


def render(record):
    lines = ["# An elastic round's cost as nodes are added", "",
             "`python -m benchmarks.elastic_scale`: %d float32 values (an int8 message of m = %d "
             "bytes) per node, %d rounds, each node a namespace on one switch (unshaped veth), "
             "this machine's %s; load average %s at the start. Bytes are each node's link's "
             "kernel counter (TCP/IP headers and acknowledgements included), the median node, "
             "per round; times are the median node's median round (every node on the "
             "machine's 2 cores: they grow with the nodes' share of the cores, not the "
             "link)." % (record["values"], record["rows"][0]["message_bytes"],
                         record["rounds"], record["machine"], record["load"]), "",
             "| nodes | round | bytes sent per node per round | counted by platoon | / 2 m | "
             "round time |", "|---|---|---|---|---|---|"]
    for row in record["rows"]:
        lines.append("| %d | %s | %d | %d | %.2fx | %.3f s |" % (
            row["nodes"], row["way"], row["link_bytes_per_round"],
            row["counted_bytes_per_round"], row["vs_two_messages"], row["round_s"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.elastic_scale")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--values", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--render", action="store_true")
    args = parser.parse_args(argv)
    if args.render:
        with open(JSON_PATH) as f:
            record = json.load(f)
    else:
        why = slow_link.missing()
        if why:
            print("elastic_scale: cannot make network namespaces: %s" % why, file=sys.stderr)
            return 2
        slow_link.remove_stale()
        rows = []
        load = "%.1f" % os.getloadavg()[0]
        for count in args.nodes:
            rows += run(count, args.values, args.rounds)
            print("%d nodes done" % count, file=sys.stderr)
        record = {"values": args.values, "rounds": args.rounds, "load": load,
                  "machine": "%d cores" % os.cpu_count(), "rows": summary(rows),
                  "members": rows}
        with open(JSON_PATH, "w") as f:
            json.dump(record, f, indent=1)
    with open(MD_PATH, "w") as f:
        f.write(render(record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
