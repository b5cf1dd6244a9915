"""platoon-launcher: start a job's controller, then one worker per device, and watch them.

This module is the command line: its options, the scripts and devices of a
job, and `main`. Running the job is `platoon.launch.supervision`'s.
"""

import argparse
import difflib
import logging
import math
import os
import re
import shlex
import signal
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .. import device
from .._os.argv import join_option_values
from .._os.elasticsettings import ElasticNodeSettings, MembershipSettings
from .._os.environment import JobEnvironment
from .._os.nodesettings import (
    OUTER_RULES,
    TIE_CODECS,
    CentreTie,
    NodeSettings,
    elastic_tie,
    flag_message,
    outer_rule_argument,
)
from .supervision import (  # noqa: F401
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Launch,
    Process,
    UsageError,
    make_private_dirs,
    open_private,
)

__all__ = ["main", "parse_args", "make_parser", "read_args", "check_args", "node_settings",
           "is_script", "find_scripts", "plan_devices", "visible_gpus", "find_gpus",
           "join_option_values"]

EPILOG = """\
any script: SCRIPT.py runs as each worker, with the words after -- as its arguments, and
the default controller (which serves until the workers are done) or --controller's:
  platoon-launcher -n 2 train.py -- --lr 20 --epochs 3

devices: without -D, every visible CUDA GPU gets a worker (with -n N, N workers take the
visible GPUs in turn, several may share one); with none, -n CPU workers run. Each worker
sees only its GPU (CUDA_VISIBLE_DEVICES) and learns its name from Worker.device.

script arguments: after --, each worker's; -c and -w take one string, which may start
with a dash:
  platoon-launcher examples/digits/digits -c "--no-baseline" -w "--lr 0.8"

exit codes:
  0    every process finished successfully
  1    a process failed (non-zero exit or killed), or the controller never became ready
  2    usage error (bad arguments, experiment files not found)
  130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM
"""

# --tie-compress's codecs and --tie-outer's rules (the node settings', which load no numpy)
TIE_CODECS, TIE_OUTER_RULES = TIE_CODECS, OUTER_RULES
TIE_FLAGS = ("tie_every_s", "tie_every_syncs", "tie_compress", "tie_outer", "tie_outer_lr",
             "tie_outer_momentum", "tie_beta")

# Options a --hosts job cannot honour, and why (each is refused rather than dropped).
NOT_WITH_HOSTS = [
    ("curve", "--curve", "the nodes' processes would run without authentication: platoon.mpi "
     "does not hand CURVE keys to the nodes yet"),
    ("restart", "--restart", "a failed worker aborts the whole MPI job; it cannot be replaced"),
    ("keep_going", "--keep-going", "a failed worker aborts the whole MPI job"),
    ("checkpoint_every_s", "--checkpoint-every-s", "node centres are not checkpointed during "
     "the job (node 0 saves the final, agreed one)"),
    ("resume", "--resume", "node centres cannot start from a checkpoint"),
    ("devices", "-D/--devices", "platoon.mpi runs -n workers per node and places none on "
     "devices"),
    ("control_port", "--control-port", "each node's controller takes a free port of its own"),
    ("data_port", "--data-port", "each node's controller takes a free port of its own"),
    ("status_every_s", "--status-every-s", "there is no status line: each node's progress "
     "is in LOG_DIR/mpiexec.log"),
]
# What an elastic job (--hosts ... --elastic) cannot do besides (--restart it can: a failed
# node is started again and rejoins), and why.
NOT_WITH_ELASTIC = [
    ("keep_going", "--keep-going", "a failed node never stops an elastic job's other nodes; "
     "--restart N starts it again"),
    ("tie_every_syncs", "--tie-every-syncs", "an elastic node's outer rounds are paced in "
     "seconds: use --tie-every-s"),
]
ELASTIC_FLAGS = ("lighthouse", "join", "secret_file", "min_nodes", "heartbeat_timeout_s")
# Defaults of the options above that are refused with --hosts (None in the parser, so that
# an option given explicitly can be told from its default).
DEFAULTS = {"restart": 0, "control_port": 0, "data_port": 0, "status_every_s": 5.0}


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _deprecated(new):
    """An argparse action for an old spelling of `new`: it still works, with a warning."""
    class Deprecated(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print("platoon-launcher: %s is deprecated; use %s" % (option_string, new),
                  file=sys.stderr)
            setattr(namespace, self.dest, values)
    return Deprecated


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError("%r is not a duration: give a number of seconds, 0 or "
                                         "more" % text)
    return value


def _port(text: str) -> int:
    """An argparse type: a tcp port, 1 to 65535, or 0 for a free one (the range the
    controller checks, `platoon._controller.config.check_port`, which loads numpy)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("%r is not a tcp port: give 1 to 65535, or 0 for a "
                                         "free one" % text)
    return value


def _duration(parser, new, old, help, default=None):
    """A duration flag in seconds, `new` ending in -s, and its deprecated spelling `old`."""
    dest = new.lstrip("-").replace("-", "_")
    parser.add_argument(new, type=_seconds, default=default, metavar="S", dest=dest, help=help)
    parser.add_argument(old, type=_seconds, dest=dest, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS, action=_deprecated(new))


# Options whose value is a command line of their own: it may start with a dash.
SCRIPT_ARGS_OPTIONS = ("-c", "--controller-args", "-w", "--worker-args")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that lists its shown options (`options`), to name the one a
    mistyped option was meant to be."""

    def __init__(self, **kwargs):
        self.options: List[str] = []  # (before argparse adds --help)
        super().__init__(**kwargs)

    def add_argument(self, *names, **kwargs):
        if kwargs.get("help") is not argparse.SUPPRESS:
            self.options += [name for name in names if name.startswith("--")]
        return super().add_argument(*names, **kwargs)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The launcher's options, read (`read_args`) then checked (`check_args`); exits with
    status 2 (argparse's usage error) on bad ones."""
    parser = make_parser()
    args = read_args(parser, argv)
    check_args(args, parser.error)
    return args


def make_parser() -> "_Parser":
    """The launcher's command line: its options, defaults and help."""
    parser = _Parser(
        prog="platoon-launcher", description=__doc__.split("\n\n")[0],
        usage="%(prog)s [options] SCRIPT.py [-- SCRIPT_ARGS ...]\n"
              "       %(prog)s [options] EXPERIMENT [-c ARGS] [-w ARGS]",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", metavar="SCRIPT.py | EXPERIMENT",
                        help="SCRIPT.py: runs it as each worker (its arguments after --), with "
                        "the default Controller or --controller's. EXPERIMENT, a path prefix: "
                        "runs EXPERIMENT_worker.py and, if it exists, EXPERIMENT_controller.py "
                        "(else the default Controller)")
    parser.add_argument("--controller", metavar="SCRIPT.py",
                        help="with SCRIPT.py: the controller script (default: the default "
                        "Controller, serving until the workers are done)")
    parser.add_argument("-D", "--devices", nargs="+", metavar="DEV",
                        help="devices, one worker each: cuda0 cuda1 ... or cpu")
    parser.add_argument("-n", "--workers", type=int, metavar="N",
                        help="workers: on CPUs when no GPU is visible (default 2), else "
                        "placed in turn on the visible GPUs (default one per GPU); with "
                        "--hosts, workers per host")
    parser.add_argument("-c", "--controller-args", default="", metavar="ARGS",
                        help="arguments for the controller script, as one string: "
                        '-c "--no-baseline"')
    parser.add_argument("-w", "--worker-args", default="", metavar="ARGS",
                        help="arguments for each worker script, as one string: "
                        '-w "--lr 0.8"')
    parser.add_argument("--log-dir", help="default: platoon-logs/EXPERIMENT/<timestamp>/")
    parser.add_argument("--control-port", type=_port, help="default: a free port")
    parser.add_argument("--data-port", type=_port, help="default: a free port")
    _duration(parser, "--ready-timeout-s", "--ready-timeout", default=120.0,
              help="seconds for the controller to start serving (default 120)")
    _duration(parser, "--finish-timeout-s", "--finish-timeout", default=60.0,
              help="seconds workers may run on after the controller finished (default 60); "
              "then they are stopped and the job fails")
    _duration(parser, "--stop-timeout-s", "--stop-timeout", default=5.0,
              help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    _duration(parser, "--status-every-s", "--status-every",
              help="seconds between status lines when the output is not a terminal "
              "(default 5); on a terminal the line refreshes twice a second")
    parser.add_argument("--restart", type=int, metavar="N",
                        help="replace up to N failed workers instead of stopping the job "
                        "(with --elastic: start up to N failed nodes, or its lighthouse, again)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a failed worker does not stop the job: the controller's "
                        "handle_worker_death decides")
    _duration(parser, "--checkpoint-every-s", "--checkpoint-every",
              help="snapshot the centre to LOG_DIR/centre.npz every S seconds "
              "(it is always written when the controller stops)")
    parser.add_argument("--resume", metavar="DIR",
                        help="start the centre from a checkpoint (a log directory or .npz)")
    parser.add_argument("--hosts", nargs="+", metavar="HOST",
                        help="one controller per host, as MPI ranks (mpiexec from "
                        "the mpi extra), each running -n workers; see README, Multi-node jobs")
    parser.add_argument("--elastic", action="store_true",
                        help="with --hosts: nodes that come and go (platoon.elastic): a "
                        "lighthouse, one node per host under an mpiexec of its own; a node "
                        "that dies ends alone, and --restart N starts it again (it rejoins, "
                        "healed from a live node); DiLoCo ties the node centres; see "
                        "docs/multi-node.md")
    parser.add_argument("--lighthouse", metavar="HOST:PORT",
                        help="with --elastic: where the job's lighthouse listens and the nodes "
                        "join it (default 127.0.0.1 when every host is this machine, else "
                        "this machine's hostname; port 0, the default, picks a free one)")
    parser.add_argument("--join", metavar="HOST:PORT",
                        help="with --elastic: start no lighthouse; the nodes join the running "
                        "one at HOST:PORT (give its job's --secret-file)")
    parser.add_argument("--secret-file", metavar="PATH",
                        help="with --elastic: the job's secret, at this path on every host "
                        "(default: a new one, 0600, in LOG_DIR/%s: on another host the log "
                        "directory must be shared, or give this)" % "elastic.secret")
    parser.add_argument("--min-nodes", type=int, metavar="M",
                        help="with --elastic: no quorum with fewer live nodes (default %d)"
                        % MembershipSettings.min_nodes)
    parser.add_argument("--heartbeat-timeout-s", type=_seconds, metavar="S",
                        help="with --elastic: a node silent this long is out of the next "
                        "quorum (default %g; 1 on a quiet network)"
                        % MembershipSettings.heartbeat_timeout_s)
    parser.add_argument("--tie-every-s", type=_seconds, metavar="S",
                        help="with --hosts: tie the node centres every S seconds (with "
                        "--elastic: default %s)" % elastic_tie().every_s)
    parser.add_argument("--tie-every-syncs", type=int, metavar="K",
                        help="with --hosts: tie the node centres every K syncs")
    parser.add_argument("--tie-compress", choices=TIE_CODECS, metavar="{%s}" % ",".join(TIE_CODECS),
                        help="with --hosts: how the node centres travel at a tie (default "
                        "float32, with --elastic %s; int8 and int4 send 3.9x and 7.8x fewer "
                        "bytes)" % elastic_tie().compress)
    parser.add_argument("--tie-outer", type=outer_rule_argument,
                        metavar="{easgd,diloco,MODULE:FACTORY}",
                        help="with --hosts: what a tie round does: easgd (each centre moves "
                        "toward the mean; the default without --elastic), diloco (an outer "
                        "Nesterov step; the default with --elastic) or your own (FACTORY(tie) "
                        "gives a platoon.node.outer.OuterRule, importable on every node)")
    parser.add_argument("--tie-outer-lr", type=float, metavar="LR",
                        help="with --hosts and --tie-outer diloco: the outer lr (default %g)"
                        % CentreTie.outer_lr)
    parser.add_argument("--tie-outer-momentum", type=float, metavar="MU",
                        help="with --hosts and --tie-outer diloco: the outer Nesterov momentum "
                        "(default %g)" % CentreTie.outer_momentum)
    parser.add_argument("--tie-beta", type=float, metavar="BETA",
                        help="with --hosts and --tie-outer easgd: how far each centre moves "
                        "toward the mean at a tie, (0, 1] (default %g)" % CentreTie.beta)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not show the workers' output here, each line prefixed "
                        "[workerN] (it is in LOG_DIR/workerN.log either way)")
    parser.add_argument("--curve", action="store_true",
                        help="authenticate every connection with CURVE keys made for this job "
                        "(written 0600 to LOG_DIR/curve_keys.json); not with --hosts")
    parser.add_argument("--log-level",
                        default=JobEnvironment.read("log_level").log_level or "INFO")
    return parser


def read_args(parser: "_Parser", argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """`argv` (default sys.argv[1:]) read by `parser`: the options, the worker script's
    arguments after --, -c and -w split as a shell would (`worker_argv`). Exits with status 2
    on words it cannot read (naming the option a typo was meant to be)."""
    words = join_option_values(sys.argv[1:] if argv is None else argv, SCRIPT_ARGS_OPTIONS)
    script_args = []
    if "--" in words:  # the worker script's arguments
        words, script_args = words[:words.index("--")], words[words.index("--") + 1:]
    args, unknown = parser.parse_known_args(words)
    if unknown:
        for word in unknown:
            close = difflib.get_close_matches(word.split("=")[0], parser.options, n=1,
                                              cutoff=0.75)
            if word.startswith("--") and close:  # a typo of the launcher's own option
                parser.error("unrecognized option %s: did you mean %s?" % (word, close[0]))
        parser.error("unrecognized arguments: %s (the worker script's arguments go after "
                     "--: platoon-launcher train.py -- --lr 20)" % " ".join(unknown))
    split = {}
    for flag, dest in (("-c/--controller-args", "controller_args"),
                       ("-w/--worker-args", "worker_args")):
        try:  # (the controller's arguments are split again when it starts)
            split[dest] = shlex.split(getattr(args, dest))
        except ValueError as exc:  # unbalanced quotes
            parser.error("%s %r: %s; quote it as a shell would: -c \"--name 'a b'\""
                         % (flag, getattr(args, dest), exc))
    args.worker_argv = split["worker_args"] + script_args
    return args


def check_args(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """Check the options `read_args` read, together, and fill in what depends on them: the
    defaults of options refused with --hosts, `workers` (and `workers_given`), and `node` (the
    `NodeSettings` handed to each node's runner with --hosts; None without). `error(message)`
    is called for the first problem and must not return (the parser's exits with status 2)."""
    if args.controller and not is_script(args.experiment):
        error("--controller goes with a SCRIPT.py (ending in .py); the EXPERIMENT form runs "
              "%s_controller.py" % args.experiment)
    check_elastic(args, error)
    if args.hosts:
        for dest, flag, why in NOT_WITH_HOSTS:
            if getattr(args, dest) not in (None, False) and not (
                    args.elastic and dest in ("restart", "status_every_s")):
                error("%s cannot be used with --hosts: %s" % (flag, why))
    else:
        for flag in TIE_FLAGS:
            if getattr(args, flag) is not None:
                error("--%s needs --hosts: it ties the centres of the nodes' controllers"
                      % flag.replace("_", "-"))
    for dest, default in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    args.workers_given = args.workers is not None  # an explicit -n is honoured on GPUs too
    if args.workers is None:
        args.workers = 2
    if args.workers < 1:
        error("-n must be at least 1")
    for dest in ("status_every_s", "checkpoint_every_s"):
        if getattr(args, dest) == 0:
            error("--%s must be more than 0" % dest.replace("_", "-"))
    outer = args.tie_outer or ("diloco" if args.elastic else "easgd")
    if (args.tie_outer_lr is not None or args.tie_outer_momentum is not None) \
            and outer == "easgd":
        error("--tie-outer-lr and --tie-outer-momentum go with --tie-outer diloco (or your own)")
    if args.tie_beta is not None and outer == "diloco":
        error("--tie-beta goes with --tie-outer easgd (or your own)")
    if args.restart < 0:
        error("--restart must be at least 0")
    if args.resume and not os.path.exists(args.resume):
        error("--resume %s: no such checkpoint" % args.resume)
    args.node = None
    if args.hosts:
        try:
            args.node = node_settings(args)
        except ValueError as exc:
            error(flag_message(exc))


def check_elastic(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """`check_args`' part for --elastic and its options: what an elastic job cannot do is
    refused, naming the flag and why; its lighthouse's settings are defaulted and checked
    where they are declared, in `args.membership` (a `MembershipSettings`;
    None without --elastic)."""
    given = [flag for flag in ELASTIC_FLAGS if getattr(args, flag) is not None]
    args.membership = None
    if not args.elastic:
        if given:
            error("--%s needs --elastic (with --hosts)" % given[0].replace("_", "-"))
        return
    if not args.hosts:
        error("--elastic needs --hosts: one node per host (give one host, or localhost "
              "several times, to try it on this machine)")
    for dest, flag, why in NOT_WITH_ELASTIC:
        if getattr(args, dest) not in (None, False):
            error("%s cannot be used with --elastic: %s" % (flag, why))
    if args.join:
        for flag in ("lighthouse", "min_nodes", "heartbeat_timeout_s"):
            if getattr(args, flag) is not None:
                error("--%s cannot be used with --join: it is the running lighthouse's "
                      "setting" % flag.replace("_", "-"))
        if not args.secret_file:
            error("--join needs --secret-file: the secret of the job whose lighthouse it "
                  "joins")
    for flag in ("lighthouse", "join"):
        address = getattr(args, flag)
        host, _, port = (address or "").rpartition(":")
        if address is not None and not (host and port.isdigit() and int(port) <= 65535
                                        and (flag == "lighthouse" or int(port) > 0)):
            error("--%s %s: give HOST:PORT%s" % (flag, address, " (port 0 picks a free one)"
                                                 if flag == "lighthouse" else ""))
    if args.secret_file and not os.path.isfile(args.secret_file):
        error("--secret-file %s: no such file (make one with python -m "
              "platoon.elastic.lighthouse --new-secret PATH, or leave it out for a new one)"
              % args.secret_file)
    try:
        args.membership = MembershipSettings(**{
            k: getattr(args, k) for k in ("min_nodes", "heartbeat_timeout_s")
            if getattr(args, k) is not None})
    except ValueError as exc:
        error(flag_message(exc, "--"))
    if args.min_nodes is not None and args.min_nodes > len(args.hosts):
        error("--min-nodes %d is more than the %d host(s): no quorum would ever form"
              % (args.min_nodes, len(args.hosts)))
    timeout_s = ElasticNodeSettings.tie_timeout_s  # (the launcher gives the node's default)
    if args.tie_every_s is not None and not args.tie_every_s < timeout_s:
        error("--tie-every-s must be less than %g s with --elastic (a round's timeout)"
              % timeout_s)


def node_settings(args: argparse.Namespace) -> NodeSettings:
    """What each node of a --hosts job runs, from the launcher's options (the controller comes
    later: `Launch.run_hosts`). The tie's settings are checked whenever one is given; the
    centres are tied when --tie-every-s or --tie-every-syncs is. Raises ValueError naming a bad
    setting."""
    given = {name: getattr(args, "tie_" + name) for name in ("compress", "outer", "outer_lr",
                                                             "outer_momentum", "beta")
             if getattr(args, "tie_" + name) is not None}
    pace = {"every_s": args.tie_every_s, "every_syncs": args.tie_every_syncs}
    tied = pace["every_s"] is not None or pace["every_syncs"] is not None
    tie: Optional[CentreTie]
    if getattr(args, "elastic", False):  # always tied: DiLoCo, paced in seconds
        tie = elastic_tie(**{k: v for k, v in pace.items() if v is not None}, **given)
        tied = True
    else:
        tie = CentreTie(**(pace if tied else {}), **given) if tied or given else None
    return NodeSettings(args.workers, controller_args=args.controller_args,
                        tie=tie if tied else None, ready_timeout_s=args.ready_timeout_s,
                        finish_timeout_s=args.finish_timeout_s)


def is_script(target: str) -> bool:
    """Whether the launcher's first argument names a worker script (SCRIPT.py), not an
    EXPERIMENT prefix."""
    return target.endswith(".py")


def find_scripts(experiment, controller=None):
    """(worker script, controller script or None) for SCRIPT.py (with `controller`, the
    --controller script, if any) or an EXPERIMENT prefix. Raises UsageError for a script
    that does not exist."""
    if is_script(experiment):
        for script in (experiment, controller):
            if script is not None and not os.path.isfile(script):
                raise UsageError("no script %s" % script)
        return experiment, controller
    worker = experiment + "_worker.py"
    if not os.path.isfile(worker):
        raise UsageError("no worker script %s; the launcher runs EXPERIMENT_worker.py (and "
                         "EXPERIMENT_controller.py if present)" % worker)
    controller = experiment + "_controller.py"
    return worker, controller if os.path.isfile(controller) else None


def find_gpus() -> Tuple[List[str], List[str]]:
    """`platoon.device.find_gpus` (the GPUs this process may use, and what was looked at),
    its refusals as the launcher's UsageError."""
    try:
        return device.find_gpus()
    except device.VisibleDevicesError as exc:
        raise UsageError(str(exc)) from None


def visible_gpus() -> List[str]:
    """Indices of the CUDA GPUs this process may use (empty without GPUs or drivers)."""
    return find_gpus()[0]


def plan_devices(args, say) -> List[str]:
    """The device of each worker: 'cudaK' or 'cpu'. Without -D: one worker per visible GPU,
    or with an explicit -n, N workers taking the visible GPUs in turn (several may share one);
    -n CPU workers when no GPU is visible. Says what it planned. Raises UsageError for a device
    that is not "cpu" or "cudaK", a GPU this machine does not have (or hides), or an -n that
    disagrees with -D."""
    if args.devices:
        for dev in args.devices:
            if dev != "cpu" and not re.fullmatch(r"cuda\d+", dev):
                raise UsageError("unknown device %r; use cuda0, cuda1, ... or cpu" % dev)
        if getattr(args, "workers_given", False) and args.workers != len(args.devices):
            raise UsageError(
                "-n %d and -D %s disagree: -D starts one worker per device it names; leave "
                "out -n, or name a GPU once per worker (-D cuda0 cuda0)"
                % (args.workers, " ".join(args.devices)))
        wanted = [dev for dev in args.devices if dev != "cpu"]
        if wanted:
            gpus, seen = find_gpus()
            missing = [dev for dev in wanted if dev[len("cuda"):] not in gpus]
            if missing:
                raise UsageError(
                    "-D %s: no such GPU visible here (GPUs found: %s); looked at %s. Use -D "
                    "cpu, or leave out -D to start -n CPU workers" % (
                        " ".join(missing), ", ".join("cuda" + g for g in gpus) or "none",
                        ", ".join(seen)))
        return list(args.devices)
    gpus = visible_gpus()
    if not gpus:
        say("no CUDA GPU visible: starting %d CPU worker(s) (-n to change, -D to choose "
            "devices)" % args.workers)
        return ["cpu"] * args.workers
    if getattr(args, "workers_given", False):
        devices = device.in_turn(args.workers, gpus)
        how = "-n %d on %d visible GPU(s)" % (args.workers, len(gpus))
    else:
        devices = ["cuda%s" % g for g in gpus]
        how = "one per visible GPU; -n N to start N"
    say("planned %d worker(s), %s: %s" % (len(devices), how, ", ".join(
        "worker%d on %s" % (i, dev) for i, dev in enumerate(devices))))
    return devices


def run(launch: Launch) -> int:
    """Run `launch`'s job on this machine or, with --hosts, across hosts; its exit code."""
    args = launch.args
    worker_script, controller_script = find_scripts(args.experiment, args.controller)
    if controller_script is None:
        launch.say("%s: using the default Controller" % (
            "no --controller" if is_script(args.experiment)
            else "no %s_controller.py" % os.path.basename(args.experiment)))
    if args.elastic:
        from .elastic import ElasticLaunch
        assert isinstance(launch, ElasticLaunch), "main makes an ElasticLaunch for --elastic"
        return launch.run_elastic(worker_script, controller_script)
    if args.hosts:
        return launch.run_hosts(worker_script, controller_script)
    return launch.run(worker_script, controller_script, plan_devices(args, launch.say))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``platoon-launcher``: run a job; returns the exit code (see EPILOG).

    The first SIGINT or SIGTERM stops the job and sets the exit code (128 + its number);
    signals after it are ignored, so that two at once make one orderly stop.
    """
    received: List[int] = []

    def interrupt(signum, frame):
        if not received:
            received.append(signum)
            raise Interrupted(signum)

    signal.signal(signal.SIGINT, interrupt)  # first of all: start-up is interruptible too
    signal.signal(signal.SIGTERM, interrupt)
    launch: Optional[Launch] = None
    try:
        try:
            args = parse_args(argv)
            logging.basicConfig(level=args.log_level.upper(),
                                format="platoon-launcher: %(message)s")
            if args.elastic:
                from .elastic import ElasticLaunch
                launch = ElasticLaunch(args)
            else:
                launch = Launch(args)
            return run(launch)
        except UsageError as exc:
            print("platoon-launcher: %s" % exc, file=sys.stderr)
            return EXIT_USAGE
        finally:
            if launch is not None and launch.running():
                launch.stop_all()
    except Interrupted as exc:
        message = "%s received: stopping the job" % exc
        if launch is None:
            print("platoon-launcher: %s" % message, file=sys.stderr, flush=True)
        else:
            launch.say(message)
            launch.stop_all()
        return 128 + exc.signum
    finally:
        if launch is not None:
            launch.make_status_private()
            if launch.started():  # the job started: how it went, what it left
                launch.echo_output(final=True)
                for line in launch.summary():
                    launch.say(line)
        # Python restores the default actions as it exits: a signal arriving then (a loaded
        # machine can delay the second of two that long) would kill the launcher and replace
        # its exit code. Blocked, it stays pending until the process is gone. (The launcher
        # has no other thread, and starts no child from here on.)
        received.append(0)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    sys.exit(main())
