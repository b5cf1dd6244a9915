"""One run of one method over one link, in fresh processes: start them (in the two
namespaces where there is a link), wait to a deadline, read the results and the veth
counters, check that the method's traffic crossed the link, and clean up whatever happened."""

import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from platoon._os.process import die_with_parent

from .._util import ROOT, SINGLE_THREAD_ENV
from . import link as netns
from .methods import METHODS

CONTROLLER = os.path.join(ROOT, "benchmarks", "slow_link", "controller.py")
GLOO_PORT = 29517  # a fresh namespace has every port free
STARTUP_ALLOWANCE_S = 150.0  # start-up, warm-up, evaluations and the end, past the cap
CODEC_SHARE = {"float32": 1.0, "int8": 0.25, "int4": 0.125}  # of a float32 round, at least


class LinkNotCrossed(RuntimeError):
    """A method's traffic did not go over the veth (e.g. MPI through shared memory)."""


def _train_cmd(config_path, *rank):
    return [sys.executable, "-m", "benchmarks.slow_link.train", config_path] + list(rank)


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", **SINGLE_THREAD_ENV)
    env.update(extra)
    return env


def _die_with_us():
    """Child side of Popen: SIGTERM this process if the benchmark dies (mpiexec then ends
    its ranks); what is left in the namespaces is removed by the next run."""
    die_with_parent(signal.SIGTERM)


def _session_pids(sid):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid:  # after ")": state, ppid, pgrp, session
                pids.append(int(entry))
    return pids


def stop_session(popen, grace_s=5.0):
    """SIGTERM every process of `popen`'s session (it was started in its own), then SIGKILL
    those left after `grace_s`; reap `popen`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = _session_pids(popen.pid)
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _session_pids(popen.pid):
            if popen.poll() is None:
                try:
                    popen.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.05)
        if not _session_pids(popen.pid):
            break
    try:
        popen.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass


def _mapped_by_a_live_process(path):
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/maps" % entry) as f:
                    if path in f.read():
                        return True
            except OSError:
                pass
    return False


def clean_shm(before, job_id):
    """Unlink the /dev/shm entries this run left: platoon's (named after `job_id`) and
    MPICH's made since `before` that no live process maps. Returns their names."""
    left = []
    for path in sorted(set(glob.glob("/dev/shm/*")) - before):
        name = os.path.basename(path)
        ours = job_id in name or (name.startswith("mpich_shm_")
                                  and not _mapped_by_a_live_process(path))
        if ours:
            try:
                os.unlink(path)
                left.append(name)
            except OSError:
                pass
    return left


def _config(name, link, problem, optimizer, cap_s, seed, result_dir):
    """`optimizer`: the workers' optimizer settings with their "lr" (see
    time_to_accuracy.harness.make_optimizer and make_schedule)."""
    method = METHODS[name]
    cfg = dict(method.settings, **optimizer)
    config = {"method": name, "kind": method.kind, "problem": dataclasses.asdict(problem),
              "problem_class": type(problem).__name__,
              "cfg": cfg, "seed": seed, "cap_s": cap_s, "result_dir": result_dir,
              "world": 1 if method.kind == "single" else 2,
              "device": netns.DEVICE if link != "none" else None}
    if method.kind in ("ddp", "local_sgd"):
        host = netns.IPS[0] if link != "none" else "127.0.0.1"
        config["address"] = "tcp://%s:%d" % (host, GLOO_PORT)
    return config


def commands(name, link, config_path, result_dir, deadline_s, mpiexec, hosts=None):
    """[(argv, extra environment)] of the processes a run starts (pure but for `hosts`)."""
    method = METHODS[name]
    if method.kind == "single":
        return [(_train_cmd(config_path, "0"), {})]
    if method.kind in ("ddp", "local_sgd"):
        if hosts is None:
            return [(_train_cmd(config_path, str(r)), {"GLOO_SOCKET_IFNAME": "lo"})
                    for r in range(2)]
        return [(hosts.prefix(r) + _train_cmd(config_path, str(r)),
                 {"GLOO_SOCKET_IFNAME": netns.DEVICE}) for r in range(2)]
    node = [sys.executable, "-m", "platoon.mpi", "--workers", "1", "--controller", CONTROLLER,
            "--controller-args", "%s %g" % (result_dir, deadline_s)] + list(method.options)
    node += ["--"] + _train_cmd(config_path)
    if hosts is None:
        return [([mpiexec, "-n", "2"] + node, {})]
    return [(hosts.mpiexec(mpiexec) + node, dict(netns.MPI_TCP_ENV))]


def _read(result_dir, pattern):
    out = []
    for path in sorted(glob.glob(os.path.join(result_dir, pattern))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def check_crossed(name, row, model_bytes):
    """Raise LinkNotCrossed unless each veth end sent at least what the method must have
    sent: platoon, the tie's own count of its messages (at least a model's worth per round
    at its codec's share); DDP, a model's worth per step; local SGD, per period."""
    method = METHODS[name]
    sent = row["bytes_job"]
    if method.kind == "platoon":
        codec = "float32"
        if "--tie-compress" in method.options:
            codec = method.options[method.options.index("--tie-compress") + 1]
        for node, tie in enumerate(row["tie"]):
            # (the final round may carry only a digest: the centres already agreed)
            need = max(0.97 * tie["tie_bytes_sent"], (tie["tie_rounds"] - 1) * model_bytes
                       * CODEC_SHARE.get(codec, 0.1) * 0.9)
            if tie["tie_rounds"] < 1 or tie["tie_bytes_sent"] <= 0 or sent[node] < need:
                raise LinkNotCrossed(
                    "%s over %s: node %d's veth end sent %d bytes, but its tie counted %d "
                    "bytes in %d rounds (at least %d expected on the wire): MPI did not "
                    "cross the link (see MPI_TCP_ENV in benchmarks/slow_link/link.py)"
                    % (name, row["link"], node, sent[node], tie["tie_bytes_sent"],
                       tie["tie_rounds"], need))
        return
    rounds = min(row["steps"]) // method.settings.get("period", 1)
    need = 0.9 * rounds * model_bytes
    for side, n in enumerate(sent):
        if n < need:
            raise LinkNotCrossed("%s over %s: host %d's veth end sent %d bytes in %d rounds of "
                                 "a %d-byte model: gloo did not cross the link"
                                 % (name, row["link"], side, n, rounds, model_bytes))


def run_one(name, link, problem, optimizer, cap_s, seed, mpiexec, model_bytes, log, tag=""):
    """Run `name` over `link` once; returns its row (with "error" when it failed)."""
    method = METHODS[name]
    workdir = tempfile.mkdtemp(prefix="%s%d-" % (netns.PREFIX, os.getpid()))
    result_dir = os.path.join(workdir, "results")
    os.makedirs(result_dir)
    job_id = "slk%d%s" % (os.getpid(), tag)
    row = {"method": name, "link": link, "kind": method.kind, "options": list(method.options),
           "settings": dict(method.settings), "lr": optimizer["lr"], "seed": seed,
           "cap_s": cap_s}
    shm_before = set(glob.glob("/dev/shm/*"))
    procs, hosts, out = [], None, None
    started = time.monotonic()
    try:
        config = _config(name, link, problem, optimizer, cap_s, seed, result_dir)
        config_path = os.path.join(workdir, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        if link != "none":
            hosts = netns.TwoHosts(netns.rate_bits(link), tag).__enter__()
        deadline_s = cap_s + STARTUP_ALLOWANCE_S
        tx_before = hosts.tx_bytes() if hosts else None
        out = open(os.path.join(workdir, "output.log"), "w")
        # (the controllers stop the job on their own a little before it would be killed)
        for argv, extra in commands(name, link, config_path, result_dir, deadline_s - 30,
                                    mpiexec, hosts):
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=_env(PLATOON_JOB_ID=job_id,
                                                                   **extra),
                                          stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_us))
        end = time.monotonic() + deadline_s
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError("did not finish within %.0f s" % deadline_s) from None
        codes = [p.returncode for p in procs]
        ranks = _read(result_dir, "rank-*.json")
        if any(codes) or len(ranks) != config["world"]:
            raise RuntimeError("exit codes %s, %d of %d results" % (codes, len(ranks),
                                                                    config["world"]))
        row.update(_row(ranks, _read(result_dir, "controller-*.json"), problem))
        if hosts:
            tx_after = hosts.tx_bytes()
            row["bytes_job"] = [b - a for a, b in zip(tx_before, tx_after)]
            row["shaping"] = hosts.shaping()
            row["bytes_window"] = [r["tx_end"] - r["tx_start"] for r in ranks
                                   if r.get("tx_start") is not None]
            check_crossed(name, row, model_bytes)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        row["error"] = "%s: %s" % (type(exc).__name__, exc)
        if out is not None:
            out.flush()
            with open(out.name) as f:
                row["output_tail"] = f.read()[-4000:]
        log("FAILED %s over %s: %s\n%s" % (name, link, row["error"],
                                           row.get("output_tail", "")))
    finally:
        for p in procs:
            stop_session(p)
        if hosts is not None:
            hosts.close()
        if out is not None:
            out.close()
        row["left_in_shm"] = clean_shm(shm_before, job_id)
        row["wall_s"] = time.monotonic() - started
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def _row(ranks, controllers, problem):
    by_rank = sorted(ranks, key=lambda r: r["rank"])
    zero = by_rank[0]
    row = {"reached": zero["reached"] is not None,
           "time_s": zero["reached"][0] if zero["reached"] else None,
           "steps_at_target": zero["reached"][1] if zero["reached"] else None,
           "last_metric": zero["last_metric"], "target": problem.target,
           "best_metric": min((m for _, _, m in zero["trace"]), default=None),
           "steps": [r["steps"] for r in by_rank],
           "clock_s": [r["clock_s"] for r in by_rank],
           "step_s": [r["step_s"] for r in by_rank],
           "compute_share": [r["cpu_s"] / r["clock_s"] if r["clock_s"] > 0 else None
                             for r in by_rank],
           "sync_s": [r.get("sync_s") for r in by_rank],
           "trace": zero["trace"]}
    if controllers:
        row["tie"] = sorted(controllers, key=lambda c: c["node"])
    return row
