"""platoon-launcher --hosts ... --elastic, real jobs on 127.0.0.1: a node or the lighthouse
killed -9 and restarted, Ctrl-C, every node failing, nodes joining a lighthouse of their own."""

import json
import os
import re
import signal
import subprocess

import numpy as np
import pytest

from platoon.elastic.quorum import GONE_SILENCE_S as GONE_S

from elastic_helpers import GRACE_S, SLACK_S, WORKER, quorum_of
from helpers import Proc, long_run, platoon_segments, wait_until

HEARTBEAT_S = 15  # the kill test's heartbeat timeout: the survivors must not wait it out


def _alive(pid):
    """Whether process `pid` exists and is no zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _mentioning(text):
    """Pids of the live processes whose command line holds `text`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if text.encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def _stop(launcher, tmp_path):
    """Stop `launcher` as Ctrl-C would (SIGTERM: it stops its nodes, whose mpiexec runs them
    in sessions of their own), then kill what is left: the launcher, and any process whose
    command line holds `tmp_path` (only this test's job does)."""
    if launcher.popen.poll() is None:
        launcher.popen.send_signal(signal.SIGTERM)
        try:
            launcher.popen.wait(15)
        except subprocess.TimeoutExpired:
            pass
    launcher.kill()
    for pid in _mentioning(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("rule", [
    ["--tie-outer-lr", "1", "--tie-outer-momentum", "0"],
    pytest.param(["--tie-outer", "easgd", "--tie-beta", "0.5"], marks=long_run(
        "the same job with the EASGD tie, about 10 s; tests/elastic/test_tie.py checks its "
        "round"))], ids=["diloco", "easgd"])
def test_launcher_elastic_job_survives_a_kill_restarts_the_node_healed_ends_on_one_centre(
        tmp_path, rule):
    """platoon-launcher --hosts (three nodes on this machine, one worker each) --elastic: a
    lighthouse with a new secret, and one node runner per host under an mpiexec of its own.
    Their centres are tied every 0.2 s over int8 by DiLoCo's outer step at lr 1 without
    momentum (plain averaging), or by EASGD. Node 3's controller is killed -9
    after its first round (its worker dies with it, the reaper frees its shared memory): its
    mpiexec alone ends, nodes 1 and 2 go on in the next quorum (within seconds, not the 15 s
    heartbeat timeout: they report node 3 gone as their round breaks), and the launcher
    (--restart 1) starts node 3 again under its name: it is healed from a peer (it takes
    their anchor) and contributes in the same round, the first of its group. Then every node
    ends, all three save the same finite centre, as good as their workers, and the launcher
    exits 0 leaving no process and no shared memory."""
    from platoon import load_centre
    stop, logs = tmp_path / "stop", tmp_path / "logs"
    a, b, c = names = ["127.0.0.1-%d" % i for i in (1, 2, 3)]
    n = {name: re.escape(name) for name in names}
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts"] + ["127.0.0.1"] * 3 + [
        "--elastic", "-n", "1", "--min-nodes", "2", "--heartbeat-timeout-s", str(HEARTBEAT_S),
        "--tie-every-s", "0.2"] + rule + [
        "--restart", "1", "--log-dir", str(logs), "--", "60", str(stop)],
        env={"ELASTIC_WORKER_EVALUATE": "1"})
    try:
        match, _ = launcher.wait_for_match(r"\[node-%s\] platoon.elastic: node \S+, controller "
                                           r"pid (\d+), job (\S+)," % n[c], 30)
        pid, c_job = int(match.group(1)), match.group(2)
        # every node has made a round, so all three are in one group when node 3 dies (a node
        # that starts late, past the first quorum's grace, makes its first round in the
        # quorum of all three: killed before, node 3 would leave it building that group)
        for x in names:
            launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: first contributing round"
                                    % (n[x], n[x]), 30)
        everyone = r"\[lighthouse\] .*lighthouse: quorum (\d+): %s$" % ", ".join(
            n[x] for x in names)
        _, index = launcher.wait_for_match(everyone, 10)
        os.kill(pid, signal.SIGKILL)
        launcher.wait_for_match(r"platoon-launcher: node %s failed \(.*\); starting it again \(0 "
                                r"restart\(s\) left\)" % n[c], 10, index)
        # 1 and 2 go on in a newer quorum: of the two of them, or of all three again when the
        # restarted node 3 heartbeats before the killed one's timeout (it then takes its name)
        went_on = [launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: outer rounds go on "
                                           r"in quorum (\d+) \(%s, %s(, %s)?\), (\S+) s after a "
                                           r"round broke" % (n[x], n[x], n[a], n[b], n[c]),
                                           GONE_S + GRACE_S + SLACK_S, index)[0]
                   for x in (a, b)]
        assert int(went_on[0].group(1)) > int(re.search(everyone, launcher.lines[index]).group(1))
        told = r"\[node-(%s|%s)\] .* WARNING: node \S+: the data plane of %s \(quorum \d+\) no " \
            r"longer answers: told the lighthouse" % (n[a], n[b], n[c])
        assert any(re.match(told, line or "") for line in launcher.lines[index:]), \
            launcher.output
        healed, _ = launcher.wait_for_match(
            r"\[node-%s.restart1\] .* WARNING: node %s: healed from (\S+) in quorum (\d+) "
            r"\(outer round (\d+)\), (\S+) s after its start" % (n[c], n[c]), 30, index)
        assert healed.group(1) in (a, b)
        first, _ = launcher.wait_for_match(r"\[node-%s.restart1\] .* WARNING: node %s: first "
                                           r"contributing round (\S+) s after its start \(outer "
                                           r"round (\d+); round (\d+) of its group in quorum "
                                           r"(\d+); on the way: ([^)]*)\)" % (n[c], n[c]), 10,
                                           index)
        # healed and stepped in its group's first round; its first move goes in the next
        # (round 2 of that group, unless a newer quorum came between)
        assert int(first.group(2)) >= int(healed.group(3)) + 2, (healed.group(0), first.group(0))
        assert first.group(3) == "2" or first.group(4) != healed.group(2), (
            healed.group(0), first.group(0))
        assert [m.split(" ")[0] for m in first.group(5).split(", ")] == [
            "centre", "heartbeating", "group", "healed"], first.group(0)
        stop.write_text("")
        assert launcher.wait(30) == 0, launcher.output
        summary = launcher.output[launcher.output.index("job summary"):]
        assert "node-%s on 127.0.0.1: failed (exit code 9)" % c in summary, summary
        assert "node-%s.restart1 on 127.0.0.1: finished" % c in summary, summary
        assert "the nodes alive at the end saved the same agreed centre" in summary, summary
        centres = [load_centre(str(logs / ("centre-%s.npz" % x)))["param_0"] for x in names]
        assert all(np.array_equal(centres[0], other) for other in centres[1:])
        assert np.isfinite(centres[0]).all()
        true_w = np.arange(256) / 256
        dists = [float(line.split()[2]) for line in launcher.lines
                 if line and re.match(r"\[node-\S+\] DIST ", line)]
        # Trained: from about 16 at the start (N(0, 1) weights) to the workers' own distance.
        # An outer step of lr 1 without momentum is plain averaging: the agreed centre is where
        # the workers are, however few rounds the run made (with the defaults, lr 0.7 and
        # momentum 0.9, it lags them by the outer steps it did not make: 0.17 to 1.2 with 5
        # rounds, the workers at 0.006 to 0.17)
        distance = float(np.linalg.norm(centres[0] - true_w))
        assert len(dists) == 3 and distance < min(4.0, 2 * max(dists) + 0.01), (distance, dists)
        # the final result, the agreed centre evaluated once, as its node's status file says;
        # the lighthouse's and the nodes' status files, what the launcher showed
        final = re.search(r"final result \(the agreed centre, evaluated once by node (\S+)\): "
                          r"dist (\S+)", summary)
        assert final and final.group(1) in names, summary
        assert abs(float(final.group(2)) - distance) < 1e-3, (final.group(2), distance)
        said = {x: json.loads((logs / ("node-%s.status.json" % x)).read_text())
                for x in (a, b, c + ".restart1")}
        assert all(s["state"] == "finished" and s["rounds"] > 0 for s in said.values()), said
        assert [s["name"] for s in said.values() if "final_result" in s] == [final.group(1)], \
            said
        lighthouse = json.loads((logs / "lighthouse.status.json").read_text())
        assert lighthouse["quorum"]["id"] >= max(s["quorums"][-1] for s in said.values())
        # no worker took itself for an MPI rank (mpiexec started each node)
        assert sum(line.endswith("] DISTRIBUTED none") for line in launcher.lines if line) == 4
        # each host's node its own slot, its own part of the data, the same after its restart
        shards = {}
        for line in launcher.lines:
            match = re.match(r"\[node-(\S+?)/worker0\] SHARD ([\d ]+)$", line or "")
            if match:
                shards.setdefault(match.group(1), set()).add(match.group(2))
        assert sorted(shards) == sorted(names) and all(len(s) == 1 for s in shards.values())
        parts = [set(s.pop().split()) for s in shards.values()]
        assert set.union(*parts) == set(map(str, range(12))) and sum(map(len, parts)) == 12
        assert os.stat(logs / "elastic.secret").st_mode & 0o777 == 0o600
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
        assert not [s for s in platoon_segments() if c_job.rpartition("-" + c)[0] in s]
    finally:
        _stop(launcher, tmp_path)
    print("nodes 1 and 2 back to outer rounds %s s after theirs broke; node 3 started again by "
          "the launcher healed %s s and first contributing %s s after its start; the centre "
          "%.4f from the true weights, the workers %s"
          % ("/".join(m.group(3) for m in went_on), healed.group(4), first.group(1), distance,
             dists))


def test_launcher_elastic_restarts_its_lighthouse_and_sigint_leaves_nothing(tmp_path):
    """The lighthouse that platoon-launcher --elastic --restart 1 started is killed -9: the
    launcher starts it again on its port, and the node, training on, joins its new quorum.
    Then Ctrl-C (SIGINT): the launcher stops the node (through its mpiexec) and the
    lighthouse, exits 130 with a summary that says the centre saved is the node's own, and
    leaves no process and no shared memory."""
    logs = tmp_path / "logs"
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "--elastic",
                     "-n", "1", "--restart", "1", "--log-dir", str(logs), "--", "60"])
    try:
        match, _ = launcher.wait_for_match(r"\[node-127.0.0.1\] platoon.elastic: node \S+, "
                                           r"controller pid \d+, job (\S+),", 30)
        first, index = launcher.wait_for_match(r"\[lighthouse\] .*lighthouse: quorum (\d+): "
                                               r"127.0.0.1$", 30)
        # the node has that quorum (else a lighthouse killed first, knowing nothing of it,
        # comes back numbering from the id the node reports: the same one)
        launcher.wait_for_match(r"\[node-127.0.0.1\] .*: rank \d+ of quorum %s " % first.group(1),
                                30)
        (lighthouse,) = [pid for pid in _mentioning(str(tmp_path))
                         if "platoon.elastic.lighthouse" in _cmdline(pid)]
        os.kill(lighthouse, signal.SIGKILL)
        launcher.wait_for_match(r"platoon-launcher: the lighthouse failed \(killed by SIGKILL\); "
                                r"starting it again on port \d+ \(0 restart\(s\) left\)", 10,
                                index)
        again, _ = launcher.wait_for_match(r"\[lighthouse.restart1\] .*lighthouse: quorum "
                                           r"(\d+): 127.0.0.1$", 5 + SLACK_S, index)
        assert int(again.group(1)) > int(first.group(1))
        launcher.wait_for_line("[node-127.0.0.1/worker0] DISTRIBUTED none", 30)  # it runs
        launcher.popen.send_signal(signal.SIGINT)
        assert launcher.wait(30) == 128 + signal.SIGINT, launcher.output
        summary = launcher.output[launcher.output.index("job summary"):]
        assert "node-127.0.0.1 on 127.0.0.1: stopped" in summary, summary
        assert "the job ended before its final round" in summary, summary
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
        job_id = match.group(1).rpartition("-127.0.0.1")[0]
        assert not [s for s in platoon_segments() if job_id in s]
    finally:
        _stop(launcher, tmp_path)


def test_launcher_elastic_job_whose_every_node_fails_fails_and_leaves_nothing(tmp_path):
    """Both nodes' workers fail at once (a bad argument): each node ends, the launcher, with
    no restart left, reports each, says that every node failed, exits 1, and stops the
    lighthouse, leaving no process."""
    logs = tmp_path / "logs"
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "127.0.0.1",
                     "--elastic", "-n", "1", "--log-dir", str(logs), "--", "not-seconds"])
    try:
        assert launcher.wait(60) == 1, launcher.output
        for name in ("127.0.0.1-1", "127.0.0.1-2"):
            assert re.search(r"platoon-launcher: node %s failed \(exit code \d+\); (the other "
                             r"nodes go on without it|no other node runs) \(no restart left"
                             % re.escape(name), launcher.output), launcher.output
        assert "platoon-launcher: job failed: every node failed" in launcher.output
        assert "no centre saved here (the job ended before its final round)" in launcher.output
        assert "could not convert string to float: 'not-seconds'" in launcher.output
        wait_until(lambda: not _mentioning(str(tmp_path)), 10, "the job's processes to end")
    finally:
        _stop(launcher, tmp_path)


def test_nodes_train_on_while_the_lighthouse_is_down_and_rejoin_it_restarted(job, tmp_path):
    """Two nodes started by platoon-launcher --hosts ... --elastic --join (the lighthouse is
    the job's own, started apart): the lighthouse is killed -9 mid-run: the nodes' outer
    rounds go on in the group they have (it needs no lighthouse); restarted on its port, it
    numbers a quorum above theirs, the nodes move to its group, and they end on one saved
    centre; the launcher exits 0 and starts no lighthouse of its own."""
    from platoon import load_centre
    lighthouse = job.lighthouse(min_nodes=2)
    stop, logs = tmp_path / "stop", tmp_path / "logs"
    names = ["127.0.0.1-1", "127.0.0.1-2"]
    launcher = Proc(["-m", "platoon.launch.cli", WORKER, "--hosts", "127.0.0.1", "127.0.0.1",
                     "--elastic", "-n", "1", "--join", job.address, "--secret-file",
                     str(tmp_path / "secret"), "--tie-every-s", "0.2", "--log-dir", str(logs),
                     "--", "60", str(stop)])
    try:
        for name in names:
            launcher.wait_for_match(r"\[node-%s\] .* WARNING: node %s: first contributing round"
                                    % (re.escape(name), re.escape(name)), 30)
        first, _ = quorum_of(lighthouse, names)
        lighthouse.kill()
        again = job.lighthouse(min_nodes=2, port=int(job.address.rpartition(":")[2]))
        second, _ = quorum_of(again, names, timeout=5 + SLACK_S)
        assert second > first
        for name in names:  # (each in its group: stopped before, it could end in the first)
            launcher.wait_for_match(r"\[node-%s\] .* node %s: rank \d of quorum %d "
                                    % (re.escape(name), re.escape(name), second), 5 + SLACK_S)
        stop.write_text("")
        assert launcher.wait(30) == 0, launcher.output
        for name in names:
            summary = [line for line in launcher.lines if line and line.startswith(
                "[node-%s] " % name) and "the centre tie sent" in line]
            made = [int(q) for q in re.search(r"in quorum\(s\) ([\d,]+);", summary[0])
                    .group(1).split(",")]  # a starved heartbeat may add a quorum between or after
            assert first in made and second in made and made.index(first) < made.index(second), \
                launcher.output
        assert "lighthouse" not in " ".join(os.listdir(logs))  # joined, not started
        centres = [load_centre(str(logs / ("centre-%s.npz" % n)))["param_0"] for n in names]
        assert np.array_equal(*centres) and np.isfinite(centres[0]).all()
    finally:
        _stop(launcher, tmp_path)


def test_the_launcher_shows_what_the_status_files_say_not_the_logs(tmp_path):
    """The status line's quorum comes from the lighthouse's status file, and the summary's
    final result and kept-own-centre note from the nodes': a log that says otherwise (in the
    format the launcher once parsed) changes nothing. (Stand-in processes: `true`.)"""
    import io
    import shutil

    from platoon._os.statusfile import quorum_entry, write_status
    from platoon.launch import cli
    from platoon.launch.elastic import ElasticLaunch
    from platoon.launch.supervision import Process
    out = io.StringIO()
    launch = ElasticLaunch(cli.parse_args([WORKER, "--hosts", "127.0.0.1", "127.0.0.1",
                                           "--elastic", "--log-dir", str(tmp_path)]), out)
    a, b = launch.names
    true, env = "-x:" + shutil.which("true"), dict(os.environ)
    launch.lighthouse = Process("lighthouse", true, [], env, str(tmp_path / "lighthouse.log"))
    for name in (a, b):
        proc = Process("node-" + name, true, [], env, str(tmp_path / ("node-%s.log" % name)),
                       index=name, device="127.0.0.1")
        launch.nodes[name] = proc
        launch.started_nodes.append(proc)
    for proc in launch.everyone():
        proc.popen.wait(10)
        proc.poll()
    (tmp_path / "lighthouse.log").write_text("lighthouse: quorum 9: x, y\n")
    (tmp_path / ("node-%s.log" % b)).write_text(
        "platoon.elastic: final result (the agreed centre, evaluated once by node x): loss 9\n")
    launch.show_status(force=True)
    assert "no quorum yet" in out.getvalue() and "quorum 9" not in out.getvalue()
    write_status(launch.status_path("lighthouse"), {
        "address": "127.0.0.1:1", "pid": 1, "quorum": quorum_entry(3, [a, b]), "left_out": {}})
    write_status(launch.status_path("node-" + a), {
        "name": a, "state": "finished", "quorum": quorum_entry(3, [a, b]), "quorums": [3],
        "rounds": 4, "kept_own_centre": False,
        "final_result": {"metrics": {"loss": 0.25}, "worker": 0}})
    write_status(launch.status_path("node-" + b), {
        "name": b, "state": "finished", "quorum": None, "quorums": [3], "rounds": 4,
        "kept_own_centre": True})
    launch.show_status(force=True)
    assert "quorum 3: %s, %s" % (a, b) in out.getvalue(), out.getvalue()
    for name, proc in launch.nodes.items():
        launch._ended[proc] = "finished"
        (tmp_path / ("centre-%s.npz" % name)).write_bytes(b"")  # saved during the job
    launch._finished_ok = True
    summary = "\n".join(launch.summary())
    assert "final result (the agreed centre, evaluated once by node %s): loss 0.25" % a \
        in summary, summary
    assert "loss 9" not in summary
    assert "node(s) %s gave the final round up and kept their own centre" % b in summary
