"""Multi-node jobs under `mpiexec -n 2` on this machine: two controllers stand in for two nodes,
each with two workers and its own centre."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from platoon._centre.shmem import pid_alive
from platoon._os.environment import THREAD_VARIABLES
from platoon._os.process import find_mpiexec

from helpers import EXPERIMENTS, PROCS, ROOT, Proc, platoon_segments, wait_until

try:
    from mpi4py import MPI  # noqa: F401  (fails without an MPI library)
    MPI_ERROR = None
except ImportError as exc:
    MPI_ERROR = str(exc)
MPIEXEC = find_mpiexec()

pytestmark = [
    pytest.mark.skipif(MPI_ERROR is not None, reason="mpi4py cannot be imported (%s): pip install "
                       "-e '.[mpi]' to run the multi-node tests" % MPI_ERROR),
    pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to python or on PATH: pip "
                       "install -e '.[mpi]' (the mpich wheel provides it)"),
]

WORKER = os.path.join(PROCS, "mpi_worker.py")
ENVCHECK = os.path.join(EXPERIMENTS, "envcheck_worker.py")
NO_THREAD_CAPS = {var: None for var in THREAD_VARIABLES}  # the user set none


def two_ranks(script):
    """tests/procs `script` run on 2 MPI ranks (one thread each); its finished process, which
    exited 0."""
    out = subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.join(PROCS, script)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    return out


class MpiJob(Proc):
    """`mpiexec -n 2 python -m platoon.mpi --workers 2 ... -- mpi_worker.py SCENARIO`."""

    def __init__(self, scenario, *options, env_extra=None, mpiexec=(MPIEXEC, "-n", "2")):
        """`env_extra`: variables to set, or to unset (None)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATOON_")}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env.update(env_extra or {})
        env = {k: v for k, v in env.items() if v is not None}
        self.args = list(mpiexec) + [sys.executable, "-m", "platoon.mpi", "--workers", "2"]
        self.args += list(options)
        if "--" not in options:
            self.args += ["--", WORKER, scenario]
        self.popen = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=env, text=True, start_new_session=True)
        self.pid = self.popen.pid
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def count(self, word):
        return self.output.count(word)

    def wait_for_count(self, word, n, timeout=20.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.count(word) < n:
                if None in self.lines or time.monotonic() >= deadline:
                    pytest.fail("expected %d x %r:\n%s" % (n, word, self.output))
                self._cond.wait(max(0.0, deadline - time.monotonic()))

    def job_id(self):
        return re.search(r"job (\w+)-n0", self.output).group(1)


@pytest.fixture
def mpi_job():
    jobs = []

    def start(scenario, *options, **kwargs):
        job = MpiJob(scenario, *options, **kwargs)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def test_all_reduce_every_op_and_dtype_exact_across_nodes_and_barrier(mpi_job):
    job = mpi_job("collectives", "--controller",
                  os.path.join(PROCS, "step_controller.py") + ":StepController")
    assert job.wait(60) == 0, job.output
    assert job.count("OK node") == 4, job.output
    for g in range(4):
        assert "global %d of 4" % g in job.output
    assert not [s for s in platoon_segments() if job.job_id() in s]


def test_a_multi_node_job_evaluates_the_agreed_centre_once_and_saves_it(mpi_job, tmp_path):
    """Node 0's workers finish first and wait; after the final tie round node 0's last worker
    evaluates the agreed centre, once (each node's last worker evaluated its own centre,
    before the final round); node 0 prints the result, keeps it in its status file and saves
    the agreed centre where platoon.load_centre finds it (node 1 writes neither)."""
    from platoon import load_centre
    from platoon._os.statusfile import read_status
    job = mpi_job("final", "--tie-every-s", "0.05", env_extra={
        "PLATOON_CHECKPOINT_PATH": str(tmp_path / "centre.npz"),
        "PLATOON_STATUS_FILE": str(tmp_path / "status.json")})
    assert job.wait(60) == 0, job.output
    evaluated = re.findall(r"EVALUATED (\S+) node (\d)", job.output)
    assert len(evaluated) == 1 and evaluated[0][1] == "0", job.output
    (centre,) = load_centre(str(tmp_path)).values()
    assert float(evaluated[0][0]) == float(centre[0]), (centre, job.output)
    assert job.count("platoon.mpi: final result (the agreed centre, after the final tie "
                     "round, evaluated once by node 0's worker") == 1, job.output
    assert read_status(str(tmp_path / "status.json"))["final_result"]["metrics"] == {
        "centre": float(evaluated[0][0])}


def test_every_worker_of_every_node_reads_its_own_shard(mpi_job):
    """`platoon.shard(items, w)`, the documented data line: the four workers of two nodes get
    disjoint parts that cover the items (each node's worker 0 read the same shard when the
    line counted the workers per node)."""
    job = mpi_job("shard")
    assert job.wait(60) == 0, job.output
    parts = re.findall(r"SHARD ([\d ]+) node", job.output)
    assert len(parts) == 4, job.output
    items = [int(i) for part in parts for i in part.split()]
    assert sorted(items) == list(range(20)), job.output


@pytest.mark.parametrize("every", [["--tie-every-s", "0.02"], ["--tie-every-syncs", "3"]])
def test_hierarchical_easgd_pulls_the_node_centres_together(mpi_job, every):
    if "--tie-every-syncs" in every:
        every = every + ["--", WORKER, "tie", "report"]  # workers report a sync per loop
    job = mpi_job("tie", "--tie-beta", "0.5", *every)
    assert job.wait(60) == 0, job.output
    found = re.findall(r"TIED \d+ spread \S+ centre (\S+) node (\d)", job.output)
    assert len(found) == 4, job.output
    # The centres start at +1 and -1; each tie halves their distance and keeps their mean at
    # exactly 0, so each nears 0 from its own side (workers read them a round apart at most).
    for centre, node in found:
        assert abs(float(centre)) < 1e-6 and (float(centre) > 0) == (node == "0"), found


def _node_centres(out_dir, kind):
    """The arrays node 0 and node 1 saved (kind "centre": ctl.centre after serve(); "final":
    the final checkpoint)."""
    from platoon._centre import checkpoint
    centres = []
    for node in range(2):
        path = os.path.join(str(out_dir), "%s-node%d.npz" % (kind, node))
        if kind == "final":
            centres.append(checkpoint.load(path)[0])
        else:
            with np.load(path) as data:
                centres.append([data["arr_%d" % i] for i in range(len(data.files))])
    return centres


def test_nodes_finishing_at_different_times_end_with_one_identical_centre(mpi_job, tmp_path):
    """Node 0's workers leave early; node 1's train on while tie rounds (beta 0.5) run. Once
    both are done a final round makes the node centres equal: bit for bit, in what each
    controller holds after serve() and in its final checkpoint."""
    job = mpi_job("uneven", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(tmp_path), "--tie-every-s", "0.05",
                  "--tie-beta", "0.5")
    assert job.wait(60) == 0, job.output
    assert job.count("LEFT after") == 4 and job.count("CENTRE node") == 2, job.output
    returned, final = _node_centres(tmp_path, "centre"), _node_centres(tmp_path, "final")
    for node in range(2):
        assert [a.dtype for a in returned[node]] == [np.dtype(np.float32), np.dtype(np.float64)]
        for got, saved in zip(returned[node], final[node]):
            assert got.tobytes() == saved.tobytes(), "node %d checkpointed another centre" % node
    for a, b in zip(*returned):
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), \
            "node centres differ by up to %g:\n%s" % (float(np.abs(a - b).max()), job.output)


# An ssh stand-in for mpiexec (hydra's -launcher-exec): "[-x] HOST COMMAND" runs COMMAND in
# HOST's network namespace, under HOST's own hostname.
NETNS_EXEC = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
case $1 in %s) ns=%s; name=%s ;; %s) ns=%s; name=%s ;; *) echo "no host $1" >&2; exit 2 ;; esac
shift
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && exec $*"
"""
NETNS_IPS = ("10.217.0.1", "10.217.0.2")
NETNS_DEVICE = "plt0"  # the veth end's name in both namespaces
TCP_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp",
           "UCX_NET_DEVICES": NETNS_DEVICE}  # MPICH over the veth, not shared memory


@pytest.fixture
def two_hosts(tmp_path):
    """Two network namespaces joined by a veth pair, each a host with its own hostname; returns
    the command that starts mpiexec on the first with one rank per host, MPI over TCP (UCX)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("two network namespaces need root, ip and unshare")
    names = ["plt%d%s" % (os.getpid(), side) for side in "ab"]
    made = []

    def ip(*args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True, timeout=10)

    try:
        for name in names:
            ip("netns", "add", name)
            made.append(name)
        ip("link", "add", names[0], "type", "veth", "peer", "name", names[1])
        for name, address in zip(names, NETNS_IPS):
            ip("link", "set", name, "netns", name)
            ip("-n", name, "link", "set", name, "name", NETNS_DEVICE)
            ip("-n", name, "addr", "add", address + "/24", "dev", NETNS_DEVICE)
            ip("-n", name, "link", "set", NETNS_DEVICE, "up")
            ip("-n", name, "link", "set", "lo", "up")
        launcher = tmp_path / "netns_exec.sh"
        launcher.write_text(NETNS_EXEC % (NETNS_IPS[0], names[0], "nodea",
                                          NETNS_IPS[1], names[1], "nodeb"))
        launcher.chmod(0o755)
        yield ["ip", "netns", "exec", names[0], "unshare", "--uts", "sh", "-c",
               'hostname nodea && exec "$@"', "sh", MPIEXEC, "-launcher", "ssh",
               "-launcher-exec", str(launcher), "-iface", NETNS_DEVICE,
               "-hosts", ",".join(NETNS_IPS), "-n", "2", "-ppn", "1"]
    except subprocess.CalledProcessError as exc:
        pytest.skip("cannot set up two network namespaces: %s" % (exc.stderr or b"").decode())
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_two_hosts_over_tcp_end_with_one_identical_centre(mpi_job, two_hosts, tmp_path):
    """The same over a real network stack: each node in its own network namespace, with its own
    hostname, MPI forced onto TCP over the veth pair between them."""
    job = mpi_job("uneven", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(tmp_path), "--tie-every-s", "0.05",
                  mpiexec=two_hosts, env_extra=TCP_ENV)
    assert job.wait(90) == 0, job.output
    assert job.count("LEFT after") == 4 and job.count("CENTRE node") == 2, job.output
    returned, final = _node_centres(tmp_path, "centre"), _node_centres(tmp_path, "final")
    assert all(a.tobytes() == b.tobytes() for node in range(2)
               for a, b in zip(returned[node], final[node])), "a node checkpointed another centre"
    for a, b in zip(*returned):
        assert a.tobytes() == b.tobytes(), \
            "node centres differ by up to %g:\n%s" % (float(np.abs(a - b).max()), job.output)


def _true_weights_distance(centre):
    (weights,) = centre
    return float(np.linalg.norm(weights - np.arange(weights.size) / weights.size))


@pytest.mark.parametrize("hosts", ["one host", "two hosts"])
def test_a_lagging_node_does_not_spoil_the_centre_of_a_finished_one(mpi_job, request, tmp_path,
                                                                    hosts):
    """Node 0 converges and leaves; node 1 idles through tie rounds (far from the true weights),
    then converges too. The job's final centre must be as close to the true weights as the
    workers got: a finished node's centre is not dragged toward the lagging one, nor a stale
    centre averaged into the end."""
    options = {}
    if hosts == "two hosts":
        options = dict(mpiexec=request.getfixturevalue("two_hosts"), env_extra=TCP_ENV)
    job = mpi_job("-", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(tmp_path), "--tie-every-s", "0.25",
                  "--", WORKER, "lagging", "1.0", **options)
    assert job.wait(90) == 0, job.output
    workers = [float(d) for d in re.findall(r"DIST (\S+)", job.output)]
    assert len(workers) == 4 and job.count("CENTRE node") == 2, job.output
    returned = _node_centres(tmp_path, "centre")
    assert returned[0][0].tobytes() == returned[1][0].tobytes(), job.output
    centre = _true_weights_distance(returned[0])
    print("centre %.6f workers %s" % (centre, " ".join("%.6f" % d for d in workers)))
    assert centre <= 2 * max(workers), \
        "the final centre is %.4g from the true weights, the workers %s:\n%s" % (
            centre, workers, job.output)


def test_a_stop_requested_on_one_node_reaches_every_node(mpi_job):
    job = mpi_job("stop")
    assert job.wait(60) == 0, job.output
    assert job.count("STOPPED target reached") == 4, job.output
    assert not [s for s in platoon_segments() if job.job_id() in s]


def test_workers_calling_different_collectives_get_an_error_not_a_hang(mpi_job):
    job = mpi_job("mismatch")
    assert job.wait(60) == 0, job.output
    assert job.count("MISMATCH the nodes' workers called different collectives: node 0: "
                     "('barrier',); node 1: ('all_reduce', '<f8', 3, 'sum')") == 4, job.output


def test_a_round_failing_on_one_node_fails_on_every_node(mpi_job):
    """Otherwise the other node would pair that round with the next one, silently wrong."""
    job = mpi_job("localfail")
    assert job.wait(60) == 0, job.output
    assert job.count("ROUND1 error") == 4, job.output
    assert job.count("ROUND2 4 ") == 4, job.output


@pytest.mark.slow
def test_a_hanging_node_ends_the_job_after_the_collective_timeout(mpi_job):
    job = mpi_job("hang", env_extra={"PLATOON_MPI_TIMEOUT_S": "2"})
    job.wait_for_count("READY", 4)
    start = time.monotonic()
    assert job.wait(30) != 0, job.output
    assert time.monotonic() - start < 15
    assert "did not reach" in job.output


@pytest.mark.parametrize("how", ["controller killed", "worker fails", "mpiexec terminated"])
def test_a_failure_on_one_node_ends_the_job_everywhere(mpi_job, how):
    job = mpi_job("fail" if how == "worker fails" else "forever")
    job.wait_for_count("READY", 4)
    job_id = job.job_id()
    workers = [int(re.search(r"READY node %d worker %d .* pid (\d+)\)" % (g // 2, g % 2),
                             job.output).group(1)) for g in range(4)]
    assert len(workers) == 4
    start = time.monotonic()
    if how == "controller killed":
        os.kill(int(re.search(r"node 1 of 2, controller pid (\d+)", job.output).group(1)),
                signal.SIGKILL)
    elif how == "mpiexec terminated":
        job.popen.terminate()
    assert job.wait(20) != 0, job.output
    elapsed = time.monotonic() - start
    assert elapsed < 10, "the job took %.1f s to end" % elapsed
    if how == "worker fails":
        assert "aborting the job" in job.output, job.output
    wait_until(lambda: not any(pid_alive(p) for p in workers), 10, "the workers to exit")
    wait_until(lambda: not [s for s in platoon_segments() if job_id in s], 10,
               "job %s's shared memory to go" % job_id)


def test_each_nodes_workers_take_its_gpus_in_turn(mpi_job, monkeypatch):
    """As the launcher's -n does: a node's workers get its visible GPUs in turn (here one,
    pretended, shared by both), with CUDA_VISIBLE_DEVICES, PCI bus order, their share of the
    cores and of the GPU for JAX."""
    for var in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(var, raising=False)
    job = mpi_job("-", "--", ENVCHECK,
                  env_extra=dict(NO_THREAD_CAPS, PLATOON_ASSUME_GPUS="0"))
    assert job.wait(60) == 0, job.output
    threads = max(1, (os.cpu_count() or 1) // 4)  # 2 nodes x 2 workers on this host
    line = ("DEVICE cuda0 CUDA_VISIBLE_DEVICES='0' OMP_NUM_THREADS=%d "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID XLA_PYTHON_CLIENT_MEM_FRACTION=0.375" % threads)
    assert job.count(line) == 4, job.output


@pytest.fixture(scope="module")
def one_worker_per_node():
    """The output of envcheck_worker.py under two nodes of one worker each on this host, with
    no thread count set by the user and torchrun's WORLD_SIZE and MASTER_PORT set (the
    launcher's thread caps and the rank variables stripped are apart): run once, in the first
    test that asks (its `no_leaks` sweeps what MPICH leaves), for the two tests that read it
    (an mpiexec job fewer)."""
    job = MpiJob("-", "--workers", "1", "--", ENVCHECK, env_extra=dict(
        NO_THREAD_CAPS, PLATOON_ASSUME_GPUS="-1", WORLD_SIZE="2", MASTER_PORT="1"))
    try:
        assert job.wait(60) == 0, job.output
    finally:
        job.kill()
    return job.output


@pytest.mark.parametrize("user", [None, "1"], ids=["caps", "the user's OMP_NUM_THREADS"])
def test_nodes_sharing_a_host_divide_its_cores_and_keep_a_thread_count_the_user_set(
        mpi_job, request, user):
    """Two nodes of one worker each on this host: each worker's BLAS/OpenMP threads are the
    cores divided among both (each was given all of them: 2 x the cores). A thread count the
    user set is theirs: no variable is set over it (it was overridden)."""
    if user is None:
        output = request.getfixturevalue("one_worker_per_node")
    else:
        job = mpi_job("-", "--workers", "1", "--", ENVCHECK, env_extra=dict(
            NO_THREAD_CAPS, OMP_NUM_THREADS=user, PLATOON_ASSUME_GPUS="-1"))
        assert job.wait(60) == 0, job.output
        output = job.output
    assert output.count("2 nodes share this host") == 2, output
    if user is None:
        threads = str(max(1, (os.cpu_count() or 1) // 2))
        want = {var: threads for var in THREAD_VARIABLES}
    else:
        want = dict({var: "None" for var in THREAD_VARIABLES}, OMP_NUM_THREADS=user)
    found = [dict(pair.split("=") for pair in line.split("THREADS ", 1)[1].split())
             for line in output.splitlines() if "] THREADS " in line]
    assert found == [want, want], output


def test_workers_under_platoon_mpi_do_not_see_mpis_rank_variables(one_worker_per_node):
    """Each rank (a node's controller) is an MPI process and keeps PMI_* (its NodeLink works:
    the job runs); the workers it starts are not MPI ranks and do not see them, nor torchrun's
    (WORLD_SIZE, MASTER_PORT set), so a framework in a worker (Hugging Face's Trainer) starts
    no DDP of its own."""
    output = one_worker_per_node
    assert output.count("DISTRIBUTED none") == 2, output


def test_a_launcher_style_controller_script_runs_as_each_node(mpi_job):
    """The linear example, unchanged, as a 2-node job: its controller script is each rank.
    --controller-args takes a value that looks like an option (no space in it)."""
    example = os.path.join(os.path.dirname(os.path.dirname(PROCS)), "examples", "linear")
    job = mpi_job("-", "--controller", os.path.join(example, "linear_controller.py"),
                  "--controller-args", "--steps=400", "--tie-every-s", "0.05",
                  "--", os.path.join(example, "linear_worker.py"))
    assert job.wait(60) == 0, job.output
    trained = [int(n) for n in re.findall(r"trained (\d+) minibatches", job.output)]
    assert len(trained) == 2 and all(400 <= n < 500 for n in trained), job.output  # not 4000
    assert job.count("distance to the true weights") == 4, job.output
    distances = re.findall(r"distance of the centre to the true weights: (\d+\.\d+)", job.output)
    assert len(distances) == 2 and len(set(distances)) == 1, job.output  # one centre: final tie


CHATTY = re.compile(r"\[node-(\d)/worker(\d)\] CHATTY node \1 worker \2 line \d+ x{200}")


def test_each_workers_lines_arrive_whole_and_attributed(mpi_job):
    """Before: a node's workers shared its stdout, unbuffered, and print() writes the text and
    its newline apart, so two workers printing at once cut into each other's lines. Now each
    line arrives whole, led by its node and worker, as the launcher shows one host's."""
    job = mpi_job("chatty")
    assert job.wait(60) == 0, job.output
    lines = [line for line in job.output.splitlines() if "CHATTY" in line]
    cut = [line for line in lines if not CHATTY.fullmatch(line)]
    assert len(lines) == 4 * 200 and not cut, (len(lines), cut[:3])


def _launch_hosts(tmp_path, experiment, *args):
    out = subprocess.run([sys.executable, "-m", "platoon.launch.cli", experiment, "--hosts",
                          "localhost", "localhost", "--log-dir", str(tmp_path / "logs")]
                         + list(args), capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path), env={k: v for k, v in os.environ.items()
                              if not k.startswith("PLATOON_")})
    return out.returncode, out.stdout + out.stderr, (tmp_path / "logs" / "mpiexec.log")


@pytest.fixture(scope="module")
def linear_over_hosts(tmp_path_factory):
    """linear_over_hosts(): the linear example under `platoon-launcher --hosts localhost
    localhost`, its centres tied over int8 by DiLoCo's outer step: (exit code, output,
    mpiexec.log's text). Run once, in the first test that asks (so that its `no_leaks` sweeps
    what MPICH leaves), for the two tests that read it (a launcher job of 2 nodes fewer)."""
    done = []

    def run():
        if not done:
            code, out, log = _launch_hosts(tmp_path_factory.mktemp("linear_over_hosts"),
                                           os.path.join(ROOT, "examples", "linear", "linear"),
                                           "-n", "2", "-c", "--steps 1000", "--tie-every-s",
                                           "0.05", "--tie-compress", "int8", "--tie-outer",
                                           "diloco", "--tie-outer-lr", "0.5")
            done.append((code, out, log.read_text() if log.exists() else "(no %s)" % log))
        return done[0]

    return run


def test_launcher_hosts_runs_one_controller_per_host(linear_over_hosts):
    code, out, log = linear_over_hosts()
    assert code == 0, out + log
    assert "job finished on 2 node(s)" in out
    assert log.count("trained ") == 2  # each node's controller reports


def test_launcher_hosts_shows_each_workers_lines_whole_attributed_once(tmp_path):
    code, out, log = _launch_hosts(tmp_path, os.path.join(PROCS, "mpi"), "-n", "2", "--",
                                   "chatty", "50")
    assert code == 0, out + log.read_text()
    shown = out[:out.index("job finished")]  # (then the log's last lines, as they are)
    lines = [line for line in shown.splitlines() if "CHATTY" in line]
    cut = [line for line in lines if not CHATTY.fullmatch(line)]  # ([mpiexec] not added)
    assert len(lines) == 4 * 50 and not cut, (len(lines), cut[:3])


def test_launcher_hosts_shows_the_agreed_centres_final_result_and_saves_that_centre(tmp_path):
    from platoon import load_centre
    code, out, log = _launch_hosts(tmp_path, os.path.join(PROCS, "mpi"), "-n", "2",
                                   "--tie-every-s", "0.05", "--", "final")
    assert code == 0, out + log.read_text()
    (evaluated,) = set(re.findall(r"EVALUATED (\S+) node 0", log.read_text()))
    assert log.read_text().count("EVALUATED") == 1, log.read_text()
    summary = out[out.index("job summary"):]
    assert ("final result (the agreed centre, after the final tie round, evaluated once by "
            "node 0's worker") in summary, out
    assert "centre saved to %s by node 0 (the agreed centre" % (tmp_path / "logs" / "centre.npz") \
        in summary, out
    (centre,) = load_centre(str(tmp_path / "logs")).values()
    assert float(evaluated) == float(centre[0])


def test_launcher_hosts_fails_cleanly_when_a_worker_fails(tmp_path):
    before = platoon_segments()
    code, out, log = _launch_hosts(tmp_path, os.path.join(EXPERIMENTS, "crash"), "-n", "2")
    assert code != 0, out
    assert "mpiexec failed" in out and "deliberate crash in worker 1" in out
    job_id = re.search(r"job ([0-9a-f]+)-n\d", log.read_text()).group(1)
    # The ranks' reapers unlink what the aborted job left, as they notice: wait for them.
    wait_until(lambda: not [s for s in platoon_segments() - before if job_id in s], 10,
               "job %s's shared memory to go" % job_id)


def test_compressed_mean_gives_every_rank_the_same_bits_and_counts_its_bytes():
    """Every codec, float32 and float64, with error feedback, a subset of the ranks, and a NaN
    or Inf on one rank, whatever the codec (every rank raises naming that rank, none hangs):
    checked against each other by the ranks."""
    out = two_ranks("compressed_mean_ranks.py")
    assert len(re.findall(r"OK rank \d checks 509", out.stdout)) == 2, out.stdout + out.stderr


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """regression(compress, *options): `_regression_job`'s result, the job run once in this
    file for every test that reads it (an mpiexec job of 2 nodes x 2 workers fewer each)."""
    jobs, results = [], {}

    def start(scenario, *options, **kwargs):
        jobs.append(MpiJob(scenario, *options, **kwargs))
        return jobs[-1]

    def run(compress, *options):
        key = (compress,) + options
        if key not in results:
            try:
                results[key] = _regression_job(start, tmp_path_factory.mktemp("regression")
                                               / "job", *key)
            finally:
                for job in jobs:  # done, or failed: nothing of it outlives the test
                    job.kill()
                jobs.clear()
        return results[key]

    return run


def _regression_job(mpi_job, out_dir, compress, *options):
    """The linear regression (256 float32 weights) on 2 nodes x 2 workers, the centres tied
    every 0.02 s with `compress` (and the tie `options`), training on until each node's tie
    has run 4 rounds (a loaded machine once ran only the first and the final one): returns
    (the final centre's distance to the true weights, [(tie rounds, tie bytes) of node 0, of
    node 1], the job's output) once both nodes hold the same centre."""
    os.makedirs(str(out_dir))
    job = mpi_job("-", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(out_dir), "--tie-every-s", "0.02",
                  "--tie-compress", compress, *options,
                  "--", os.path.join(PROCS, "tie_regression_worker.py"), "150", "rounds=4")
    assert job.wait(90) == 0, job.output
    assert job.count("DIST ") == 4, job.output
    counts = sorted(re.findall(r"CENTRE node (\d) rounds (\d+) bytes (\d+)", job.output))
    assert len(counts) == 2, job.output
    returned = _node_centres(out_dir, "centre")
    assert returned[0][0].tobytes() == returned[1][0].tobytes(), job.output
    (weights,) = returned[0]
    distance = float(np.linalg.norm(weights - np.arange(256, dtype=np.float32) / 256))
    return distance, [(int(rounds), int(sent)) for _, rounds, sent in counts], job.output


def _split_bytes(sent, rounds, message):
    """(lossless bytes, outer rounds with this node's message) in a node's `sent` bytes over
    `rounds` outer rounds of `message` bytes each: the first anchor sends nothing when the
    centres are already equal, else the centre losslessly (1024 bytes)."""
    for lossless in (0, 1024):
        coded, rest = divmod(sent - lossless, message)
        if rest == 0 and 0 < coded <= rounds:
            return lossless, coded
    raise AssertionError("%d bytes in %d rounds of %d bytes and a first anchor"
                         % (sent, rounds, message))


def test_an_int8_tie_trains_to_the_true_weights_with_4x_fewer_bytes(regression):
    """Each outer round a node sends its centre's move from the shared anchor: 1024 bytes in
    float32, 256 + one 4-byte scale in int8; the first anchor sends nothing when every node's
    centre is already equal (their sha256s are in the round's headers), else the centre
    losslessly (1024 bytes); the final agreement sends nothing (every centre becomes the
    anchor). Counted exactly, in the controller's progress totals (`tie_bytes_sent`)."""
    plain, plain_counts, _ = regression("float32")
    packed, packed_counts, _ = regression("int8")
    start = float(np.linalg.norm(np.random.default_rng(0).normal(size=256)
                                 - np.arange(256) / 256))
    print("distance to the true weights: start %.3f, float32 tie %.5f, int8 tie %.5f; "
          "(rounds, bytes) float32 %s int8 %s" % (start, plain, packed, plain_counts,
                                                  packed_counts))
    assert plain < 0.05 and packed < 0.05, (start, plain, packed)
    # Every node's bytes are exactly its first anchor (0 or 1024) and one message per round it
    # sent its move in (1024 or 260: 3.9x fewer). (Not the jobs' bytes per round: a node whose
    # workers were done sends nothing in a round, and how many such rounds come depends on the
    # machine's load: one run's float32 node sent its move in 14 of its 46 rounds.)
    for counts, message in [(plain_counts, 1024), (packed_counts, 260)]:
        for rounds, sent in counts:
            _split_bytes(sent, rounds, message)


def test_diloco_outer_rounds_follow_the_formula_on_every_rank():
    """The outer step (a lossless first round to the mean, then u = mu*u + d; anchor +=
    lr*(d + mu*u) on the mean move d) by hand on 2 ranks: float32 within rounding of the
    formula over 20 rounds, int8 with error feedback within its error after 200 rounds (it
    does not grow), the centres the same bits on both ranks."""
    out = two_ranks("outer_round.py")
    assert len(re.findall(r"OK rank \d outer rounds 220", out.stdout)) == 2, out.stdout + out.stderr


def test_the_first_anchor_sends_no_centre_when_the_centres_are_already_equal():
    """The first round by hand on 2 ranks (a float32 and a float64 array, 1360 bytes): centres
    from one seed send nothing (their sha256s travel in the round's headers) and stay as they
    were; centres of their own still get their exact mean, losslessly (1360 bytes); equal
    centres holding a NaN are still refused on both ranks. (Every first round sent 1360
    bytes.)"""
    out = two_ranks("first_round_bytes.py")
    found = re.findall(r"OK rank (\d) (\w+) sent (\d+) lossless (\d+)", out.stdout)
    assert len(found) == 6, out.stdout + out.stderr
    for rank, case, sent, lossless in found:
        expected = {"equal": (0, 0), "unequal": (1360, 1360), "nan": (0, 0)}
        assert (int(sent), int(lossless)) == expected[case], (rank, case, out.stdout)


def test_a_fixed_world_heals_a_member_whose_anchor_differs():
    """Rounds by hand on 2 ranks (DiLoCo over int8): rank 1's anchor is made to differ after two
    outer rounds; the next round heals it from rank 0 (its anchor and momentum, 2720 bytes,
    losslessly, to the one member that differs), rank 1 keeps its workers' work (its move in
    the outer round the heal's round makes), and the job goes on to outer rounds and one final
    centre. (A fixed world had no header: the anchors
    stayed apart, each node stepping its own.)"""
    out = two_ranks("fixed_world_heal.py")
    found = sorted(re.findall(r"OK rank (\d) healed, sent (\d+)", out.stdout))
    assert found == [("0", "2720"), ("1", "0")], out.stdout + out.stderr


def test_a_diloco_outer_step_over_int8_trains_to_the_true_weights(regression):
    """DiLoCo's outer step across the node centres (outer lr 0.7, Nesterov 0.9), the
    pseudo-gradients sent as int8: the job ends with one centre at the true weights. Bytes: the
    first anchor nothing when the centres are already equal (else 1024), each outer round with
    this node's move 260."""
    distance, counts, _ = regression("int8", "--tie-outer", "diloco")
    print("distance %.5f, (rounds, bytes) %s" % (distance, counts))
    assert distance < 0.05, (distance, counts)
    assert all(rounds > 3 for rounds, _ in counts), counts
    for rounds, sent in counts:
        _split_bytes(sent, rounds, 260)


@pytest.mark.parametrize("outer", ["easgd", "diloco"])
def test_a_node_dying_mid_round_ends_the_job_with_its_last_good_centre_saved(mpi_job,
                                                                             tmp_path, outer):
    """Rounds back to back (int8) with periodic checkpoints on both nodes; node 1's controller
    is SIGKILLed, in the middle of a round or between two. The job ends everywhere within
    seconds, no process or segment is left, and node 0's last checkpoint is a whole, finite
    centre (written atomically: never torn by the death)."""
    job = mpi_job("-", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(tmp_path), "--tie-every-s", "0.005",
                  "--tie-compress", "int8", "--tie-outer", outer,
                  "--", os.path.join(PROCS, "tie_regression_worker.py"), "1000000",
                  env_extra={"PLATOON_CHECKPOINT_EVERY_S": "0.1"})
    saved = [tmp_path / ("final-node%d.npz" % node) for node in range(2)]
    wait_until(lambda: all(p.exists() for p in saved) or job.popen.poll() is not None, 60,
               "a periodic checkpoint")
    assert job.popen.poll() is None, job.output
    job_id = job.job_id()
    os.kill(int(re.search(r"node 1 of 2, controller pid (\d+)", job.output).group(1)),
            signal.SIGKILL)
    start = time.monotonic()
    assert job.wait(30) != 0, job.output
    assert time.monotonic() - start < 15, job.output
    wait_until(lambda: not [s for s in platoon_segments() if job_id in s], 10,
               "job %s's shared memory to go" % job_id)
    from platoon._centre.checkpoint import load_centre
    (weights,) = load_centre(str(saved[0])).values()
    assert weights.shape == (256,) and np.isfinite(weights).all(), weights


def test_launcher_hosts_passes_tie_compress_to_every_node(linear_over_hosts, capsys):
    from platoon.launch import cli as launcher
    with pytest.raises(SystemExit) as exc:
        launcher.parse_args(["x", "--tie-compress", "int8"])
    assert exc.value.code == 2 and "--tie-compress needs --hosts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launcher.parse_args(["x", "--hosts", "h1", "--tie-compress", "int2"])
    assert "invalid choice: 'int2'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launcher.parse_args(["x", "--hosts", "h1", "--tie-outer-lr", "0.5"])
    assert "go with --tie-outer diloco" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launcher.parse_args(["x", "--hosts", "h1", "--tie-outer", "diloco",
                             "--tie-outer-momentum", "1"])
    assert "--tie-outer-momentum must be in [0, 1)" in capsys.readouterr().err
    code, out, log = linear_over_hosts()
    assert code == 0, out + log
    assert "DiLoCo lr 0.5, momentum 0.9" in log, log
    sent = re.findall(r"node \d: the centre tie sent \d+ bytes from this node: \d+ outer "
                      r"round\(s\), \d+ with its move in int8[^\n]*", log)
    assert len(sent) == 2, log
    assert all(line in out for line in sent), out  # the launcher shows what crossed the link


TIE_SENT = re.compile(r"platoon.mpi: node (\d): the centre tie sent (\d+) bytes from this node: "
                      r"(\d+) outer round\(s\), (\d+) with its move in (\w+), (\d+) bytes "
                      r"\((\d+) a round\), and (\d+) lossless \(([^)]*)\), (\d+) bytes; "
                      r"(DiLoCo|EASGD)")


@pytest.mark.parametrize("outer", ["easgd", "diloco"])
def test_a_job_run_by_hand_says_what_crossed_the_link_rounds_in_the_codec_and_lossless_apart(
        regression, outer):
    """int8 rounds (256 float32: 260 bytes each, in each outer round with this node's move) and
    the lossless ones (whole centres, 1024 bytes: the first anchor, only if the centres differ)
    are counted apart, each node printing them on the terminal (they were averaged together,
    and said only in the log at INFO). The int8 regression jobs run by hand (`python -m
    platoon.mpi`) of the two tests above, each node's tie having run 4 rounds or more, so that
    int8 rounds happen under load too."""
    options = ("--tie-outer", "diloco") if outer == "diloco" else ()
    *_, output = regression("int8", *options)
    found = TIE_SENT.findall(output)
    assert sorted(f[0] for f in found) == ["0", "1"], output
    for (_, total, rounds, coded, codec, coded_bytes, per_coded, lossless, _which,
         lossless_bytes, rule) in found:
        assert codec == "int8" and int(coded_bytes) == 260 * int(coded) and int(coded) > 0
        assert int(coded) <= int(rounds) and int(lossless) == 1, found
        assert int(total) == int(coded_bytes) + int(lossless_bytes), found
        assert int(per_coded) == 260 and int(lossless_bytes) in (0, 1024), found
        assert rule == {"easgd": "EASGD", "diloco": "DiLoCo"}[outer], found


def test_compressed_mean_counts_the_bytes_that_cross_the_network(two_hosts):
    """Two hosts (network namespaces, MPI over TCP on a veth pair): the bytes compressed_mean
    counts are those the device sends, but for TCP/IP's headers and MPI's small messages."""
    out = subprocess.run(two_hosts + [sys.executable,
                                      os.path.join(PROCS, "compressed_mean_wire.py"),
                                      NETNS_DEVICE],
                         capture_output=True, text=True, timeout=90,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **TCP_ENV))
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.findall(r"WIRE rank (\d) (\w+) counted (\d+) wire (\d+)", out.stdout)
    assert len(found) == 6, out.stdout + out.stderr
    wire = {}
    for rank, name, counted, sent in found:
        print("rank %s %s: counted %s bytes, the device sent %s" % (rank, name, counted, sent))
        assert int(counted) <= int(sent) <= 1.03 * int(counted), (rank, name, counted, sent)
        wire[rank, name] = int(sent)
    for rank in "01":
        assert wire[rank, "float32"] / wire[rank, "int8"] > 3.8, wire
        assert wire[rank, "float32"] / wire[rank, "int4"] > 7.4, wire


def test_a_compressed_tie_keeps_the_handover_and_ends_with_one_identical_centre(mpi_job,
                                                                                tmp_path):
    """int4 between nodes that finish at different times (node 0 hands its centre over while
    node 1 trains on; a float32 and a float64 array): the final agreement (each centre becomes
    the anchor) still leaves both nodes and their checkpoints with the same centre, bit for
    bit."""
    job = mpi_job("uneven", "--controller", os.path.join(PROCS, "centre_controller.py"),
                  "--controller-args", str(tmp_path), "--tie-every-s", "0.05",
                  "--tie-compress", "int4")
    assert job.wait(60) == 0, job.output
    assert job.count("LEFT after") == 4, job.output
    counts = re.findall(r"CENTRE node \d rounds (\d+) bytes (\d+)", job.output)
    assert len(counts) == 2 and all(int(b) > 0 for _, b in counts), job.output
    returned, final = _node_centres(tmp_path, "centre"), _node_centres(tmp_path, "final")
    for node in range(2):
        assert [a.dtype for a in returned[node]] == [np.dtype(np.float32), np.dtype(np.float64)]
        for got, saved in zip(returned[node], final[node]):
            assert got.tobytes() == saved.tobytes(), "node %d checkpointed another centre" % node
    for a, b in zip(*returned):
        assert a.tobytes() == b.tobytes(), job.output


def test_a_job_ended_by_sigterm_ends_its_centre_tie_before_the_centre_goes(mpi_job):
    """mpiexec terminated while the tie runs rounds back to back: each controller ends its
    tie thread before it releases the centre (a round starting after it logged "the centre
    tie failed" with an AttributeError and aborted the job)."""
    job = mpi_job("-", "--tie-every-s", "0.001",
                  "--", os.path.join(PROCS, "tie_regression_worker.py"), "1000000",
                  env_extra={"PLATOON_LOG_LEVEL": "DEBUG"})
    job.wait_for_count("centre tie round 20,", 2)
    job_id = job.job_id()
    job.popen.terminate()
    assert job.wait(20) != 0, job.output
    assert "the centre tie failed" not in job.output, job.output
    assert "AttributeError" not in job.output, job.output
    wait_until(lambda: not [s for s in platoon_segments() if job_id in s], 10,
               "job %s's shared memory to go" % job_id)


@pytest.mark.parametrize("option, values, named", [
    ("--tie-compress", ("int8", "float32"), "compress: node 0 'int8', node 1 'float32'"),
    ("--tie-outer", ("easgd", "diloco"), "outer: node 0 'easgd', node 1 'diloco'"),
    ("--tie-every-s", ("1", None), "a centre tie on node(s) 0 but none on node(s) 1"),
])
def test_nodes_with_different_tie_settings_are_refused_naming_the_mismatch(mpi_job, option,
                                                                           values, named):
    """One mpiexec line per node (MPMD) with different tie settings: every node fails at
    start, naming the setting and which node has which (the nodes paired messages of
    different sizes and meanings, and the job exited 0 with garbage centres)."""
    def node(value):
        tie = [] if value is None else ["--tie-every-s", "1"] + (
            [] if option == "--tie-every-s" else [option, value])
        return tie + ["--", WORKER, "tie"]
    rank1 = ["-n", "1", sys.executable, "-m", "platoon.mpi", "--workers", "2"]
    job = mpi_job("-", *node(values[0]), ":", *rank1, *node(values[1]),
                  mpiexec=(MPIEXEC, "-n", "1"))
    assert job.wait(30) != 0, job.output
    assert "the nodes' centre tie settings differ" in job.output, job.output
    assert named in job.output, job.output
    assert "TIED" not in job.output, job.output


@pytest.mark.parametrize("options", [
    ["--tie-every-s", "0.01"],
    ["--tie-every-s", "0.01", "--tie-outer", "diloco"],
    ["--tie-every-s", "1000"],  # no round before the final one (always lossless)
], ids=["float32-easgd-rounds", "float32-diloco-rounds", "final-round"])
def test_a_nan_in_one_nodes_centre_is_refused_naming_the_node_whatever_the_codec(mpi_job,
                                                                                 options):
    """Node 1's centre holds a NaN (a worker diverged). A float32 round (workers training
    on: only a round can end the job) or the lossless final round refuses it and the job is
    aborted naming node 1; it used to be averaged into every node's centre, exit code 0."""
    syncs = "40" if "1000" in options else "1000000"
    job = mpi_job("-", *options, "--",
                  os.path.join(PROCS, "tie_regression_worker.py"), syncs, "nan")
    assert job.wait(30) != 0, job.output
    assert "DIVERGED node 1" in job.output, job.output
    assert "node(s) 1's centre holds NaN or Inf" in job.output, job.output
