"""Command-line options of a controller script, as the original Platoon had them
(`Controller.default_parser`, `Controller.default_arguments`; also importable from
`platoon.compat.controller_args`)."""

import argparse
from typing import Any, Dict

from .._os.environment import JobEnvironment


def default_parser() -> argparse.ArgumentParser:
    """An argparse parser for a controller script, as the original Platoon had: add your
    own options, then pass `default_arguments(args)` to the Controller.

    It takes `--control-port`, `--data-port`, `--data-hwm`, `--workers` (-nw) and, for old
    command lines, an optional experiment name, `-D` and `-w` (the launcher's business now:
    accepted and ignored).
    """
    parser = argparse.ArgumentParser(description="A platoon controller.")
    parser.add_argument("experiment_name", nargs="?", help="ignored (the launcher's)")
    parser.add_argument("--control-port", type=int, default=None,
                        help="default: the launcher's, else 5567")
    parser.add_argument("--data-port", type=int, default=None,
                        help="bind the minibatch socket on this port")
    parser.add_argument("--data-hwm", type=int, default=10,
                        help="minibatches queued on the data socket (default 10)")
    parser.add_argument("-nw", "--workers", type=int, default=None, dest="workers",
                        help="how many workers the job has (num_workers)")
    parser.add_argument("-D", "--devices", nargs="+", default=[], help="ignored")
    parser.add_argument("-w", "--worker-args", default=None, help="ignored")
    return parser


def default_arguments(args: argparse.Namespace) -> Dict[str, Any]:
    """Controller keyword arguments from `default_parser().parse_args()`."""
    env = JobEnvironment.read()
    port = args.control_port if args.control_port is not None else (env.control_port or 5567)
    kwargs = {"control_port": port}
    if getattr(args, "workers", None) is not None:
        kwargs["num_workers"] = args.workers
    if getattr(args, "data_port", None) is not None:
        kwargs["data_port"] = args.data_port
    return kwargs
