"""platoon-launcher: start a job's controller, then one worker per device, and watch them.

Every process runs in its own session through `platoon.child` (dies with the
launcher, SIGTERM becomes an orderly exit) and writes to its own log file. If
any process fails, or the launcher is interrupted, the rest are stopped
(SIGTERM, then SIGKILL after a deadline), the job's shared memory is removed,
and the launcher exits non-zero.
"""

import argparse
import datetime
import glob
import json
import logging
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time

from .environment import JobEnvironment
from .security import generate_keys
from .shmem import SEGMENT_PREFIX

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

EPILOG = """\
devices: without -D, every visible CUDA GPU gets a worker; with none, -n CPU workers run.
Each worker sees only its GPU (CUDA_VISIBLE_DEVICES) and learns its name from Worker.device.

exit codes:
  0    every process finished successfully
  1    a process failed (non-zero exit or killed), or the controller never became ready
  2    usage error (bad arguments, experiment files not found)
  130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM
"""


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class UsageError(Exception):
    pass


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="platoon-launcher", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", help="path prefix: runs EXPERIMENT_worker.py and, if it "
                        "exists, EXPERIMENT_controller.py (else the default Controller)")
    parser.add_argument("-D", "--devices", nargs="+", metavar="DEV",
                        help="devices, one worker each: cuda0 cuda1 ... or cpu")
    parser.add_argument("-n", "--workers", type=int, default=2, metavar="N",
                        help="CPU workers when no GPU is used (default 2)")
    parser.add_argument("-c", "--controller-args", default="", metavar="ARGS",
                        help="arguments for the controller script, as one string")
    parser.add_argument("-w", "--worker-args", default="", metavar="ARGS",
                        help="arguments for each worker script, as one string")
    parser.add_argument("--log-dir", help="default: PLATOON_LOGS/EXPERIMENT/<timestamp>/")
    parser.add_argument("--control-port", type=int, default=0, help="default: a free port")
    parser.add_argument("--data-port", type=int, default=0, help="default: a free port")
    parser.add_argument("--ready-timeout", type=float, default=120.0, metavar="S",
                        help="seconds for the controller to start serving (default 120)")
    parser.add_argument("--finish-timeout", type=float, default=60.0, metavar="S",
                        help="seconds workers may run on after the controller finished "
                        "(default 60); then they are stopped and the job fails")
    parser.add_argument("--stop-timeout", type=float, default=5.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    parser.add_argument("--status-every", type=float, default=5.0, metavar="S",
                        help="seconds between status lines when the output is not a terminal "
                        "(default 5); on a terminal the line refreshes twice a second")
    parser.add_argument("--restart", type=int, default=0, metavar="N",
                        help="replace up to N failed workers instead of stopping the job")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed worker does not stop the job: the controller's "
                        "handle_worker_death decides")
    parser.add_argument("--checkpoint-every", type=float, metavar="S",
                        help="snapshot the centre to LOG_DIR/centre.npz every S seconds "
                        "(it is always written when the controller stops)")
    parser.add_argument("--resume", metavar="DIR",
                        help="start the centre from a checkpoint (a log directory or .npz)")
    parser.add_argument("--hosts", nargs="+", metavar="HOST",
                        help="one controller per host, as MPI ranks (mpiexec from "
                        "the mpi extra), each running -n workers; see README, Multi-node jobs")
    parser.add_argument("--tie-every-s", type=float, metavar="S",
                        help="with --hosts: tie the node centres every S seconds")
    parser.add_argument("--tie-every-syncs", type=int, metavar="K",
                        help="with --hosts: tie the node centres every K reported syncs")
    parser.add_argument("--curve", action="store_true",
                        help="authenticate every connection with CURVE keys made for this job "
                        "(written 0600 to LOG_DIR/curve_keys.json)")
    parser.add_argument("--log-level", default=os.environ.get("PLATOON_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("-n must be at least 1")
    if args.status_every <= 0:
        parser.error("--status-every must be more than 0")
    if args.restart < 0:
        parser.error("--restart must be at least 0")
    if args.resume and not os.path.exists(args.resume):
        parser.error("--resume %s: no such checkpoint" % args.resume)
    return args


def find_scripts(experiment):
    """(worker script, controller script or None) for an experiment prefix."""
    worker = experiment + "_worker.py"
    if not os.path.isfile(worker):
        raise UsageError("no worker script %s; the launcher runs EXPERIMENT_worker.py (and "
                         "EXPERIMENT_controller.py if present)" % worker)
    controller = experiment + "_controller.py"
    return worker, controller if os.path.isfile(controller) else None


def visible_gpus():
    """Indices of the CUDA GPUs this process may use (empty without GPUs or drivers)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()]


def plan_devices(args, say):
    """The device of each worker: 'cudaK' or 'cpu'."""
    if args.devices:
        for dev in args.devices:
            if dev != "cpu" and not re.fullmatch(r"cuda\d+", dev):
                raise UsageError("unknown device %r; use cuda0, cuda1, ... or cpu" % dev)
        return list(args.devices)
    gpus = visible_gpus()
    if gpus:
        return ["cuda%s" % g for g in gpus]
    say("no CUDA GPU visible: starting %d CPU worker(s) (-n to change, -D to choose devices)"
        % args.workers)
    return ["cpu"] * args.workers


def open_private(path):
    """A file descriptor writing `path` afresh, readable by its owner only whatever the umask
    (logs may hold data and paths)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    return fd


def make_private_dirs(path):
    """Create `path` and its missing parents as 0700, whatever the umask; directories that
    exist already are left as they are (a --log-dir may be the user's own)."""
    missing = []
    head = os.path.abspath(path)
    while not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs
        os.chmod(directory, 0o700)


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


class Process:
    """A child process in its own session, logging to a file."""

    def __init__(self, label, target, args, env, log_path, pass_fds=(), index=None,
                 device=None):
        self.label = label
        self.index = index
        self.device = device
        self.log_path = log_path
        cmd = [sys.executable, "-m", "platoon.child", label, target] + list(args)
        log_fd = open_private(log_path)
        try:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_fd,
                                          stderr=subprocess.STDOUT, env=env,
                                          pass_fds=pass_fds, start_new_session=True)
        finally:
            os.close(log_fd)
        self.pid = self.popen.pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def signal(self, signum):
        """Signal the process's whole group (it leads its own session)."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def killed(self):
        """Whether it ended by a signal (platoon.child turns SIGTERM into exit 128 + 15)."""
        code = self.returncode
        return code is not None and (code < 0 or 128 < code < 128 + signal.NSIG)

    def describe_exit(self):
        code = self.returncode
        if code is None:
            return "still running"
        if code < 0:
            return "killed by %s" % _signal_name(-code)
        if code > 128 and self.killed():
            return "exit code %d after %s" % (code, _signal_name(code - 128))
        return "exit code %d" % code

    def tail(self, lines=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


class Launch:
    """One job: the controller, its workers, their logs, and their teardown."""

    def __init__(self, args, out=sys.stdout):
        self.args = args
        self.out = out
        self.tty = out.isatty()
        self.job_id = secrets.token_hex(8)
        self.controller = None
        self.workers = []
        name = os.path.basename(args.experiment.rstrip("/")) or "job"
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        self.log_dir = args.log_dir or os.path.join("PLATOON_LOGS", name, stamp)
        self.status_file = os.path.join(self.log_dir, "status.json")
        self._status_shown = 0.0
        self._status_len = 0
        self.restarts_left = args.restart
        self.keys_file = None
        self._finished_at = None
        self._failed = set()
        self._replaced = set()
        self._exit_pass = {}  # process -> the supervision pass that first saw it exited
        self._passes = 0

    # -- output --

    def say(self, text):
        self._clear_status()
        print("platoon-launcher: %s" % text, file=self.out, flush=True)

    def _clear_status(self):
        if self.tty and self._status_len:
            self.out.write("\r" + " " * self._status_len + "\r")
            self._status_len = 0

    def show_status(self, force=False):
        now = time.monotonic()
        if not force and now - self._status_shown < (0.5 if self.tty else
                                                     self.args.status_every):
            return
        self._status_shown = now
        try:
            with open(self.status_file) as f:
                status = json.load(f)
        except (OSError, ValueError):
            status = {}
        alive = sum(w.poll() is None for w in self.workers)
        parts = ["workers alive %d/%d" % (alive, len(self.workers)),
                 "minibatches %d" % status.get("minibatches", 0),
                 "syncs %d" % status.get("syncs", 0)]
        for key, value in sorted(status.get("metrics", {}).items()):
            parts.append("%s %s" % (key, "%.4g" % value if isinstance(value, float) else value))
        line = " | ".join(parts)
        if self.tty:
            self._clear_status()
            self.out.write(line)
            self.out.flush()
            self._status_len = len(line)
        else:
            print("platoon-launcher: %s" % line, file=self.out, flush=True)

    # -- the job --

    def child_env(self, **settings):
        env = dict(os.environ, PLATOON_LAUNCHER_PID=str(os.getpid()),
                   PLATOON_LOG_LEVEL=self.args.log_level, PYTHONUNBUFFERED="1")
        env.update(JobEnvironment(job_id=self.job_id, status_file=self.status_file,
                                  keys_file=self.keys_file, **settings).to_env())
        return env

    def start_controller(self, script):
        read_fd, write_fd = os.pipe()
        resume = self.args.resume
        if resume and os.path.isdir(resume):
            resume = os.path.join(resume, "centre.npz")
        env = self.child_env(control_port=self.args.control_port,
                             data_port=self.args.data_port,
                             num_workers=self.num_workers, ready_fd=write_fd,
                             restarts=self.args.restart,
                             checkpoint_path=os.path.join(self.log_dir, "centre.npz"),
                             checkpoint_every_s=self.args.checkpoint_every,
                             resume_from=os.path.abspath(resume) if resume else None)
        for var in THREAD_VARIABLES:
            env[var] = "1"
        target = script if script else "-m:platoon.controller"
        try:
            self.controller = Process("controller", target,
                                      shlex.split(self.args.controller_args), env,
                                      os.path.join(self.log_dir, "controller.log"),
                                      pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
        try:
            return self._wait_ready(read_fd)
        finally:
            os.close(read_fd)

    def _wait_ready(self, fd):
        """The controller's announcement (ports), read from the pipe: no sleep-and-hope."""
        deadline = time.monotonic() + self.args.ready_timeout
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None  # the controller exited (or closed the pipe) first
                data += chunk
        return json.loads(data.split(b"\n", 1)[0])

    def start_workers(self, script, devices, ready):
        self.worker_script, self.ready = script, ready
        self.cpu_threads = str(max(1, (os.cpu_count() or 1) // max(devices.count("cpu"), 1)))
        for index, device in enumerate(devices):
            self.start_worker(index, device)

    def start_worker(self, index, device, attempt=0):
        env = self.child_env(control_port=self.ready["control_port"],
                             data_port=self.ready.get("data_port"), num_workers=len(self.devices),
                             device=device, worker_index=index)
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
            for var in THREAD_VARIABLES:
                env[var] = self.cpu_threads
        else:
            env["CUDA_VISIBLE_DEVICES"] = device[len("cuda"):]
        name = "worker%d" % index + (".restart%d" % attempt if attempt else "")
        self.workers.append(Process(name, self.worker_script, shlex.split(self.args.worker_args),
                                    env, os.path.join(self.log_dir, name + ".log"),
                                    index=index, device=device))

    def run_hosts(self, worker_script, controller_script):
        """A multi-node job: mpiexec runs `platoon.mpi` once per host; it is the one child."""
        mpiexec = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
                   or shutil.which("mpiexec"))
        if mpiexec is None:
            raise UsageError("--hosts needs mpiexec: pip install mpi4py mpich (in platoon's "
                             "clone: pip install -e '.[mpi]')")
        args = self.args
        cmd = ["-hosts", ",".join(args.hosts), "-n", str(len(args.hosts)), "-ppn", "1",
               sys.executable, "-m", "platoon.mpi", "--workers", str(args.workers)]
        if controller_script:
            cmd += ["--controller", controller_script, "--controller-args", args.controller_args]
        if args.tie_every_s:
            cmd += ["--tie-every-s", str(args.tie_every_s)]
        if args.tie_every_syncs:
            cmd += ["--tie-every-syncs", str(args.tie_every_syncs)]
        cmd += ["--", worker_script] + shlex.split(args.worker_args)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATOON_")}
        env.update(PLATOON_LAUNCHER_PID=str(os.getpid()), PLATOON_LOG_LEVEL=args.log_level)
        self.controller = Process("mpiexec", "-x:" + mpiexec, cmd, env,
                                  os.path.join(self.log_dir, "mpiexec.log"))
        self.say("mpiexec: %d node(s) (%s), %d worker(s) each"
                 % (len(args.hosts), ", ".join(args.hosts), args.workers))
        return self.supervise()

    def run(self):
        worker_script, controller_script = find_scripts(self.args.experiment)
        if controller_script is None:
            self.say("no %s_controller.py: using the default Controller"
                     % os.path.basename(self.args.experiment))
        if self.args.hosts:
            make_private_dirs(self.log_dir)
            return self.run_hosts(worker_script, controller_script)
        self.devices = devices = plan_devices(self.args, self.say)
        self.num_workers = len(devices)
        if os.path.exists(os.path.join(self.log_dir, "controller.log")):
            raise UsageError("log directory %s already holds a job's logs; choose another "
                             "--log-dir or remove it" % self.log_dir)
        make_private_dirs(self.log_dir)
        if self.args.curve:
            self.keys_file = generate_keys(os.path.join(self.log_dir, "curve_keys.json"))
        self.say("job %s: logs in %s" % (self.job_id, self.log_dir))
        ready = self.start_controller(controller_script)
        if ready is None:
            try:  # the pipe closed: the controller is exiting, collect its code
                self.controller.popen.wait(self.args.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
            self.controller.poll()
            return self.fail(self.controller, "the controller did not become ready (%s)"
                             % (self.controller.describe_exit()
                                if self.controller.returncode is not None
                                else "no answer within %.3g s" % self.args.ready_timeout))
        self.start_workers(worker_script, devices, ready)
        self.say("controller on port %d, %d worker(s) on %s"
                 % (ready["control_port"], len(devices), ", ".join(devices)))
        return self.supervise()

    def supervise(self):
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        previous = signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        try:
            while True:
                self._note_exits()
                if self.controller.poll() not in (None, 0):
                    return self.controller_failed()
                for proc in list(self.workers):
                    if proc.poll() not in (None, 0) and proc not in self._failed:
                        self._failed.add(proc)
                        failure = self.worker_failed(proc)
                        if failure is not None:
                            return failure
                if self.controller.poll() == 0 and self._finished_at is None:
                    self._finished_at = time.monotonic()
                lingering = [p for p in self.workers if p.poll() is None]
                if (self._finished_at is not None and lingering
                        and time.monotonic() - self._finished_at > self.args.finish_timeout):
                    return self.fail(lingering[0], "%s still running %.3g s after the "
                                     "controller finished (--finish-timeout %.3g)" % (
                                         ", ".join("%s (pid %d)" % (p.label, p.pid)
                                                   for p in lingering),
                                         self.args.finish_timeout, self.args.finish_timeout))
                if self.controller.poll() == 0 and all(p.poll() is not None
                                                       for p in self.workers):
                    if not self.args.hosts:
                        self.show_status(force=True)
                    self._clear_status()
                    if self.args.hosts:
                        self.say("job finished on %d node(s); logs in %s"
                                 % (len(self.args.hosts), self.log_dir))
                    else:
                        self.say("job finished: %d worker(s) done%s; logs in %s"
                                 % (len(self.workers) - len(self._failed),
                                    ", %d failed" % len(self._failed) if self._failed else "",
                                    self.log_dir))
                    self._echo(self.controller)
                    return EXIT_OK
                if not self.args.hosts:
                    self.show_status()
                readable, _, _ = select.select([wakeup_r], [], [], 0.5)
                if readable:  # drain the signals' bytes; never block here (the fd is
                    try:      # non-blocking too), or the loop stalls until the next signal
                        os.read(wakeup_r, 4096)
                    except BlockingIOError:
                        pass
        finally:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.set_wakeup_fd(previous)
            os.close(wakeup_r)
            os.close(wakeup_w)

    def _note_exits(self):
        """Record in which supervision pass each process was first seen exited."""
        self._passes += 1
        for proc in [self.controller] + self.workers:
            if proc.poll() is not None and proc not in self._exit_pass:
                self._exit_pass[proc] = self._passes

    def controller_failed(self):
        """Fail the job, leading the report with the root cause: the worker whose failure
        stopped the controller, else the controller, then the workers that died after it."""
        ctl = self.controller
        reason = "%s failed (%s)" % ("mpiexec" if self.args.hosts else "the controller",
                                     ctl.describe_exit())
        cause = None if ctl.killed() else self._worker_that_stopped_the_controller()
        if cause is not None:
            return self.fail(cause, "%s failed (%s), and then %s" % (
                cause.label, cause.describe_exit(), reason))
        after = [p for p in self.workers if p.poll() not in (None, 0)
                 and p not in self._failed]
        if after:
            reason += "; after it %s failed" % ", ".join(
                "%s (%s)" % (p.label, p.describe_exit()) for p in after)
        return self.fail(ctl, reason)

    def _worker_that_stopped_the_controller(self):
        """The worker whose failure ended the controller (which exited with an error): the one
        its log names (WorkerDied, by pid), else one seen failing no later than it, or None."""
        named = re.findall(r"WorkerDied: worker \d+ \(pid (\d+)\)", self.controller.tail(20))
        for proc in self.workers:
            if named and proc.pid == int(named[-1]):
                try:  # it is exiting after telling the controller: show its exit code
                    proc.popen.wait(self.args.stop_timeout)
                except subprocess.TimeoutExpired:
                    pass
                proc.poll()
                return proc
        seen = self._exit_pass[self.controller]
        earlier = [p for p in self.workers if p.returncode not in (None, 0)
                   and p not in self._replaced and self._exit_pass.get(p, seen + 1) <= seen]
        return min(earlier, key=self._exit_pass.get, default=None)

    def worker_failed(self, proc):
        """Restart, tolerate or fail the job for a failed worker; returns an exit code to fail."""
        reason = "%s failed (%s)" % (proc.label, proc.describe_exit())
        if self.restarts_left > 0:
            self.restarts_left -= 1
            attempt = sum(p.index == proc.index for p in self.workers)
            self.say("%s; starting a replacement (%d restart(s) left). Last lines of %s:\n%s"
                     % (reason, self.restarts_left, proc.log_path, proc.tail(5).rstrip()))
            self._replaced.add(proc)
            self.start_worker(proc.index, proc.device, attempt)
            return None
        if self.args.keep_going:
            self.say("%s; carrying on without it (--keep-going)" % reason)
            return None
        return self.fail(proc, reason)

    def _echo(self, proc):
        text = proc.tail(15).rstrip()
        if text:
            self.say("last lines of %s:\n%s" % (proc.log_path, text))

    def fail(self, proc, reason):
        self.stop_all()
        self.say("%s; stopped the job. Last lines of %s:\n%s"
                 % (reason, proc.log_path, proc.tail().rstrip() or "(empty)"))
        return EXIT_FAILED

    def stop_all(self):
        """SIGTERM every live process group, SIGKILL what is left at the deadline, reap all."""
        everyone = [p for p in self.workers + [self.controller]
                    if p is not None and p.poll() is None]  # reaped pids may be reused
        for proc in everyone:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.args.stop_timeout
        for proc in everyone:
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
        for proc in everyone:
            proc.signal(signal.SIGKILL)  # stragglers in the groups, if any
            proc.popen.wait()
            proc.poll()
        self.remove_shared_memory()

    def make_status_private(self):
        """chmod 0600 the status file the controller wrote under its umask (inside the 0700
        log directory meanwhile)."""
        try:
            os.chmod(self.status_file, 0o600)
        except OSError:
            pass  # no status file: the controller never wrote one

    def remove_shared_memory(self):
        for path in glob.glob("/dev/shm%s%s-*" % (SEGMENT_PREFIX, self.job_id)):
            try:
                os.unlink(path)
                log.info("removed %s", path)
            except FileNotFoundError:
                pass


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="platoon-launcher: %(message)s")
    launch = Launch(args)

    def interrupt(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        return launch.run()
    except UsageError as exc:
        print("platoon-launcher: %s" % exc, file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        launch.say("%s received: stopping the job" % exc)
        launch.stop_all()
        return 128 + exc.signum
    finally:
        for proc in [launch.controller] + launch.workers:
            if proc is not None and proc.poll() is None:
                launch.stop_all()
                break
        launch.make_status_private()


if __name__ == "__main__":
    sys.exit(main())
