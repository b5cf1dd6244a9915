"""Supervision of a launched job: its child processes, their logs, the status line, teardown.

Every process runs in its own session through `platoon.launch.child` (dies with the
launcher, SIGTERM becomes an orderly exit) and writes to its own log file. If
any process fails, or the launcher is interrupted, the rest are stopped
(`platoon._os.process.stop`), the job's shared memory is removed, and the job fails.
"""

import dataclasses
import datetime
import errno
import logging
import os
import pwd
import re
import secrets
import select
import shlex
import signal
import stat
import subprocess
import sys
import time
from typing import List, Optional, Sequence

from .._os.environment import (
    THREAD_VARIABLES,
    JobEnvironment,
    device_variables,
    without_job_variables,
    worker_environment,
)
from .._os.nodesettings import NodeSettings
from .._os.process import (
    find_mpiexec,
    read_announcement,
    signal_name,
    stop,
    unlink_job_segments,
)
from .._os.statusfile import MAX_METRICS, MAX_NAME, read_status, shortened
from .output import LogFollower, columns, fit, tail, visible

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LOGS = "platoon-logs"  # the default --log-dir's top folder, in the working directory


class UsageError(Exception):
    """A job that cannot start as asked (the launcher exits with EXIT_USAGE)."""


def mpiexec_arguments(hosts: Sequence[str], node: NodeSettings, worker_command: Sequence[str],
                      python: str = sys.executable) -> List[str]:
    """mpiexec's arguments for a --hosts job: one rank on each of `hosts` runs
    ``python -m platoon.mpi`` with `node`'s settings (`NodeSettings.to_argv`, the one argv
    that carries them across), then ``--`` and `worker_command`."""
    return (["-hosts", ",".join(hosts), "-n", str(len(hosts)), "-ppn", "1",
             python, "-m", "platoon.mpi"] + node.to_argv() + ["--"] + list(worker_command))


def open_private(path):
    """A file descriptor writing the new file `path`, readable by its owner only whatever the
    umask (logs may hold data and paths). Never follows a link nor reuses a file: raises
    UsageError if `path` exists."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise UsageError("log file %s exists already (an earlier job's, or a link): choose "
                         "another --log-dir or remove it" % path) from None


def _owner(uid):
    try:
        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return "uid %d" % uid


_MAX_LINKS = 40  # as the kernel: more links than this on one path is a loop
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _check_on_the_way(info, log_dir, passed):
    """Raise UsageError unless directory (or link) `passed`, on the way to `log_dir`, is one
    only root or this user can change: owned by one of them, and not writable by others
    unless sticky (as /tmp: others cannot rename what is ours in it). Anyone else could
    swap what follows it for a link of theirs."""
    if info.st_uid not in (0, os.getuid()):
        raise UsageError("log directory %s is reached through %s, which belongs to %s: they "
                         "could swap what follows for a link of theirs; choose a --log-dir "
                         "of your own" % (log_dir, passed, _owner(info.st_uid)))
    if stat.S_ISDIR(info.st_mode) and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) \
            and not info.st_mode & stat.S_ISVTX:
        raise UsageError("log directory %s is reached through %s, which other users may write "
                         "in (mode %03o, not sticky): they could swap what follows for a link "
                         "of theirs; run chmod go-w on it, or choose a --log-dir of your own"
                         % (log_dir, passed, stat.S_IMODE(info.st_mode)))


def _walk(path, create):
    """A descriptor of directory `path`, opened component by component from / without
    following a link that root or this user does not own, through directories only they
    can change (else UsageError); with `create`, missing ones are made 0700."""
    links = [0]

    def step(fd, where, part, last):
        """The descriptor of `part` in directory `fd` (shown as `where`), a link followed."""
        shown = os.path.join(where, part)
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
                made = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.fchmod(made, 0o700)  # exactly, whatever the umask
                return made
            except FileExistsError:
                pass  # made meanwhile by someone else: looked at below
        except OSError as exc:  # ELOOP: a link; ENOTDIR: not a directory
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        info = os.stat(part, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISLNK(info.st_mode):
            if not stat.S_ISDIR(info.st_mode):
                raise UsageError("log directory %s: %s is not a directory; choose another "
                                 "--log-dir" % (path, shown))
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        if info.st_uid not in (0, os.getuid()):
            raise UsageError("log directory %s %s a link of %s, not yours (%s): choose a "
                             "--log-dir of your own"
                             % (path, "is" if last else "is reached through %s," % shown,
                                _owner(info.st_uid), _owner(os.getuid())))
        links[0] += 1
        if links[0] > _MAX_LINKS:
            raise UsageError("log directory %s: too many links on the way (a loop?)" % path)
        target = os.readlink(part, dir_fd=fd)
        if target.startswith("/"):
            return walk(_ROOT, "/", target, last)
        return walk(fd, where, target, last)

    def walk(start_fd, where, text, final):
        """The descriptor of `text` from directory `start_fd`; `final`: it is `path` itself."""
        parts = [part for part in text.split("/") if part not in ("", ".")]
        fd = os.open(".", _DIR_FLAGS, dir_fd=start_fd) if start_fd != _ROOT \
            else os.open("/", _DIR_FLAGS)
        try:
            for index, part in enumerate(parts):
                last = final and index == len(parts) - 1
                child = step(fd, where, part, last)
                os.close(fd)
                fd = child
                where = os.path.join(where, part)
                if not last:
                    _check_on_the_way(os.fstat(fd), path, where)
            return fd
        except BaseException:
            os.close(fd)
            raise

    absolute = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    return walk(_ROOT, "/", absolute, True)


_ROOT = -1  # `walk` from / rather than from a descriptor


def open_private_dir(path, create=False):
    """A descriptor (close-on-exec) of the log directory `path`, for the job's files to be
    written relative to it: what `path` leads to later (a parent's owner swapping it for a
    link) then does not matter. Raises UsageError unless it is this user's, no one else may
    write in it, and every directory on the way from / is one only root or this user can
    change (links on the way too: their own, in such directories). With `create`, missing
    directories are made 0700 whatever the umask."""
    fd = _walk(path, create)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise UsageError("log directory %s belongs to %s, not to you (%s): choose a "
                             "--log-dir of your own" % (path, _owner(info.st_uid),
                                                        _owner(os.getuid())))
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UsageError("log directory %s is writable by other users (mode %03o); run "
                             "chmod go-w on it, or choose a --log-dir of your own"
                             % (path, stat.S_IMODE(info.st_mode)))
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_private_dir(path):
    """Raise UsageError unless the log directory `path` passes `open_private_dir`'s checks."""
    os.close(open_private_dir(path))


def make_private_dirs(path):
    """`open_private_dir(path, create=True)`: create `path` and its missing parents as 0700,
    whatever the umask (directories that exist already are left as they are: a --log-dir may
    be the user's own), and return a descriptor of it; UsageError as `open_private_dir`."""
    return open_private_dir(path, create=True)


SUPERVISION_PERIOD_S = 0.2  # between looks at the processes (and their output) at most
# A replacement that failed unregistered: how long to wait for a finishing controller to exit
LATE_REPLACEMENT_WAIT_S = 2.0
# A line a node runner has attributed to one of its workers (platoon.node.runner.Workers):
# shown as it is, not led by its node's process too.
ATTRIBUTED = re.compile(r"\[node-[^\s\]/]+/worker\d+\] ")


class Process:
    """A child process in its own session, logging to a file."""

    def __init__(self, label, target, args, env, log_path, pass_fds=(), index=None,
                 device=None):
        self.label = label
        self.index = index
        self.device = device
        self.log_path = log_path
        cmd = [sys.executable, "-m", "platoon.launch.child", label, target] + list(args)
        log_fd = open_private(log_path)
        try:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_fd,
                                          stderr=subprocess.STDOUT, env=env,
                                          pass_fds=pass_fds, start_new_session=True)
        finally:
            os.close(log_fd)
        self.pid = self.popen.pid
        self.returncode = None
        self.output = LogFollower(log_path)

    def end_shown_output(self):
        """From now on `new_lines` gives only what the log holds now: what the process writes
        while it is being stopped stays in its log."""
        self.output.stop_at()

    def new_lines(self, final=False):
        """The lines its log gained since the last call (`final`: all of them, the unended
        last one too), bounded and made visible (`platoon.launch.output.LogFollower`)."""
        return self.output.new_lines(final)

    def poll(self):
        if self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def killed(self):
        """Whether it ended by a signal (platoon.launch.child turns SIGTERM into exit 128 + 15)."""
        code = self.returncode
        return code is not None and (code < 0 or 128 < code < 128 + signal.NSIG)

    def describe_exit(self):
        code = self.returncode
        if code is None:
            return "still running"
        if code < 0:
            return "killed by %s" % signal_name(-code)
        if code > 128 and self.killed():
            return "exit code %d after %s" % (code, signal_name(code - 128))
        return "exit code %d" % code

    def tail(self, lines=20):
        return tail(self.log_path, lines)


SHOWN_METRICS = MAX_METRICS  # metrics on the status line and in each summary line, at most


def _metric(key, value):
    if isinstance(value, float):
        text = "%.4g" % value
    else:
        try:
            text = str(value)
        except ValueError:  # an int of more digits than Python converts
            text = "(a very large number)"
    return "%s %s" % (shortened(str(key)), shortened(text))


def _metrics(metrics):
    """'name value' of the first SHOWN_METRICS `metrics` by name, then '+K more metrics'."""
    if not isinstance(metrics, dict):
        return []
    names = sorted(metrics)
    shown = [_metric(key, metrics[key]) for key in names[:SHOWN_METRICS]]
    if len(names) > SHOWN_METRICS:
        shown.append("+%d more metrics" % (len(names) - SHOWN_METRICS))
    return shown


def _dropped(holder):
    """How many reported metrics the controller did not keep (its `metrics_dropped`)."""
    count = holder.get("metrics_dropped") if isinstance(holder, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


class StatusLine:
    """The launcher's messages and its status line (redrawn in place on a terminal)."""

    def __init__(self, out, every_s, status_file):
        self.out, self.every_s, self.status_file = out, every_s, status_file
        self.tty = out.isatty()
        self._shown = 0.0
        self._length = 0

    def say(self, text):
        self.clear()
        print("platoon-launcher: %s" % visible(text), file=self.out, flush=True)

    def clear(self):
        if self.tty and self._length:
            self.out.write("\r" + " " * self._length + "\r")
            self._length = 0

    def show(self, workers, size, force=False):
        """Draw the status line: how many of the processes `workers` (every one started,
        failed and replaced ones included) are alive, of the job's `size`; the controller's
        counts and metrics."""
        if not self.due(force):
            return
        status = read_status(self.status_file)
        alive = sum(w.poll() is None for w in workers)
        parts = ["workers alive %d/%d" % (alive, size)]
        if isinstance(status.get("elapsed_s"), (int, float)):
            parts.append("elapsed %s" % datetime.timedelta(seconds=int(status["elapsed_s"])))
        parts.append("minibatches %d" % status.get("minibatches", 0))
        syncs = "syncs %d" % status.get("syncs", 0)
        if isinstance(status.get("syncs_per_s"), (int, float)):
            syncs += " (%.1f/s)" % status["syncs_per_s"]
        parts.append(syncs)
        if _dropped(status):
            parts.append("%d metrics not kept" % _dropped(status))
        parts += _metrics(status.get("metrics"))
        self.draw(parts)

    def due(self, force=False):
        """Whether the line is to be drawn now (twice a second on a terminal, else every
        `every_s`, or `force`); if so, counts it as drawn."""
        now = time.monotonic()
        if not force and now - self._shown < (0.5 if self.tty else self.every_s):
            return False
        self._shown = now
        return True

    def draw(self, parts):
        """Draw the line of `parts` (each made visible): in place, fitted to the terminal, or
        as one line of output."""
        parts = [visible(part) for part in parts]
        if self.tty:  # one line that fits: a wider one wraps, and clear() leaves its copy
            line = fit(parts, self.width())
            self.clear()
            self.out.write(line)
            self.out.flush()
            self._length = columns(line)
            return
        line = " | ".join(parts)
        print("platoon-launcher: %s" % line, file=self.out, flush=True)

    def width(self):
        """The terminal's columns now (it may have been resized); 80 if it cannot be told."""
        try:
            return os.get_terminal_size(self.out.fileno()).columns or 80
        except (AttributeError, OSError, ValueError):
            return 80


class Launch:
    """One job: the controller, its workers, their logs, and their teardown."""

    def __init__(self, args, out=sys.stdout):
        self.args = args
        self.job_id = secrets.token_hex(8)
        self.controller: Optional[Process] = None  # made by start_controller (or the MPI start)
        self.workers = []
        name = os.path.basename(args.experiment.rstrip("/")) or "job"
        name = name[:-len(".py")] if name.endswith(".py") else name
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        self.log_dir = args.log_dir or os.path.join(LOGS, name, stamp)
        self.status_file = os.path.join(self.log_dir, "status.json")
        self.status = StatusLine(out, args.status_every_s, self.status_file)
        self.say = self.status.say
        self.restarts_left = args.restart
        self.keys_file = None
        self.log_dir_fd = None  # the log directory, opened once (`make_private_dirs`)
        self._finished_at = None
        self._finished_ok = False  # the job ended, every process done
        self._failed = set()
        self._replaced = set()
        self._seen_registered = set()  # workers the status file lists as registered
        self._replacement_of = {}  # replacement -> the failed worker it replaces
        self._exit_pass = {}  # process -> the supervision pass that first saw it exited
        self._passes = 0
        self._started = time.monotonic()
        self._started_at = time.time()
        self.centre_path = os.path.join(self.log_dir, "centre.npz")

    def started(self):
        """Whether the job started (it has a summary): its controller (or mpiexec) did."""
        return self.controller is not None

    def child_env(self, **settings):
        # No MPI or torchrun rank variables: a framework in a worker would start its own DDP.
        env = worker_environment(os.environ, extra={"PYTHONUNBUFFERED": "1"})
        env.update(JobEnvironment(job_id=self.job_id, status_file=self.status_file,
                                  keys_file=self.keys_file, launcher_pid=os.getpid(),
                                  log_level=self.args.log_level, **settings).to_env())
        return env

    @property
    def started_controller(self) -> "Process":
        """The controller's process (mpiexec's in an MPI job), once started."""
        assert self.controller is not None, "the controller is not started yet"
        return self.controller

    def start_controller(self, script):
        """Start the controller; its announcement (ports), or None if it never came."""
        read_fd, write_fd = os.pipe()
        resume = self.args.resume
        if resume and os.path.isdir(resume):
            resume = os.path.join(resume, "centre.npz")
        env = self.child_env(control_port=self.args.control_port,
                             data_port=self.args.data_port,
                             num_workers=self.num_workers, ready_fd=write_fd,
                             restarts=self.args.restart,
                             checkpoint_path=self.centre_path,
                             log_dir_fd=self.log_dir_fd,
                             checkpoint_every_s=self.args.checkpoint_every_s,
                             resume_from=os.path.abspath(resume) if resume else None)
        for var in THREAD_VARIABLES:
            env[var] = "1"
        target = script if script else "-m:platoon.controller"
        try:
            self.controller = Process("controller", target,
                                      shlex.split(self.args.controller_args), env,
                                      os.path.join(self.log_dir, "controller.log"),
                                      pass_fds=(write_fd, self.log_dir_fd))
        finally:
            os.close(write_fd)
        try:
            return read_announcement(read_fd, self.args.ready_timeout_s)
        finally:
            os.close(read_fd)

    def start_workers(self, script, devices, ready):
        self.worker_script, self.ready = script, ready
        for index, device in enumerate(devices):
            self.start_worker(index, device)

    def start_worker(self, index, device, attempt=0):
        """Start (or restart) worker `index` on `device`, with its device's variables
        (`environment.device_variables`: its GPU, thread caps, JAX's share of a GPU)."""
        env = self.child_env(control_port=self.ready["control_port"],
                             data_port=self.ready.get("data_port"), num_workers=len(self.devices),
                             device=device, worker_index=index)
        env.update(device_variables(device, self.devices, os.cpu_count() or 1, os.environ))
        name = "worker%d" % index + (".restart%d" % attempt if attempt else "")
        self.workers.append(Process(name, self.worker_script, self.args.worker_argv,
                                    env, os.path.join(self.log_dir, name + ".log"),
                                    index=index, device=device))

    def run_hosts(self, worker_script, controller_script):
        """A multi-node job: mpiexec runs `platoon.mpi` once per host; it is the one child."""
        mpiexec = find_mpiexec()
        if mpiexec is None:
            raise UsageError("--hosts needs mpiexec: pip install mpi4py mpich (in platoon's "
                             "clone: pip install -e '.[mpi]')")
        self.log_dir_fd = make_private_dirs(self.log_dir)
        args = self.args
        node = dataclasses.replace(args.node, controller=controller_script,
                                   controller_args=args.controller_args if controller_script
                                   else "")
        cmd = mpiexec_arguments(args.hosts, node, [worker_script] + args.worker_argv)
        env = without_job_variables(os.environ)
        env.update(JobEnvironment(launcher_pid=os.getpid(), log_level=args.log_level,
                                  status_file=os.path.abspath(self.status_file),
                                  checkpoint_path=os.path.abspath(self.centre_path)).to_env())
        self.controller = Process("mpiexec", "-x:" + mpiexec, cmd, env,
                                  os.path.join(self.log_dir, "mpiexec.log"))
        self.say("mpiexec: %d node(s) (%s), %d worker(s) each"
                 % (len(args.hosts), ", ".join(args.hosts), args.workers))
        return self.supervise()

    def run(self, worker_script, controller_script, devices):
        """A job on this machine: the controller, then one worker per device."""
        self.devices = devices
        self.num_workers = len(devices)
        if os.path.exists(os.path.join(self.log_dir, "controller.log")):
            raise UsageError("log directory %s already holds a job's logs; choose another "
                             "--log-dir or remove it" % self.log_dir)
        self.log_dir_fd = make_private_dirs(self.log_dir)
        if self.args.curve:
            from ..security import generate_keys  # imports zmq: only for a --curve job
            self.keys_file = generate_keys(os.path.join(self.log_dir, "curve_keys.json"))
        self.say("job %s: logs in %s" % (self.job_id, self.log_dir))
        ready = self.start_controller(controller_script)
        if ready is None:
            try:  # the pipe closed: the controller is exiting, collect its code
                self.started_controller.popen.wait(self.args.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
            self.started_controller.poll()
            return self.fail(self.controller, "the controller did not become ready (%s)%s"
                             % (self.started_controller.describe_exit()
                                if self.started_controller.returncode is not None
                                else "no answer within %.3g s" % self.args.ready_timeout_s,
                                self._controller_error()))
        self.start_workers(worker_script, devices, ready)
        self.say("controller on port %d, %d worker(s) on %s"
                 % (ready["control_port"], len(devices), ", ".join(devices)))
        return self.supervise()

    def supervise(self):
        """Watch the processes until the job ends; returns the launcher's exit code."""
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        previous = signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        try:
            while True:
                code = self._supervision_pass()
                if code is not None:
                    return code
                readable, _, _ = select.select([wakeup_r], [], [], SUPERVISION_PERIOD_S)
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

    @staticmethod
    def _await_exit(proc, timeout_s):
        """Wait at most `timeout_s` for `proc` to exit."""
        try:
            proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        proc.poll()

    def _supervision_pass(self):
        """Act on what changed since the last pass; an exit code once the job has ended."""
        self.echo_output()
        self._note_exits()
        if self.started_controller.poll() not in (None, 0):
            return self.controller_failed()
        for new, old in self._replacement_of.items():
            if new.poll() not in (None, 0) and new not in self._failed \
                    and self._registered(new, final=True) is False:
                # (once) turned away by a controller that finished its job and is exiting: wait
                # (bounded) for it to exit, to name what happened rather than the refusal
                self._await_exit(self.started_controller, LATE_REPLACEMENT_WAIT_S)
            if self.started_controller.poll() == 0 and self._registered(new, final=True) is False:
                return self.fail(old, "%s failed (%s), and the controller finished (its job "
                                 "done) before %s, its replacement, registered"
                                 % (old.label, old.describe_exit(), new.label))
        for proc in list(self.workers):
            if proc.poll() not in (None, 0) and proc not in self._failed:
                self._failed.add(proc)
                failure = self.worker_failed(proc)
                if failure is not None:
                    return failure
        for proc in self.workers:
            if proc.poll() == 0 and self._registered(proc) is False:
                return self.fail(proc, self._never_registered(proc))
        if self.started_controller.poll() == 0 and self._finished_at is None:
            self._finished_at = time.monotonic()
        lingering = [p for p in self.workers if p.poll() is None]
        if (self._finished_at is not None and lingering
                and time.monotonic() - self._finished_at > self.args.finish_timeout_s):
            return self.fail(lingering[0], "%s still running %.3g s after the controller "
                             "finished (--finish-timeout-s %.3g)" % (
                                 ", ".join("%s (pid %d)" % (p.label, p.pid) for p in lingering),
                                 self.args.finish_timeout_s, self.args.finish_timeout_s))
        if self.started_controller.poll() == 0 and all(p.poll() is not None for p in self.workers):
            if self.args.hosts:
                self.say("job finished on %d node(s); logs in %s"
                         % (len(self.args.hosts), self.log_dir))
            else:
                self.status.show(self.workers, self.num_workers, force=True)
                self.say("job finished: %d worker(s) done%s; logs in %s"
                         % (len(self.workers) - len(self._failed),
                            ", %d failed" % len(self._failed) if self._failed else "",
                            self.log_dir))
            self._echo(self.controller)
            self._finished_ok = True
            return EXIT_OK
        if not self.args.hosts:
            self.status.show(self.workers, self.num_workers)
        return None

    def _note_exits(self):
        """Record in which supervision pass each process was first seen exited."""
        self._passes += 1
        for proc in [self.controller] + self.workers:
            if proc.poll() is not None and proc not in self._exit_pass:
                self._exit_pass[proc] = self._passes

    def controller_failed(self):
        """Fail the job, leading the report with the root cause: the worker whose failure
        stopped the controller, else the controller, then the workers that died after it."""
        ctl = self.started_controller
        reason = "%s failed (%s)" % ("mpiexec" if self.args.hosts else "the controller",
                                     ctl.describe_exit())
        own = "" if ctl.killed() else self._controller_error()
        reason += own
        cause = None if ctl.killed() or own else self._worker_that_stopped_the_controller()
        if cause is not None:
            return self.fail(cause, "%s failed (%s), and then %s" % (
                cause.label, cause.describe_exit(), reason))
        after = [p for p in self.workers if p.poll() not in (None, 0)
                 and p not in self._failed]
        if after:
            reason += "; after it %s failed" % ", ".join(
                "%s (%s)" % (p.label, p.describe_exit()) for p in after)
        return self.fail(ctl, reason)

    def _controller_error(self):
        """': Type: message (in thread 'name')' when the controller's serve() raised an
        error of its own (not one of handle_worker_death's): it wrote it to the status
        file before it exited. Else ''."""
        failure = read_status(self.status_file).get("failure")
        if not isinstance(failure, dict) or not isinstance(failure.get("error"), str):
            return ""
        thread = failure.get("thread")
        return ": %s%s" % (failure["error"],
                           " (in thread %r)" % thread if isinstance(thread, str) else "")

    def _worker_that_stopped_the_controller(self):
        """The worker whose failure ended the controller (which exited with an error): the one
        its status file names (`failed_worker`, by pid), else one seen failing no later than
        it, or None."""
        named = read_status(self.status_file).get("failed_worker")
        pid = named.get("pid") if isinstance(named, dict) else None
        for proc in self.workers:
            if pid is not None and proc.pid == pid:
                try:  # it is exiting after telling the controller: show its exit code
                    proc.popen.wait(self.args.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    pass
                proc.poll()
                return proc
        seen = self._exit_pass[self.controller]
        earlier = [p for p in self.workers if p.returncode not in (None, 0)
                   and p not in self._replaced and self._exit_pass.get(p, seen + 1) <= seen]
        return min(earlier, key=lambda p: self._exit_pass[p], default=None)

    def _registered(self, proc, final=False):
        """Whether the worker `proc`, exited (or, with `final`, the controller), registered
        with the controller: None while that is not known (no status file yet, or --hosts),
        and once the controller has stopped unless `final` (it needs no worker then). The
        controller lists a worker's pid in its status file before it answers the
        registration, so an exited worker it does not list never registered."""
        if proc in self._seen_registered:
            return True
        if self.args.hosts or (self.started_controller.poll() is not None and not final):
            return None
        pids = read_status(self.status_file).get("worker_pids")
        if not isinstance(pids, list):
            return None
        if proc.pid in pids:
            self._seen_registered.add(proc)
            return True
        return False

    def _never_registered(self, proc):
        if proc.returncode != 0:  # it failed before its Worker: its own output says why
            return ("%s (pid %d) failed (%s) before creating its platoon.Worker, while the "
                    "controller waits for it to register%s"
                    % (proc.label, proc.pid, proc.describe_exit(), self._usage_hint(proc)))
        return ("%s (pid %d) exited (%s) without ever creating a platoon.Worker, while the "
                "controller waits for it to register: its script is not ported to platoon. "
                "Create a Worker in it (see docs/porting-a-script.md); a script that is not "
                "a platoon worker runs without the launcher"
                % (proc.label, proc.pid, proc.describe_exit()))

    def _usage_hint(self, proc):
        """For a worker that exited 2 (argparse's usage error) and never registered: a hint
        that its script's own arguments were refused; else ''."""
        if proc.returncode != 2 or self._registered(proc, final=True):
            return ""
        return (": exit code 2 is a usage error (argparse's): check the script's own "
                "arguments, after --")

    def worker_failed(self, proc):
        """Restart, tolerate or fail the job for a failed worker; returns an exit code to fail."""
        reason = "%s failed (%s)%s" % (proc.label, proc.describe_exit(), self._usage_hint(proc))
        if self.started_controller.poll() is not None:  # a replacement would wait for it in vain
            reason += " after the controller had finished"
        elif self.restarts_left > 0:
            self.restarts_left -= 1
            attempt = sum(p.index == proc.index for p in self.workers)
            self.say("%s; starting a replacement (%d restart(s) left). Last lines of %s:\n%s"
                     % (reason, self.restarts_left, proc.log_path, proc.tail(5).rstrip()))
            self._replaced.add(proc)
            self.start_worker(proc.index, proc.device, attempt)
            self._replacement_of[self.workers[-1]] = proc
            return None
        if self._registered(proc) is False:  # the controller waits for it: no carrying on
            return self.fail(proc, self._never_registered(proc))
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
        if self.shows_output(proc):
            self.echo_output(final=True)
            self.say("%s; stopped the job. Its output is above (prefixed [%s]; log: %s)"
                     % (reason, proc.label, proc.log_path))
        else:
            self.say("%s; stopped the job. Last lines of %s:\n%s"
                     % (reason, proc.log_path, proc.tail().rstrip() or "(empty)"))
        return EXIT_FAILED

    def shows_output(self, proc):
        """Whether `proc`'s output is echoed on the terminal: every worker's (mpiexec's, which
        carries the workers', with --hosts) unless --quiet."""
        return not getattr(self.args, "quiet", False) and (
            proc in self.workers or (bool(self.args.hosts) and proc is self.controller))

    def everyone(self):
        """The job's processes started so far: the controller, then the workers."""
        return [p for p in [self.controller] + self.workers if p is not None]

    def echo_output(self, final=False):
        """Show on the terminal, each line prefixed with its process ([worker0] ...), what the
        logs of the processes it shows (`shows_output`) gained since the last look. With
        --hosts, a line a node's runner attributed to one of its workers
        (``[node-0/worker1] ...``) is shown as it is."""
        hosts = bool(self.args.hosts)
        for proc in self.everyone():
            if self.shows_output(proc):
                lines = proc.new_lines(final)
                if lines:
                    self.status.clear()
                    self.status.out.write("".join(
                        "%s\n" % line if hosts and ATTRIBUTED.match(line)
                        else "[%s] %s\n" % (proc.label, line) for line in lines))
                    self.status.out.flush()

    def running(self):
        """Whether any of the job's processes is still running."""
        return any(p.poll() is None for p in self.everyone())

    def stop_all(self):
        """Stop every live process group (SIGTERM, SIGKILL at the deadline), reap them all, and
        remove the job's shared memory. The terminal shows what the processes wrote until
        now, not what they write as they are stopped (tracebacks of the interrupt); the logs
        keep it all."""
        everyone = [p for p in self.workers + [self.controller] if p is not None]
        for proc in everyone:
            proc.end_shown_output()
        stop([p.popen for p in everyone], self.args.stop_timeout_s)
        for proc in everyone:
            proc.poll()
        for path in unlink_job_segments(self.job_id):
            log.info("removed %s", path)

    def summary(self):
        """Lines summing up the job once it has ended (however it ended): wall time, the
        progress in the controller's status file, each worker's last report, and where the
        centre was saved."""
        status = read_status(self.status_file)
        hosts = self.args.hosts
        if hosts:  # node 0's status file: its final result and centre are the job's, not
            status = {k: v for k, v in status.items() if k == "final_result"}  # its counts
        head = "job summary: wall time %.1f s" % (time.monotonic() - self._started)
        for key in ("minibatches", "syncs"):
            if isinstance(status.get(key), int):
                head += ", %d %s" % (status[key], key)
        lines = [head]
        final = status.get("final_result")
        tied = getattr(self.args, "node", None) is not None and self.args.node.tie is not None
        if isinstance(final, dict) and isinstance(final.get("metrics"), dict):
            lines.append("  final result (%s, evaluated once by %sworker %s): %s%s"
                         % ("the final centre" if not hosts
                            else "the agreed centre, after the final tie round" if tied
                            else "node 0's centre: the node centres were not tied",
                            "node 0's " if hosts else "", final.get("worker", "?"),
                            ", ".join(_metrics(final["metrics"])) or "(no metrics)",
                            "; %d more not kept" % _dropped(final) if _dropped(final) else ""))
        if (self._finished_ok and status.get("syncs") == 0 and self.args.workers > 1
                and not self.args.hosts):  # (a job that failed has said why already)
            lines.append("  warning: the workers never synced (0 syncs), so they shared "
                         "nothing: each trained alone. Call w.sync_params() (or "
                         "PeriodicSync.step()) in the training loop")
        reports = status.get("reports")
        for wid, report in sorted(reports.items() if isinstance(reports, dict) else [],
                                  key=lambda item: (len(item[0]), item[0])):  # 0, 1, ..., 10
            if not isinstance(report, dict):
                continue
            shown = ", ".join(_metrics(report.get("metrics")))
            lines.append("  worker %s last reported: %s(%s minibatches, %s syncs%s)" % (
                shortened(wid), shown + " " if shown else "", report.get("minibatches", "?"),
                report.get("syncs", "?"), ", %d metrics not kept" % _dropped(report)
                if _dropped(report) else ""))
        if _dropped(status):
            lines.append("  %d reported metrics were not kept: the controller keeps the first "
                         "%d metric names (of up to %d characters) for the job and for each "
                         "worker; report fewer" % (_dropped(status), MAX_METRICS, MAX_NAME))
        if hosts and self._saved_during_job(self.centre_path):
            lines.append("  centre saved to %s by node 0 (%s; load it with platoon.load_centre)"
                         % (self.centre_path, "the agreed centre, after the final tie round"
                            if tied else "its own: the node centres were not tied"))
        elif hosts:
            lines.append("  no centre saved to %s: node 0 (on %s) writes it there on its own "
                         "machine, once its workers shared their parameters"
                         % (self.centre_path, hosts[0]))
        elif self._saved_during_job(self.centre_path):
            lines.append("  centre saved to %s (load it with platoon.load_centre)"
                         % self.centre_path)
        else:
            lines.append("  no centre saved to %s: no worker shared its parameters, or the "
                         "controller was killed before writing one" % self.centre_path)
        return lines

    def _saved_during_job(self, path):
        try:
            return os.stat(path).st_mtime >= self._started_at - 1.0  # (coarse clocks)
        except OSError:
            return False

    def make_status_private(self):
        """chmod 0600 the status file the controller wrote under its umask (inside the 0700
        log directory meanwhile)."""
        try:
            fd = os.open(self.status_file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return  # no status file (the controller never wrote one), or a link: left alone
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
