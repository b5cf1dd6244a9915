"""platoon-launcher with real controller and worker processes: success, failure, signals."""

import fcntl
import io
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time

import pytest

from platoon import load_centre
from platoon._os.environment import THREAD_VARIABLES, XLA_MEMORY_VARIABLES, device_variables
from platoon._os.process import signal_name
from platoon._os.statusfile import write_status
from platoon.device import Device
from platoon.errors import ControllerGone
from platoon.launch import child, output
from platoon.launch import cli as launcher
from platoon.launch.output import LogFollower, columns, fit, visible
from platoon.launch.supervision import StatusLine

from helpers import (
    EXPERIMENTS,
    ROOT,
    assert_job_gone,
    job_id_of,
    job_processes,
    launcher_cmd,
    run_launcher,
    wait_until,
)


def label_of(pid):
    """The label platoon.launch.child runs a process under (controller, worker0, ...), or None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    return args[3].decode() if args[1:3] == [b"-m", b"platoon.launch.child"] else None


class Launched:
    """A launcher running in the background, for signal tests."""

    def __init__(self, args, tmp_path):
        self.log = open(tmp_path / "launcher.out", "w+")
        self.popen = subprocess.Popen(args + ["--log-dir", str(tmp_path / "logs")],
                                      stdout=self.log, stderr=subprocess.STDOUT,
                                      cwd=str(tmp_path), start_new_session=True)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def job_id(self):
        wait_until(lambda: re.search(r"job [0-9a-f]{16}", self.output()), 20, "the job id")
        return job_id_of(self.output())

    def close(self):
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)
        self.log.close()


@pytest.fixture
def launched(tmp_path):
    started = []

    def start(*args):
        launch = Launched(launcher_cmd(*args), tmp_path)
        started.append(launch)
        return launch

    yield start
    for launch in started:
        job = re.search(r"job ([0-9a-f]{16})", launch.output())
        launch.close()
        if job:  # nothing of the job may survive a failed test either
            for pid in job_processes(job.group(1)):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_digits_example_trains_through_the_console_script(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "platoon-launcher")
    code, out = run_launcher([script, os.path.join(ROOT, "examples", "digits", "digits"),
                              "-n", "2", "-c", "--max-minibatches 500"], tmp_path,
                             env={"CUDA_VISIBLE_DEVICES": ""})
    assert code == 0, out
    assert "no CUDA GPU visible: starting 2 CPU worker(s)" in out
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", out).group(1))
    assert accuracy > 80.0, out  # a short run; the full one reaches 95%+
    baseline = float(re.search(r"single process: .*test accuracy ([\d.]+)%", out).group(1))
    assert baseline > 80.0, out  # the same cap applies to the single-process baseline
    assert re.search(r"^time to \d+% validation accuracy: 2 workers ([\d.]+ s|not reached), "
                     r"single process ([\d.]+ s|not reached)", out, re.M), out
    png = tmp_path / "logs" / "digits_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    for name in ("controller.log", "worker0.log", "worker1.log", "status.json"):
        assert (tmp_path / "logs" / name).exists()
    assert not job_processes(job_id_of(out))


def test_devices_environment_and_thread_caps(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"),
                                          "-D", "cuda3", "cpu"), tmp_path,
                             env={"PLATOON_ASSUME_GPUS": "3"})  # no GPU needed: pretend
    assert code == 0, out
    assert "no envcheck_controller.py: using the default Controller" in out
    logs = tmp_path / "logs"
    threads = max(1, (os.cpu_count() or 1) // 2)  # the cores split among both workers
    assert ("DEVICE cuda3 CUDA_VISIBLE_DEVICES='3' OMP_NUM_THREADS=%d "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID" % threads in (logs / "worker0.log").read_text())
    assert ("DEVICE cpu CUDA_VISIBLE_DEVICES='' OMP_NUM_THREADS=%d" % threads
            in (logs / "worker1.log").read_text())
    assert '"minibatches": 10' in (logs / "status.json").read_text()


def test_a_worker_does_not_see_the_variables_that_make_a_process_an_mpi_or_torchrun_rank(
        tmp_path):
    """A launcher started inside an MPI or torchrun job: its workers do not see PMI_*, OMPI_*,
    RANK, WORLD_SIZE, MASTER_ADDR..., by which a framework (Hugging Face's Trainer) would start
    its own DDP across them."""
    rank = {"PMI_RANK": "1", "PMI_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_SIZE":
            "2", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "HYDRA_CONTROL_FD": "9", "MPI_LOCALNRANKS": "2"}
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-D", "cpu"),
                             tmp_path, env=rank)
    assert code == 0, out
    assert "DISTRIBUTED none" in (tmp_path / "logs" / "worker0.log").read_text()


def test_an_explicit_n_places_workers_in_turn_on_the_visible_gpus(tmp_path, monkeypatch):
    for var in XLA_MEMORY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "3"),
                             tmp_path, env={"PLATOON_ASSUME_GPUS": "0"})  # pretend: one GPU
    assert code == 0, out
    assert ("planned 3 worker(s), -n 3 on 1 visible GPU(s): worker0 on cuda0, worker1 on "
            "cuda0, worker2 on cuda0" in out), out
    threads = max(1, (os.cpu_count() or 1) // 3)
    for i in range(3):
        assert ("DEVICE cuda0 CUDA_VISIBLE_DEVICES='0' OMP_NUM_THREADS=%d "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID XLA_PYTHON_CLIENT_MEM_FRACTION=0.25" % threads
                in (tmp_path / "logs" / ("worker%d.log" % i)).read_text())


def plan(argv, said=None):
    return launcher.plan_devices(launcher.parse_args(["train.py"] + argv),
                                 (said if said is not None else []).append)


def test_the_suite_plans_as_on_a_machine_without_gpus():
    assert launcher.find_gpus() == ([], ["PLATOON_ASSUME_GPUS='-1'"])  # conftest's setting
    said = []
    assert plan(["-n", "2"], said) == ["cpu", "cpu"]
    assert said == ["no CUDA GPU visible: starting 2 CPU worker(s) (-n to change, -D to "
                    "choose devices)"]


def test_device_plans_with_gpus(monkeypatch):
    monkeypatch.setenv("PLATOON_ASSUME_GPUS", "0,1")
    said = []
    assert plan([], said) == ["cuda0", "cuda1"]  # without -n: one worker per GPU
    assert said == ["planned 2 worker(s), one per visible GPU; -n N to start N: worker0 on "
                    "cuda0, worker1 on cuda1"]
    assert plan(["-n", "3"]) == ["cuda0", "cuda1", "cuda0"]
    assert plan(["-n", "1"]) == ["cuda0"]
    assert plan(["-D", "cuda1", "cuda1", "-n", "2"]) == ["cuda1", "cuda1"]
    with pytest.raises(launcher.UsageError, match=r"-n 3 and -D cuda1 cpu disagree"):
        plan(["-D", "cuda1", "cpu", "-n", "3"])
    monkeypatch.setenv("PLATOON_ASSUME_GPUS", "1,-1,0")  # as CUDA reads it: GPU 1 only
    assert plan([]) == ["cuda1"]


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH listing two GPUs with their UUIDs (the launcher's
    search, without a GPU); PLATOON_ASSUME_GPUS removed so that the launcher uses it."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, GPU-0a1b2c3d-0000-0000-0000-000000000000'\n"
                   "echo '1, GPU-9f8e7d6c-0000-0000-0000-000000000000'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (smi.parent, os.environ["PATH"]))
    monkeypatch.delenv("PLATOON_ASSUME_GPUS")


def test_cuda_visible_devices_by_uuid_index_or_mig(nvidia_smi, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9f8e7d6c")  # a UUID prefix, as CUDA takes
    assert launcher.find_gpus()[0] == ["1"]
    assert plan(["-D", "cuda1"]) == ["cuda1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0,7,0")  # 7 is no GPU: CUDA stops there
    assert launcher.find_gpus()[0] == ["1", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "NoDevFiles")  # what some schedulers set
    assert plan(["-n", "2"]) == ["cpu", "cpu"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-77")
    with pytest.raises(launcher.UsageError, match=r"names GPU GPU-77, which is not among the "
                       r"GPUs nvidia-smi lists here"):
        plan([])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4b1c2a3e-0000-0000-0000-000000000000")
    with pytest.raises(launcher.UsageError, match=r"names a MIG instance .*whole GPUs"):
        plan(["-n", "2"])
    assert plan(["-D", "cpu", "cpu"]) == ["cpu", "cpu"]  # no GPU wanted: not looked at


def test_the_environment_of_each_worker():
    devices = ["cuda0", "cuda0", "cuda1", "cpu"]
    env = device_variables("cuda0", devices, 16, {})
    assert env == dict({var: "4" for var in THREAD_VARIABLES}, CUDA_VISIBLE_DEVICES="0",
                       CUDA_DEVICE_ORDER="PCI_BUS_ID", XLA_PYTHON_CLIENT_MEM_FRACTION="0.375")
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in device_variables("cuda1", devices, 16, {})
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in device_variables(
        "cuda0", devices, 16, {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})  # the user decided
    cpu = device_variables("cpu", devices, 2, {})
    assert (cpu["CUDA_VISIBLE_DEVICES"], cpu["OMP_NUM_THREADS"]) == ("", "1")


def test_thread_caps_divide_the_hosts_cores_and_leave_a_users_own_count():
    """Two nodes of one worker on a 16-core host: 8 threads each (not 16); a thread count the
    user set (any of THREAD_VARIABLES) is left alone, and no other is set over it (OpenBLAS
    and MKL read OMP_NUM_THREADS too)."""
    assert device_variables("cpu", ["cpu"], 16, {}, host_workers=2)["OMP_NUM_THREADS"] == "8"
    env = device_variables("cpu", ["cpu", "cpu"], 16, {"OMP_NUM_THREADS": "1"})
    assert not set(env) & set(THREAD_VARIABLES), env


def test_a_worker_names_its_gpu_as_cuda_does(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert Device("cuda1").local == "cuda:1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,1")  # CUDA ignores -1 and what follows
    with pytest.raises(ValueError, match="hidden from this process"):
        Device("cuda1").local
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0a1b2c3d")
    with pytest.raises(ValueError, match=r"names GPUs by UUID \(GPU-0a1b2c3d\).*nvidia-smi -L"):
        Device("cuda0").local


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """The crash experiment under the launcher, -n 2 (worker 1 raises): (exit code, output,
    its working directory). Run once for the three tests that read it (two launcher jobs
    fewer)."""
    tmp_path = tmp_path_factory.mktemp("crashed")
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "crash"), "-n", "2"),
                             tmp_path)
    return code, out, tmp_path


def test_a_crashing_worker_stops_the_job(crashed):
    code, out, _ = crashed
    assert code == 1, out
    assert re.search(r"^platoon-launcher: worker1 failed \(exit code 1\)(, and then the "
                     r"controller failed \(exit code 1\))?; stopped the job", out, re.M), out
    assert "deliberate crash in worker 1" in out  # the tail of its log
    assert_job_gone(job_id_of(out))


def test_a_crashing_workers_traceback_starts_at_its_own_frames(crashed):
    """Streamed to the terminal, prefixed, and from the script's frame on: no frame of runpy
    or of the launcher's bootstrap above it."""
    code, out, _ = crashed
    assert code == 1, out
    shown = re.search(r"^\[worker1\] Traceback \(most recent call last\):\n"
                      r"\[worker1\]   File \"([^\"]+)\", line \d+, in <module>\n", out, re.M)
    assert shown and shown.group(1).endswith("crash_worker.py"), out
    assert "[worker1] RuntimeError: deliberate crash in worker 1" in out, out
    assert "runpy" not in out and "platoon/launch/child.py" not in out, out
    assert re.search(r"worker1 failed \(exit code 1\).*; stopped the job\. Its output is above "
                     r"\(prefixed \[worker1\]; log: \S+worker1\.log\)", out), out


def test_each_workers_output_is_shown_with_its_name_unless_quiet(tmp_path):
    """torchrun-style: every line a worker prints reaches the launcher's terminal prefixed with
    the worker, and its log too; --quiet leaves it in the logs only."""
    cmd = launcher_cmd(os.path.join(EXPERIMENTS, "argv"), "-n", "2", "-w", "--tag x")
    (tmp_path / "shown").mkdir()
    (tmp_path / "quiet").mkdir()
    code, out = run_launcher(cmd, tmp_path / "shown")
    assert code == 0, out
    for worker in (0, 1):
        assert "\n[worker%d] WORKER ARGV ['--tag', 'x']\n" % worker in out, out
        log = (tmp_path / "shown" / "logs" / ("worker%d.log" % worker)).read_text()
        assert "WORKER ARGV ['--tag', 'x']" in log, log
    assert out.index("[worker1] WORKER ARGV") < out.index("platoon-launcher: job summary"), out
    code, out = run_launcher(cmd + ["--quiet"], tmp_path / "quiet")
    assert code == 0, out
    assert "WORKER ARGV" not in out and "[worker" not in out, out
    assert "WORKER ARGV" in (tmp_path / "quiet" / "logs" / "worker0.log").read_text()


def test_the_launcher_ends_with_a_summary_of_the_job(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "progress"), "-n", "2"),
                             tmp_path, timeout=60)
    assert code == 0, out
    summary = out[out.index("platoon-launcher: job summary:"):]  # the last lines
    centre = tmp_path / "logs" / "centre.npz"
    assert re.match(r"platoon-launcher: job summary: wall time \d+\.\d s, 60 minibatches, "
                    r"0 syncs\nplatoon-launcher:   warning: the workers never synced \(0 "
                    r"syncs\), so they shared nothing", summary), out
    for worker in (0, 1):
        assert ("\nplatoon-launcher:   worker %d last reported: loss 0.5 (30 minibatches, "
                "0 syncs)\n" % worker) in summary, out
    assert summary.endswith("platoon-launcher:   centre saved to %s (load it with "
                            "platoon.load_centre)\n" % centre), out
    assert list(load_centre(str(centre))) == ["param_0"]


def test_a_failed_job_ends_with_a_summary_too(crashed):
    code, out, tmp_path = crashed
    assert code == 1, out
    summary = out[out.index("platoon-launcher: job summary:"):]
    assert "stopped the job" not in summary, out  # after the failure report
    assert "centre saved to %s" % (tmp_path / "logs" / "centre.npz") in summary, out


def sharing_forever(launched):
    """A launched job of two workers that train forever, once they share their parameters:
    (the launch, its job id)."""
    launch = launched(os.path.join(EXPERIMENTS, "forever"), "-n", "2")
    job_id = launch.job_id()
    # (the centre's segment comes first, its values once a worker's init_shared_params returns)
    wait_until(lambda: launch.output().count("SHARED") == 2, 20,
               "the workers to share their parameters")
    return launch, job_id


def test_interrupted_the_launcher_says_where_the_centre_was_saved(launched, tmp_path,
                                                                   monkeypatch):
    # the workers sync flat out: the signal often finds one in the centre's lock (where a
    # handler once left it held, and the final checkpoint waited for it past the stop)
    monkeypatch.setenv("FOREVER_PAUSE_S", "0")
    launch, job_id = sharing_forever(launched)
    launch.popen.send_signal(signal.SIGINT)
    assert launch.popen.wait(20) == 130, launch.output()
    centre = tmp_path / "logs" / "centre.npz"
    assert "platoon-launcher:   centre saved to %s" % centre in launch.output()
    assert load_centre(str(centre))["param_0"].shape == (1000,)
    assert_job_gone(job_id)


def test_a_controller_that_never_gets_ready(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "broken"), "-n", "1"),
                             tmp_path)
    assert code == 1, out
    assert "the controller did not become ready (exit code 1)" in out
    assert "deliberately broken controller script" in out


def test_usage_errors(tmp_path):
    code, out = run_launcher(launcher_cmd(str(tmp_path / "nothing")), tmp_path)
    assert code == 2 and "no worker script" in out
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-D", "tpu0"),
                             tmp_path)
    assert code == 2 and "unknown device 'tpu0'" in out
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                           "PLATOON_ASSUME_GPUS")}
    for device, hidden in (("cuda99", {}), ("cuda0", {"CUDA_VISIBLE_DEVICES": ""})):
        proc = subprocess.run(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-D", "cpu",
                                           device, "--log-dir", str(tmp_path / "gpu")),
                              capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                              env=dict(env, **hidden))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out  # refused at once, before anything started
        assert re.search(r"-D %s: no such GPU visible here \(GPUs found: .*\); looked at "
                         r"nvidia-smi .*CUDA_VISIBLE_DEVICES" % device, out), out
        assert "job " not in out and not (tmp_path / "gpu").exists(), out
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "controller.log").write_text("an earlier job")
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck")), tmp_path)
    assert code == 2 and "already holds a job's logs" in out
    code, out = run_launcher(launcher_cmd("--help"), tmp_path)
    assert code == 0 and "exit codes" in out and "130" in out


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_launcher_stops_everything(launched, signum, code):
    launch, job_id = sharing_forever(launched)
    launch.popen.send_signal(signum)
    assert launch.popen.wait(20) == code, launch.output()
    assert "received: stopping the job" in launch.output()
    assert_job_gone(job_id)


def test_a_killed_controller_leads_the_failure_report(launched):
    launch, job_id = sharing_forever(launched)
    (controller,) = [pid for pid in job_processes(job_id) if label_of(pid) == "controller"]
    os.kill(controller, signal.SIGKILL)
    assert launch.popen.wait(20) == 1, launch.output()
    out = launch.output()
    assert re.search(r"^platoon-launcher: the controller failed \(killed by SIGKILL\)"
                     r"(; after it worker\d \(exit code 1\)(, worker\d \(exit code 1\))? "
                     r"failed)?; stopped the job\. Last lines of \S+controller\.log",
                     out, re.M), out
    assert not re.search(r"^platoon-launcher: worker\d failed", out, re.M), out
    assert_job_gone(job_id)


def test_workers_die_with_a_killed_launcher(launched):
    launch, job_id = sharing_forever(launched)
    os.kill(launch.popen.pid, signal.SIGKILL)
    launch.popen.wait(10)
    assert_job_gone(job_id)  # PDEATHSIG: each child gets SIGTERM and cleans up


def test_restart_replaces_a_crashed_worker_and_the_job_completes(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "crash"), "-n", "2",
                                          "--restart", "1"), tmp_path)
    assert code == 0, out
    assert re.search(r"worker1 failed \(exit code 1\); starting a replacement", out), out
    assert "job finished: 2 worker(s) done, 1 failed" in out
    assert list((tmp_path / "logs").glob("worker*.restart1.log"))
    assert_job_gone(job_id_of(out))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one", "after-close"])
def test_a_worker_exiting_non_zero_is_replaced_under_its_own_id(tmp_path, mode):
    """sys.exit(3), with the Worker left open (or after close()): the controller counted the
    worker done and the launcher failed; the replacement registered as worker 2 (or the job
    ended without it and the replacement waited for the stopped controller)."""
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "exitcode"), "-n", "2",
                                          "--restart", "1"), tmp_path, timeout=60,
                             script_args=[mode])
    assert code == 0, out
    assert "worker1 failed (exit code 3); starting a replacement" in out
    logs = tmp_path / "logs"
    assert "REPLACEMENT worker 1 has worker id 1" in (logs / "worker1.restart1.log").read_text()
    controller = (logs / "controller.log").read_text()
    assert re.search(r"worker 1 registered \(pid \d+\) as the replacement of a failed one",
                     controller), controller
    assert "job finished: 2 worker(s) done, 1 failed" in out
    assert_job_gone(job_id_of(out))


@pytest.mark.slow
def test_every_worker_exiting_non_zero_is_replaced_and_the_job_completes(tmp_path):
    start = time.monotonic()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "exitcode"), "-n", "2",
                                          "--restart", "2"), tmp_path, timeout=60,
                             script_args=["all"])
    assert code == 0, out
    for index in (0, 1):
        assert ("REPLACEMENT worker %d has worker id %d" % (index, index)) in \
            (tmp_path / "logs" / ("worker%d.restart1.log" % index)).read_text()
    assert time.monotonic() - start < 30, out  # (the replacements waited 30 s, then failed)


@pytest.mark.slow
def test_no_replacement_waits_for_a_controller_that_has_finished(tmp_path):
    """Every worker closes, then exits 3: the controller finishes; the job fails at once,
    naming the first failure, instead of replacements waiting for a stopped controller."""
    start = time.monotonic()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "exitcode"), "-n", "2",
                                          "--restart", "2"), tmp_path, timeout=60,
                             script_args=["all-after-close"])
    assert code == 1, out
    assert re.search(r"worker\d failed \(exit code 3\)(, and the controller finished|"
                     r" after the controller had finished)", out), out
    assert "ControllerTimeout" not in out
    assert time.monotonic() - start < 20, out
    assert_job_gone(job_id_of(out))


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--restart", "1", "--keep-going"]])
def test_a_script_that_never_creates_a_worker_ends_the_job_saying_so(tmp_path, options):
    """An unported script exits 0 without registering: the launcher waited forever."""
    start = time.monotonic()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "unported"), "-n", "2",
                                          *options), tmp_path, timeout=60)
    assert code == 1, out
    assert re.search(r"worker\d \(pid \d+\) exited \(exit code 0\) without ever creating a "
                     r"platoon.Worker, while the controller waits for it to register", out), out
    assert "docs/porting-a-script.md" in out
    assert "UNPORTED: trained alone" in out  # the tail of its log
    assert time.monotonic() - start < 20, out
    assert_job_gone(job_id_of(out))


def test_resume_starts_from_the_saved_centre(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "2"),
                             first)
    assert code == 0, out
    saved = first / "logs" / "centre.npz"
    assert saved.exists()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "2",
                                          "--resume", str(first / "logs")), second)
    assert code == 0, out
    assert "centre initialised from checkpoint" in (second / "logs" / "controller.log").read_text()


def test_keep_going_lets_the_controller_carry_on(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "tolerant"), "-n", "2",
                                          "--keep-going"), tmp_path)
    assert code == 0, out
    assert "carrying on without it (--keep-going)" in out
    assert "SURVIVED the loss of worker 1: RuntimeError: deliberate crash in worker 1" in out


def test_a_worker_ending_without_close_counts_as_done(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "noclose"), "-n", "2",
                                          "--restart", "1"), tmp_path, timeout=60)
    assert code == 0, out
    assert "replacement" not in out


def test_a_worker_lingering_after_the_controller_finished_is_stopped(tmp_path):
    start = time.monotonic()
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "linger"), "-n", "2",
                                          "--finish-timeout-s", "1", "--stop-timeout-s", "2"),
                             tmp_path, timeout=30)
    assert code == 1, out
    assert re.search(r"worker1 \(pid \d+\) still running 1 s after the controller finished "
                     r"\(--finish-timeout-s 1\); stopped the job", out), out
    assert "LINGERING after close()" in out  # the tail of its log
    assert time.monotonic() - start < 20, out  # not the 40 s it would linger
    assert_job_gone(job_id_of(out))


def run_on_a_terminal(args, tmp_path, timeout):
    """(exit code, output) of the launcher with a pseudo-terminal as stdout and stderr."""
    master, slave = pty.openpty()
    try:
        popen = subprocess.Popen(args + ["--log-dir", str(tmp_path / "logs")],
                                 stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                 cwd=str(tmp_path), start_new_session=True)
    finally:
        os.close(slave)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail("launcher still running after %.3g s:\n%s" % (timeout, data))
            if select.select([master], [], [], left)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal is gone
                    break
                if not chunk:
                    break
                data += chunk
        return popen.wait(max(1.0, deadline - time.monotonic())), data.decode(errors="replace")
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)
        os.close(master)


def minibatch_counts(lines):
    return [int(m.group(1)) for m in map(re.compile(r".*workers alive.*minibatches (\d+)").match,
                                         lines) if m]


@pytest.mark.slow
def test_the_status_line_refreshes_on_a_terminal(tmp_path):
    code, out = run_on_a_terminal(launcher_cmd(os.path.join(EXPERIMENTS, "progress"), "-n", "2"),
                                  tmp_path, timeout=40)
    assert code == 0, out
    counts = minibatch_counts(re.split(r"[\r\n]+", out))
    assert counts and counts[-1] == 60, out
    during = set(counts) - {0, 60}  # refreshed while the workers ran, not only at the end
    assert len(during) >= 2, (sorted(during), out)  # (about 6 idle; a loaded machine fewer)


@pytest.mark.slow
def test_without_a_terminal_a_status_line_every_few_seconds(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "progress"), "-n", "2",
                                          "--status-every", "0.5"), tmp_path, timeout=40)
    assert code == 0, out  # the old spelling of --status-every-s still works, with a warning
    assert "--status-every is deprecated; use --status-every-s" in out
    counts = minibatch_counts(line for line in out.splitlines()
                              if line.startswith("platoon-launcher: workers alive"))
    assert counts and counts[-1] == 60, out
    assert len(set(counts) - {0, 60}) >= 2, out  # while the workers ran, not only at exits


def test_the_linear_example_runs_by_hand_without_python_on_path(tmp_path):
    bin_dir = tmp_path / "bin"  # python3 only, as after the README's set-up
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\nexec %s "$@"\n' % sys.executable)
    (bin_dir / "python3").chmod(0o755)
    path = "%s:/usr/bin:/bin" % bin_dir
    assert shutil.which("python", path=path) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    popen = subprocess.Popen([os.path.join(ROOT, "examples", "linear", "run.sh"), "2", str(port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, PATH=path), start_new_session=True)
    try:
        out, _ = popen.communicate(timeout=60)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.communicate(timeout=10)
    assert popen.returncode == 0, out
    assert re.search(r"trained \d+ minibatches; distance of the centre", out), out
    assert out.count("distance to the true weights") == 2, out


def test_logs_are_private_whatever_the_umask(tmp_path):
    log_dir = tmp_path / "runs" / "envcheck"  # parents made by the launcher are private too
    proc = subprocess.run(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "2",
                                       "--log-dir", str(log_dir)),
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path), umask=0)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for directory in (tmp_path / "runs", log_dir):
        assert oct(directory.stat().st_mode & 0o777) == oct(0o700), directory
    for name in ("controller.log", "worker0.log", "worker1.log", "status.json"):
        assert oct((log_dir / name).stat().st_mode & 0o777) == oct(0o600), name
    assert_job_gone(job_id_of(out))


class ExitedProcess(launcher.Process):
    """A launcher Process record for one that already exited, without starting anything."""

    def __init__(self, label, pid, returncode, log_path):
        self.label, self.pid, self.returncode, self.log_path = label, pid, returncode, log_path
        self.popen = subprocess.Popen([sys.executable, "-c", ""])  # waits return at once
        self.popen.wait(10)


def test_the_worker_named_by_workerdied_leads_even_if_seen_after_the_controller(tmp_path):
    (tmp_path / "controller.log").write_text(
        "platoon.errors.WorkerDied: worker 1 (pid 4242) failed: RuntimeError: boom; "
        "the job stops\n")
    (tmp_path / "worker.log").write_text("RuntimeError: boom\n")
    launch = launcher.Launch(launcher.parse_args(["x"]), out=io.StringIO())
    launch.controller = ExitedProcess("controller", 4000, 1, str(tmp_path / "controller.log"))
    launch.workers = [ExitedProcess("worker0", 4141, None, str(tmp_path / "worker.log")),
                      ExitedProcess("worker1", 4242, None, str(tmp_path / "worker.log"))]
    launch._note_exits()  # the controller is seen exiting first, its workers still "running"
    launch.workers[1].returncode = 1
    assert launch._worker_that_stopped_the_controller() is launch.workers[1]
    launch.controller.returncode = -signal.SIGKILL
    assert launch.controller.killed()  # a killed controller is always the root cause


@pytest.mark.parametrize("option, named", [
    (["--curve"], "--curve"), (["--restart", "1"], "--restart"), (["--keep-going"], "--keep-going"),
    (["--checkpoint-every-s", "5"], "--checkpoint-every-s"),
    (["--checkpoint-every", "5"], "--checkpoint-every-s"), (["--resume", "."], "--resume"),
    (["-D", "cpu"], "-D/--devices"), (["--control-port", "5000"], "--control-port"),
    (["--data-port", "5001"], "--data-port"), (["--status-every-s", "1"], "--status-every-s")])
def test_hosts_refuses_every_option_it_cannot_honour(option, named, capsys):
    with pytest.raises(SystemExit) as exc:
        launcher.parse_args(["x", "--hosts", "h1", "h2"] + option)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: %s cannot be used with --hosts: " % named in err, err


def test_hosts_takes_the_options_it_passes_on():
    args = launcher.parse_args(["x", "--hosts", "h1", "h2", "-n", "3", "-c", "--steps 5",
                                "-w", "--lr 1", "--tie-every-s", "0.5", "--ready-timeout-s", "9",
                                "--finish-timeout-s", "8", "--stop-timeout-s", "7"])
    assert (args.workers, args.ready_timeout_s, args.finish_timeout_s, args.stop_timeout_s,
            args.restart, args.control_port) == (3, 9.0, 8.0, 7.0, 0, 0)


@pytest.mark.parametrize("argv, message", [
    (["--elastic"], "--elastic needs --hosts: one node per host"),
    (["--hosts", "h1", "--min-nodes", "1"], "--min-nodes needs --elastic (with --hosts)"),
    (["--hosts", "h1", "--elastic", "--tie-beta", "0.3"],
     "--tie-beta goes with --tie-outer easgd"),
    (["--hosts", "h1", "--elastic", "--tie-outer", "easgd", "--tie-outer-lr", "1"],
     "--tie-outer-lr and --tie-outer-momentum go with --tie-outer diloco"),
    (["--hosts", "h1", "--elastic", "--tie-every-syncs", "4"],
     "--tie-every-syncs cannot be used with --elastic: an elastic node's outer rounds are "
     "paced in seconds"),
    (["--hosts", "h1", "--elastic", "--keep-going"], "--keep-going cannot be used with "
     "--elastic: a failed node never stops an elastic job's other nodes"),
    (["--hosts", "h1", "--elastic", "--curve"], "--curve cannot be used with --hosts"),
    (["--hosts", "h1", "--elastic", "--join", "h0:29510"],
     "--join needs --secret-file: the secret of the job whose lighthouse it joins"),
    (["--hosts", "h1", "--elastic", "--join", "h0:29510", "--min-nodes", "1"],
     "--min-nodes cannot be used with --join: it is the running lighthouse's setting"),
    (["--hosts", "h1", "--elastic", "--lighthouse", "h0"], "--lighthouse h0: give HOST:PORT"),
    (["--hosts", "h1", "h2", "--elastic", "--min-nodes", "3"],
     "--min-nodes 3 is more than the 2 host(s): no quorum would ever form"),
    (["--hosts", "h1", "--elastic", "--min-nodes", "0"], "--min-nodes must be an integer >= 1"),
    (["--hosts", "h1", "--elastic", "--heartbeat-timeout-s", "0"],
     "--heartbeat-timeout-s must be > 0 seconds"),
    (["--hosts", "h1", "--elastic", "--tie-every-s", "30"],
     "--tie-every-s must be less than 30 s with --elastic"),
    (["--hosts", "h1", "--elastic", "--tie-outer-lr", "11"], "--tie-outer-lr must be in (0, 10]"),
])
def test_elastic_refuses_what_an_elastic_job_cannot_do(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        launcher.parse_args(["x"] + argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: " + message in err, err


def test_elastic_takes_restart_and_ties_with_the_elastic_nodes_defaults():
    from platoon._os.nodesettings import elastic_tie  # noqa: PLC2701 (the settings' home)
    from platoon.launch.elastic import lighthouse_address, node_names
    args = launcher.parse_args(["x", "--hosts", "h1", "h2", "h1", "--elastic", "--restart", "2",
                                "--tie-outer-lr", "0.5", "--status-every-s", "1"])
    from platoon.elastic import MembershipSettings
    assert args.restart == 2 and args.membership == MembershipSettings()
    assert args.node.tie == elastic_tie(outer_lr=0.5)
    assert (args.node.tie.outer, args.node.tie.compress, args.node.tie.every_s) == (
        "diloco", "int8", 3.0)
    assert node_names(args.hosts) == ["h1-1", "h2", "h1-2"]
    assert lighthouse_address(None, ["localhost", "127.0.0.1"]) == ("127.0.0.1:0",) * 2
    assert lighthouse_address("lh.example:29510", ["h1"]) == ("0.0.0.0:29510",
                                                              "lh.example:29510")
    assert lighthouse_address("10.0.0.1:0", ["h1"]) == ("10.0.0.1:0",) * 2


def test_tie_options_need_hosts(capsys):
    with pytest.raises(SystemExit) as exc:
        launcher.parse_args(["x", "--tie-every-s", "1"])
    assert exc.value.code == 2 and "--tie-every-s needs --hosts" in capsys.readouterr().err


def test_old_spellings_of_durations_still_work_but_are_hidden(capsys):
    args = launcher.parse_args(["x", "--ready-timeout", "1", "--finish-timeout", "2",
                                "--stop-timeout", "3", "--status-every", "4",
                                "--checkpoint-every", "5"])
    assert (args.ready_timeout_s, args.finish_timeout_s, args.stop_timeout_s,
            args.status_every_s, args.checkpoint_every_s) == (1, 2, 3, 4, 5)
    assert capsys.readouterr().err.count("is deprecated; use --") == 5
    defaults = launcher.parse_args(["x"])
    assert (defaults.ready_timeout_s, defaults.finish_timeout_s, defaults.stop_timeout_s,
            defaults.status_every_s, defaults.checkpoint_every_s) == (120, 60, 5, 5, None)
    with pytest.raises(SystemExit):
        launcher.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--ready-timeout-s" in text and "--ready-timeout " not in text


@pytest.mark.parametrize("style", ["separate", "joined"])
def test_script_arguments_that_start_with_a_dash(tmp_path, style):
    """-c/-w take a value that looks like an option (argparse alone refused "-c --flag"; a
    value with a space, "-c '--steps 5'", always worked)."""
    def option(flag, value):
        return [flag, value] if style == "separate" else [flag + "=" + value]
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "argv"), "-n", "1",
                                          *option("-c", "--no-baseline"),
                                          *option("--worker-args", "-v")), tmp_path)
    assert code == 0, out
    logs = tmp_path / "logs"
    assert "CONTROLLER ARGV ['--no-baseline']" in (logs / "controller.log").read_text()
    assert "WORKER ARGV ['-v']" in (logs / "worker0.log").read_text()
    assert_job_gone(job_id_of(out))


def test_any_script_runs_as_the_workers_with_the_words_after_the_double_dash(tmp_path):
    """platoon-launcher SCRIPT.py -- ARGS: no EXPERIMENT_worker.py naming, no quoted -w."""
    code, out = run_launcher(
        launcher_cmd("-n", "2", os.path.join(EXPERIMENTS, "argv_worker.py"),
                     "--controller", os.path.join(EXPERIMENTS, "argv_controller.py"),
                     "-c", "--x 1"), tmp_path, env={"CUDA_VISIBLE_DEVICES": ""},
        script_args=["--lr", "20", "--log-dir", "mine", "-n", "5", "--", "last"])
    assert code == 0, out
    logs = tmp_path / "logs"  # the launcher's own --log-dir, and -n 2: not the script's
    assert "controller on port" in out and "2 worker(s) on cpu, cpu" in out, out
    for k in (0, 1):
        assert ("WORKER ARGV ['--lr', '20', '--log-dir', 'mine', '-n', '5', '--', 'last']"
                in (logs / ("worker%d.log" % k)).read_text())
    assert "CONTROLLER ARGV ['--x', '1']" in (logs / "controller.log").read_text()
    assert_job_gone(job_id_of(out))


def test_script_form_usage(tmp_path, capsys):
    args = launcher.parse_args(["-n", "3", "train.py", "-w", "--a", "--", "--lr", "20"])
    assert (args.experiment, args.workers, args.worker_argv, args.controller) == (
        "train.py", 3, ["--a", "--lr", "20"], None)
    assert launcher.parse_args(["x"]).worker_argv == []
    launch = launcher.Launch(launcher.parse_args(["dir/train.py"]), out=io.StringIO())
    assert launch.log_dir.startswith(os.path.join("platoon-logs", "train", ""))  # (plain, not
    for argv, error in [                                     # an unset variable's name)
            (["train.py", "--lr", "20"], "unrecognized arguments: --lr 20 (the worker "
             "script's arguments go after --: platoon-launcher train.py -- --lr 20)"),
            (["train.py", "--log-dri", "d"], "unrecognized option --log-dri: did you mean "
             "--log-dir?"),
            (["train.py", "--ready-timeot=4"], "unrecognized option --ready-timeot=4: did you "
             "mean --ready-timeout-s?"),
            (["examples/digits/digits", "--controller", "c.py"],
             "--controller goes with a SCRIPT.py")]:
        with pytest.raises(SystemExit) as exc:
            launcher.parse_args(argv)
        assert exc.value.code == 2
        assert error in capsys.readouterr().err
    code, out = run_launcher(launcher_cmd(str(tmp_path / "train.py")), tmp_path)
    assert code == 2 and "no script %s" % (tmp_path / "train.py") in out, out
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "argv_worker.py"),
                                          "--controller", "missing.py"), tmp_path)
    assert code == 2 and "no script missing.py" in out, out
    with pytest.raises(SystemExit):
        launcher.parse_args(["--help"])
    assert "platoon-launcher -n 2 train.py -- --lr 20 --epochs 3" in capsys.readouterr().out


def test_help_shows_script_arguments_with_a_dash(capsys):
    with pytest.raises(SystemExit):
        launcher.parse_args(["--help"])
    assert '-c "--no-baseline"' in capsys.readouterr().out


def catches(pid, signum):
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/PID/status)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
    except (OSError, AttributeError):
        return False
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.slow
def test_a_stop_that_cuts_a_workers_import_short_prints_no_traceback():
    """SIGTERM (the launcher stopping its job) arriving while a worker imports an extension
    module: the handler's SystemExit comes out as ImportError (numpy's "PyCapsule_Import could
    not import module"), and the worker printed its traceback as if it had failed (seen under
    load in test_two_signals_at_once_during_start_up). It exits quietly with 143, as stopped."""
    out = subprocess.run([sys.executable, "-m", "platoon.launch.child", "worker0",
                          os.path.join(EXPERIMENTS, "cut_short_worker.py")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 128 + signal.SIGTERM, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "NOT STOPPED" not in out.stdout, out.stderr


def test_two_signals_at_once_during_start_up(tmp_path):
    """SIGINT and SIGTERM back to back, at moments from the launcher's first line (its
    handlers set) through the controller's and workers' start: one message naming the first
    signal received, its exit code, no traceback, nothing left running, no shared memory."""
    delays = [0.0, 0.03, 0.15, 0.6, 1.2, 2.2]  # each order three times
    for run, delay in enumerate(delays):
        first, second = ((signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT))[run % 2]
        workdir = tmp_path / ("run%d" % run)
        workdir.mkdir()
        launch = Launched(launcher_cmd(os.path.join(EXPERIMENTS, "forever"), "-n", "2"), workdir)
        try:
            wait_until(lambda launch=launch: catches(launch.popen.pid, signal.SIGTERM)
                       or launch.popen.poll() is not None, 20, "the launcher's handlers")
            deadline = time.monotonic() + delay  # the moment of start-up to interrupt:
            time.sleep(max(0.0, delay - 0.01))  # (slept, not spun: the job needs the cores)
            while time.monotonic() < deadline:  # and the last 10 ms spun, for precision
                pass
            launch.popen.send_signal(first)
            launch.popen.send_signal(second)
            code = launch.popen.wait(30)
            out = launch.output()
            where = "delay %.2f s, %s sent first:\n%s" % (delay, signal_name(first), out)
            assert "Traceback" not in out, where
            assert out.count("received: stopping the job") == 1, where
            # Both pending at once, the kernel delivers the lower-numbered first (SIGINT):
            # the launcher's first is the one it names, and its code is the exit code.
            (taken,) = re.findall(r"(SIGINT|SIGTERM) received: stopping the job", out)
            assert code == 128 + signal.Signals[taken], where
            job = re.search(r"job ([0-9a-f]{16})", out)
            if job:
                assert_job_gone(job.group(1))
        finally:
            launch.close()


@pytest.mark.slow
def test_a_second_signal_late_in_the_stop_changes_nothing(tmp_path):
    """SIGTERM after SIGTERM, arriving while the launcher is already finishing (a loaded
    machine can delay the second of two signals that long): the exit code stays the first
    signal's, not a death by the second (Python restores the default action as it exits)."""
    launch = Launched(launcher_cmd(os.path.join(EXPERIMENTS, "forever"), "-n", "1"), tmp_path)
    try:
        wait_until(lambda: catches(launch.popen.pid, signal.SIGTERM)
                   or launch.popen.poll() is not None, 20, "the launcher's handlers")
        deadline = time.monotonic() + 30
        while launch.popen.poll() is None:  # SIGTERMs in every phase of the stop and exit
            assert time.monotonic() < deadline, "the launcher still runs:\n" + launch.output()
            try:
                os.kill(launch.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                break  # exited between the poll and the kill
        code = launch.popen.wait(30)
        out = launch.output()
        assert code == 128 + signal.SIGTERM, out
        assert out.count("received: stopping the job") == 1, out
    finally:
        launch.close()


OTHER_UID = 65534  # nobody: "another user" (the tests run as root, which may chown)


def test_a_log_dir_others_could_write_in_is_refused(tmp_path):
    """A --log-dir of another user (or writable by others, or reached through another user's
    link) is refused before anything starts: its owner could plant links to our files there."""
    victim = tmp_path / "victim.txt"  # a file of ours that a planted link points at
    victim.write_text("precious")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.symlink(victim, theirs / "worker0.log")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    mine = tmp_path / "mine"
    mine.mkdir(0o700)
    link = tmp_path / "their-link"
    os.symlink(mine, link)
    os.lchown(link, OTHER_UID, OTHER_UID)
    for log_dir, says in ((theirs, r"belongs to uid %d \(\w+\), not to you" % OTHER_UID),
                          (shared, r"is writable by other users \(mode 0?777\); run chmod go-w"),
                          (link, r"is a link of uid %d \(\w+\), not yours" % OTHER_UID)):
        proc = subprocess.run(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "1",
                                           "--log-dir", str(log_dir)),
                              capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert re.search(r"log directory %s %s.*choose a --log-dir of your own"
                         % (re.escape(str(log_dir)), says), out), out
        assert "job " not in out, out  # nothing started
    assert victim.read_text() == "precious"
    assert os.listdir(mine) == []


def test_a_planted_link_in_the_log_dir_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    logs = tmp_path / "logs"
    logs.mkdir(0o700)
    os.symlink(victim, logs / "worker0.log")
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"), "-n", "1"),
                             tmp_path, timeout=60)
    assert code == 2, out
    assert "log file %s exists already" % (logs / "worker0.log") in out, out
    assert victim.read_text() == "precious"
    assert_job_gone(job_id_of(out))


@pytest.mark.parametrize("argv, error", [
    (["--control-port", "70001"], "argument --control-port: '70001' is not a tcp port: give 1 "
     "to 65535, or 0 for a free one"),
    (["--data-port", "-1"], "argument --data-port: '-1' is not a tcp port"),
    (["--control-port", "http"], "argument --control-port: 'http' is not a tcp port"),
    (["--ready-timeout-s", "nan"], "argument --ready-timeout-s: 'nan' is not a duration: give "
     "a number of seconds, 0 or more"),
    (["--finish-timeout-s", "inf"], "argument --finish-timeout-s: 'inf' is not a duration"),
    (["--stop-timeout", "-1"], "argument --stop-timeout: '-1' is not a duration"),
    (["--status-every-s", "0"], "--status-every-s must be more than 0"),
    (["--checkpoint-every-s", "0"], "--checkpoint-every-s must be more than 0"),
    (["--hosts", "h1", "--tie-every-syncs", "0"], "--tie-every-syncs must be an integer >= 1"),
    (["-c", "--a 'b"], "-c/--controller-args \"--a 'b\": No closing quotation; quote it as a "
     "shell would"),
    (["-w", '"x'], "-w/--worker-args '\"x': No closing quotation")])
def test_bad_values_are_usage_errors(argv, error, capsys):
    """Each ended in a traceback (exit 1), or was taken: --control-port 70001 ran a job on
    port 4465."""
    with pytest.raises(SystemExit) as exc:
        launcher.parse_args(["x"] + argv)
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_a_port_out_of_range_ends_the_launcher_with_a_usage_error(tmp_path):
    code, out = run_launcher(launcher_cmd(os.path.join(EXPERIMENTS, "envcheck"),
                                          "--control-port", "70001"), tmp_path)
    assert code == 2 and "'70001' is not a tcp port" in out, out
    assert not (tmp_path / "logs").exists()


def test_fast_output_is_shown_whole_or_said_skipped_and_the_traceback_after_it(tmp_path):
    """A worker printing 15 MB in its last moment, then failing: the launcher shows lines
    whole, says how much it skipped and where it all is, and shows the traceback at the end
    (it says the output is above)."""
    script = tmp_path / "fast.py"
    script.write_text("import sys\n"
                      "sys.stdout.write(''.join('line %06d ' % i + 'x' * 40 + '\\n'\n"
                      "                         for i in range(300000)))\n"
                      "sys.stdout.flush()\n"
                      "raise RuntimeError('the end of a fast worker')\n")
    code, out = run_launcher(launcher_cmd(str(script), "-n", "1"), tmp_path, timeout=60)
    assert code == 1, out[-3000:]
    shown = [line for line in out.splitlines() if line.startswith("[worker0] line ")]
    assert all(re.fullmatch(r"\[worker0\] line \d{6} x{40}", line) for line in shown), \
        [line for line in shown if not re.fullmatch(r"\[worker0\] line \d{6} x{40}", line)][:3]
    numbers = [int(line.split()[2]) for line in shown]
    assert numbers == sorted(numbers) and numbers[-1] == 299999, numbers[-3:]
    log = tmp_path / "logs" / "worker0.log"
    skipped = re.findall(r"^\[worker0\] \(platoon-launcher: skipped (\d+) bytes of output here, "
                         r"written faster than shown; all of it is in (\S+), from byte \d+\)$",
                         out, re.M)
    assert skipped and all(path == str(log) for _, path in skipped), out[:3000]
    assert len(shown) + sum(int(n) for n, _ in skipped) // 53 == 300000  # (53 bytes a line)
    tail = out[out.rindex("[worker0] line "):]
    assert "[worker0] RuntimeError: the end of a fast worker" in tail, tail
    assert "Its output is above (prefixed [worker0]" in tail, tail


def test_escape_sequences_of_a_worker_show_as_text(tmp_path):
    """A window title, an erase-line and a carriage return forging a launcher line reach the
    terminal as visible text, prefixed with the worker."""
    script = tmp_path / "escapes.py"
    script.write_text("print('\\x1b]0;pwned\\x07title set')\n"
                      "print('\\x1b[2K\\rplatoon-launcher: job finished', flush=True)\n"
                      "raise SystemExit('\\x1b[31mred\\x1b[0m')\n")
    code, out = run_launcher(launcher_cmd(str(script), "-n", "1"), tmp_path, timeout=60)
    assert code == 1, out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out, repr(out)
    assert "\n[worker0] \\x1b]0;pwned\\x07title set\n" in out, out
    assert "\n[worker0] \\x1b[2K\\rplatoon-launcher: job finished\n" in out, out
    assert "\n[worker0] \\x1b[31mred\\x1b[0m\n" in out, out


def follower_lines(tmp_path, chunks, final=True):
    """The lines a LogFollower shows of a log written in `chunks`, a look after each."""
    log = tmp_path / "w.log"
    log.write_bytes(b"")
    follower, lines = LogFollower(str(log)), []
    for chunk in chunks:
        with open(log, "ab") as f:
            f.write(chunk)
        lines += follower.new_lines()
    return lines + (follower.new_lines(final=True) if final else [])


def test_a_long_line_is_cut_saying_so_and_never_held_whole(tmp_path):
    piece = b"y" * output.CHUNK  # a look's worth at a time: 60 MiB without a newline
    lines = follower_lines(tmp_path, [b"before\n"] + [piece] * 60 + [b"\nafter\nlast"])
    assert not [line for line in lines if "skipped" in line]
    assert lines[0] == "before" and lines[-2:] == ["after", "last"], lines[-2:]
    cut = [line for line in lines if line.startswith("y")]
    assert len(cut) == 1 and cut[0] == "y" * output.MAX_LINE + (
        " … (platoon-launcher: line cut at %d bytes; all of it is in %s)"
        % (output.MAX_LINE, tmp_path / "w.log")), [line[-120:] for line in lines]
    follower = output.LogFollower(str(tmp_path / "w.log"))
    for _ in range(80):  # a look at a time: what is held stays small
        follower.new_lines()
        assert len(follower._partial) <= output.MAX_LINE
    tail = output.tail(str(tmp_path / "w.log"), 3)
    assert tail.splitlines()[-2:] == ["after", "last"], tail[-200:]
    assert len(tail) < output.TAIL_BYTES
    (tmp_path / "one.log").write_bytes(b"w" * (output.TAIL_BYTES * 2))
    one = output.tail(str(tmp_path / "one.log"))
    assert one.startswith("… www") and one.endswith(" … (platoon-launcher: line cut at %d bytes; "
                                                   "all of it is in %s)\n" % (
                                                       output.MAX_LINE, tmp_path / "one.log"))


def test_a_skip_never_shows_a_cut_line_as_whole(tmp_path):
    body = b"".join(b"%07d %s\n" % (i, b"z" * 92) for i in range(200000))  # 20 MB
    lines = follower_lines(tmp_path, [b"pending start of a line ", body], final=True)
    skipped = [line for line in lines if line.startswith("(platoon-launcher: skipped")]
    assert len(skipped) == 1 and "from byte 0)" in skipped[0], lines[:2]
    rest = lines[lines.index(skipped[0]) + 1:]
    assert rest and all(re.fullmatch(r"\d{7} z{92}", line) for line in rest), rest[:2]
    assert rest[-1].startswith("0199999 ")
    no_newline = follower_lines(tmp_path, [b"q" * (output.BACKLOG + output.KEEP)])
    assert no_newline[0].startswith("(platoon-launcher: skipped"), no_newline[0]
    assert no_newline[1].startswith("… qqq") and "line cut" in no_newline[1], no_newline[1][-99:]


def test_control_characters_are_made_visible():
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x1b[2K\rX\x07\x08\x7f\x9b") == "\\x1b[2K\\rX\\x07\\x08\\x7f\\x9b"
    assert visible("é 中文 ✓") == "é 中文 ✓"


def test_the_status_line_fits_the_terminal_and_shows_escapes_as_text(tmp_path):
    """At 80 columns, a status line with many metrics (one with an escape sequence in its
    name) is cut to whole parts and '+K more', one row: a wider line wraps, and each redraw
    left a stale copy."""
    metrics = {"metric_%02d" % i: i / 7 for i in range(20)}
    metrics["\x1b]0;title\x07\x1b[2Kname"] = 1.0
    write_status(str(tmp_path / "status.json"), {"minibatches": 5, "syncs": 2,
                                                 "metrics": metrics})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = os.fdopen(slave, "w")
    try:
        status = StatusLine(out, 5.0, str(tmp_path / "status.json"))
        assert status.tty and status.width() == 80
        status.show([], 0, force=True)
        status.show([], 0, force=True)
        status.say("done")
        data = b""
        while select.select([master], [], [], 0.2)[0]:
            data += os.read(master, 65536)
    finally:
        out.close()
        os.close(master)
    text = data.decode()
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    drawn = [row for row in re.split(r"[\r\n]+", text) if row.strip()]
    assert drawn[0].startswith("workers alive 0/0 | minibatches 5 | syncs 2 | "), drawn
    assert re.search(r" \| \+\d+ more$", drawn[0]), drawn
    assert drawn[0] == drawn[1] and drawn[-1] == "platoon-launcher: done", drawn
    assert all(columns(row) < 80 for row in re.split(r"[\r\n]", text)), drawn
    wide = StatusLine(io.StringIO(), 5.0, None)
    assert not wide.tty  # a log, not a terminal: whole lines, escapes shown as text
    write_status(str(tmp_path / "status.json"), {"metrics": {"\x1b[2Kx": 1}})
    wide.status_file = str(tmp_path / "status.json")
    wide.show([], 0, force=True)
    assert wide.out.getvalue().endswith(" | \\x1b[2Kx 1\n"), wide.out.getvalue()


class _Exited:
    """A worker process as the status line sees it: poll() is its exit code, None if alive."""

    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_the_status_line_counts_live_workers_against_the_jobs_size(tmp_path):
    write_status(str(tmp_path / "status.json"), {"minibatches": 5, "syncs": 2})
    status = StatusLine(io.StringIO(), 5.0, str(tmp_path / "status.json"))
    # -n 3 --restart 1: worker 0 failed and its replacement runs (before: "alive 3/4",
    # counting every process started)
    status.show([_Exited(1), _Exited(None), _Exited(None), _Exited(None)], 3, force=True)
    status.show([_Exited(1), _Exited(None), _Exited(None)], 3, force=True)  # not replaced yet
    assert status.out.getvalue().splitlines() == [
        "platoon-launcher: workers alive 3/3 | minibatches 5 | syncs 2",
        "platoon-launcher: workers alive 2/3 | minibatches 5 | syncs 2"]


def test_fit_keeps_whole_parts_counting_wide_characters():
    assert fit(["a" * 10, "b" * 10], 80) == "a" * 10 + " | " + "b" * 10
    assert fit(["a" * 10, "b" * 70, "c"], 80) == "a" * 10 + " | +2 more"
    assert fit(["中" * 50], 80) == "中" * 39 + "…" and columns("中" * 39 + "…") == 79
    assert columns(fit(["é" * 30, "文" * 30, "x"], 60)) < 60


def test_a_typo_in_the_scripts_own_arguments_is_said_so(tmp_path):
    """A script whose argparse refuses its arguments fails before its Worker: not 'not ported
    to platoon', nor 'the workers never synced'."""
    script = tmp_path / "typo.py"
    script.write_text("import argparse\n"
                      "parser = argparse.ArgumentParser()\n"
                      "parser.add_argument('--lr')\n"
                      "parser.parse_args()\n")
    code, out = run_launcher(launcher_cmd(str(script), "-n", "2"), tmp_path,
                             script_args=["--lrr", "3"])
    assert code == 1, out
    assert "[worker" in out and "error: unrecognized arguments: --lrr 3" in out, out
    assert re.search(r"worker\d (\(pid \d+\) )?failed \(exit code 2\)( before creating its "
                     r"platoon\.Worker, while the controller waits for it to register)?: exit "
                     r"code 2 is a usage error \(argparse's\): check the script's own "
                     r"arguments, after --; stopped the job\. Its output is above", out), out
    assert "not ported" not in out and "never synced" not in out, out


def test_a_worker_stopped_by_controllergone_says_it_in_one_line(capsys):
    """A crash in worker 1 stops the controller; worker 0's ControllerGone is a consequence:
    one line naming where the script stopped, not 27 lines of platoon's internals."""

    def request():
        try:
            raise ConnectionRefusedError("connection refused")
        except ConnectionRefusedError:
            raise ControllerGone("the controller of job x (pid 1) has exited; worker 0 "
                                 "cannot go on") from None

    try:
        request()
    except ControllerGone as exc:
        child._from_the_scripts_frames(type(exc), exc, exc.__traceback__)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert re.fullmatch(r"platoon\.errors\.ControllerGone: the controller of job x \(pid 1\) "
                        r"has exited; worker 0 cannot go on \(at \S+test_launcher\.py, line "
                        r"\d+, in request\) \(the launcher reports why the job stopped\)\n",
                        err), err
    try:
        raise RuntimeError("any other error")
    except RuntimeError as exc:
        child._from_the_scripts_frames(type(exc), exc, exc.__traceback__)
    assert "Traceback (most recent call last)" in capsys.readouterr().err
