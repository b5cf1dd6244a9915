"""The settings of a node of a multi-node job, declared, defaulted and checked once: its tie
(`CentreTie`) and the rest of the node (`NodeSettings`, which holds the tie); an elastic
node's defaults (`elastic_tie`, `elastic_node`).

The launcher (``platoon-launcher --hosts``) builds them from its command line and hands them
whole to each node's runner (``python -m platoon.mpi``) as the one argv that crosses
``mpiexec``, made by `NodeSettings.to_argv` (pinned by a golden file in the tests); the runner
reads it back with `NodeSettings.add_arguments` and `NodeSettings.from_arguments`. A setting
left at its default is not written: the runner takes the same default, from here. An elastic
job's processes' settings (the lighthouse's, an elastic node's, which holds a NodeSettings)
are `platoon._os.elasticsettings`'.

The standard library only (the launcher loads no numpy): `platoon.node.tie` re-exports
`CentreTie`, and `platoon.node.compress.CODECS` holds the codecs `TIE_CODECS` names.
"""

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from .argv import word
from .checks import check_count, check_seconds

TIE_CODECS = ("float32", "int8", "int4")  # platoon.node.compress.CODECS (a test holds them equal)
OUTER_RULES = ("easgd", "diloco")
# a user's own outer rule: ``MODULE:FACTORY``, FACTORY(tie) making a `platoon.node.outer.OuterRule`
_OWN_RULE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_outer_rule(name: str) -> bool:
    """Whether `name` names an outer rule: one of `OUTER_RULES`, or a user's own as
    ``MODULE:FACTORY`` (imported on every node when its tie starts)."""
    return name in OUTER_RULES or bool(_OWN_RULE.match(str(name)))


def outer_rule_argument(text: str) -> str:
    """argparse's type for ``--tie-outer``: `text`, if `is_outer_rule`."""
    if not is_outer_rule(text):
        raise argparse.ArgumentTypeError(
            "%r is no outer rule: give easgd, diloco or MODULE:FACTORY (your own, a callable "
            "taking the CentreTie and returning a platoon.node.outer.OuterRule)" % text)
    return text


@dataclass
class CentreTie:
    """How the node centres of a multi-node job are tied.

    A tie round comes every `every_s` seconds (counted from the start of the
    last round; a round that took longer is followed at once, so rounds come
    as often as the link carries them and never queue), or
    once every node's workers have made `every_syncs` syncs since the last
    round (counted in the centre's shared memory, or from `Worker.report()`
    where that is larger), whichever is set (both: whichever comes first on
    each node). A round runs in the controller's tie thread against a
    snapshot of the node centre; the workers sync with their centre
    meanwhile, and what they add during the round is kept.

    `outer` is what a round does with the nodes' shared anchor (the first
    round makes it the mean of the centres, losslessly; centres already equal,
    as from one seed, are not sent):

    - ``"easgd"`` (hierarchical EASGD): the anchor becomes the nodes' mean
      centre, and each centre moves toward it, ``c += beta * (anchor - c)``;
      beta=1 makes the centres equal.
    - ``"diloco"`` (DiLoCo's outer step): every node's pseudo-gradient is how
      far its centre moved from the anchor; the nodes average them and every
      node applies the same outer SGD step with Nesterov momentum to the
      anchor, ``u = mu*u + d; anchor += outer_lr * (d + mu*u)`` (d: the mean
      move, -gradient), then sets its centre to the new anchor plus what its
      workers added since the snapshot. outer_lr=1, momentum 0 is plain
      averaging.

    Rounds go on while any node trains. A node whose workers are done stops
    moving: its centre enters the next round once (handed over), then sits
    the rounds out. Once every node is done and handed over, every centre
    becomes the anchor (the final agreement), the same bits on every node:
    what each controller then holds and checkpoints. `platoon.node.tie` runs
    the rounds, in a fixed world and in an elastic job alike.

    `compress` ("float32", "int8" or "int4", see `platoon.node.compress`) is
    how a round's moves travel: each node sends how far its centre moved from
    the anchor, with error feedback (what compression dropped goes out with
    its next message), so the error does not grow with the rounds; every node
    decodes and adds the messages alike, so the result is the same bits on
    every node. Raises ValueError for bad values, at
    construction and when a setting is changed afterwards: every_s a finite number of
    seconds more than 0 and at most 1e9 (or None with every_syncs), every_syncs an integer
    >= 1, beta in (0, 1], outer_lr in (0, 10], outer_momentum in [0, 1).
    """

    every_s: Optional[float] = 1.0
    beta: float = 0.5
    every_syncs: Optional[int] = None
    compress: str = "float32"
    outer: str = "easgd"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self):
        if self.every_s is None and self.every_syncs is None:
            raise ValueError("CentreTie needs every_s (seconds) or every_syncs (syncs per node)")
        check_seconds("CentreTie every_s", self.every_s, none="when every_syncs is set")
        if self.every_syncs is not None and (not isinstance(self.every_syncs, int)
                                             or self.every_syncs < 1):
            raise ValueError("CentreTie every_syncs must be an integer >= 1, got %r"
                             % (self.every_syncs,))
        if not 0 < self.beta <= 1:
            raise ValueError("CentreTie beta must be in (0, 1], got %r" % self.beta)
        if self.compress not in TIE_CODECS:
            raise ValueError("CentreTie compress must be one of %s, got %r"
                             % (", ".join(TIE_CODECS), self.compress))
        if not is_outer_rule(self.outer):
            raise ValueError("CentreTie outer must be one of %s or MODULE:FACTORY (your own "
                             "outer rule), got %r" % (", ".join(OUTER_RULES), self.outer))
        if not 0 < self.outer_lr <= 10:
            raise ValueError("CentreTie outer_lr must be in (0, 10], got %r" % self.outer_lr)
        if not 0 <= self.outer_momentum < 1:
            raise ValueError("CentreTie outer_momentum must be in [0, 1), got %r"
                             % self.outer_momentum)
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, name, value):
        """A setting changed after construction (the tie thread reads them at each round) is
        checked as at construction: ValueError, and the old value stays."""
        if name in _FIELDS and getattr(self, "_checked", False):
            dataclasses.replace(self, **{name: value})
        object.__setattr__(self, name, value)

    def agreed(self):
        """The settings every node must share (`NodeLink` checks them at start): those that
        decide what a round's messages are and what is done with them. The pace
        (`every_s`, `every_syncs`) is each node's own."""
        return {"compress": self.compress, "outer": self.outer, "beta": self.beta,
                "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum}


_FIELDS = frozenset(f.name for f in dataclasses.fields(CentreTie))

# An elastic node's tie where its command line gives none of these settings (DiLoCo's outer
# step unless --tie-outer easgd): ``python -m platoon.elastic.node`` and
# ``platoon-launcher --elastic`` alike.
ELASTIC_TIE = {"every_s": 3.0, "compress": "int8", "outer": "diloco"}
# An elastic node's exit status when the job's other nodes refused it at the door (a tie
# setting or its model differs): ``platoon-launcher --elastic`` does not start it again.
EXIT_REFUSED = 3


def elastic_tie(**given) -> CentreTie:
    """The tie of an elastic job's nodes: `ELASTIC_TIE` updated with the settings `given`
    (CentreTie's keywords). Raises ValueError naming a bad setting."""
    return CentreTie(**dict(ELASTIC_TIE, **given))


def flag_message(exc: ValueError, prefix: str = "--tie-",
                 flags: Optional[Dict[str, str]] = None) -> str:
    """A settings object's refusal, naming the command-line flag of the setting for a
    parser's error: ``CentreTie outer_lr must ...`` -> ``--tie-outer-lr must ...`` (a
    message that names no class: `prefix` and the setting), ``NodeSettings workers must
    ...`` -> ``--workers must ...`` (any other class of settings: ``--`` and the setting),
    or the flag `flags` gives for the setting's name."""
    text = str(exc)
    match = re.match(r"(?:([A-Z]\w*) )?([a-z_]+) (must|needs)", text)
    if match is None:
        return text
    owner, name = match.group(1), match.group(2)
    if flags and name in flags:
        flag = flags[name]
    else:
        flag = (prefix if owner in (None, "CentreTie") else "--") + name.replace("_", "-")
    return flag + text[match.end(2):]


@dataclass(frozen=True)
class NodeSettings:
    """What a node of a multi-node job runs (``python -m platoon.mpi``; see `run_node`).

    workers: the node's workers (at least 1). controller: a controller script (``file.py``) or
    ``module:Class`` / ``file.py:Class`` (None: platoon.Controller); controller_args: its
    arguments, one shell-quoted string. host: the interface the controller binds. tie: how the
    node centres are tied (None: not at all). serve_timeout_s: how long the controller serves
    (None: until its workers are done); ready_timeout_s: for it to start serving;
    finish_timeout_s: how long workers may run on after it finished (then they are stopped).
    Raises ValueError naming a bad setting.
    """

    workers: int
    controller: Optional[str] = None
    controller_args: str = ""
    host: str = "127.0.0.1"
    tie: Optional[CentreTie] = None
    serve_timeout_s: Optional[float] = None
    ready_timeout_s: float = 120.0
    finish_timeout_s: float = 30.0

    def __post_init__(self):
        check_count("NodeSettings workers", self.workers, 1)
        check_seconds("NodeSettings serve_timeout_s", self.serve_timeout_s,
                      none="to serve until the workers are done")
        check_seconds("NodeSettings ready_timeout_s", self.ready_timeout_s, zero=True)
        check_seconds("NodeSettings finish_timeout_s", self.finish_timeout_s, zero=True)
        if self.tie is not None and not isinstance(self.tie, CentreTie):
            raise ValueError("NodeSettings tie must be a CentreTie or None, got %r" % (self.tie,))

    def to_argv(self, defaults: Optional["NodeSettings"] = None) -> List[str]:
        """The node runner's options for these settings (the worker command goes after them,
        behind ``--``): ``--workers`` and every setting that differs from `defaults` (the
        node the reader takes where an option is not given: NodeSettings' own defaults, or an
        elastic node's, `elastic_node()`), in the order of the fields; a tie as
        ``--tie-every-s`` and/or ``--tie-every-syncs`` (whichever it has) and its other
        settings that differ from the defaults' tie (or CentreTie's)."""
        argv = ["--workers", str(self.workers)]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default if defaults is None else getattr(defaults, f.name)
            if f.name in ("workers", "tie") or value == default:
                continue
            argv += ["--" + f.name.replace("_", "-"), word(value)]
        tie = self.tie
        tie_defaults = None if defaults is None else defaults.tie
        if tie is not None:
            for f in dataclasses.fields(tie):
                value = getattr(tie, f.name)
                pace = f.name in ("every_s", "every_syncs")
                default = f.default if tie_defaults is None else getattr(tie_defaults, f.name)
                if (pace and value is None) or (not pace and value == default):
                    continue
                argv += ["--tie-" + f.name.replace("_", "-"), word(value)]
        return argv

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, defaults: Optional["NodeSettings"] = None,
                      host_help: Optional[str] = None) -> None:
        """The node runner's options (what `to_argv` writes) on `parser`; a setting not given
        is absent from the parsed namespace, and `from_arguments` takes its default. With
        `defaults` (the reader's node where an option is not given; its help names them),
        ``--workers`` may be left out; where they hold a tie, the node is always tied, paced
        in seconds (an elastic node's: no ``--tie-every-syncs``). `host_help`: what
        ``--host`` means to this reader (default: the interface its controller binds)."""
        absent = argparse.SUPPRESS
        add = parser.add_argument
        node = NodeSettings(1) if defaults is None else defaults
        tie = CentreTie() if node.tie is None else node.tie
        if defaults is None:
            add("--workers", type=int, required=True, help="workers on each node")
        else:
            add("--workers", type=int, default=absent,
                help="workers on this node (default %d)" % defaults.workers)
        add("--controller", default=absent,
            help="controller script file.py (run as __main__, like EXPERIMENT_controller.py), "
                 "or module:Class or file.py:Class (created and served); default "
                 "platoon.Controller")
        add("--controller-args", default=absent,
            help="arguments of a controller script (one shell-quoted string, which may start "
                 'with a dash: --controller-args "--steps=400")')
        add("--host", default=absent,
            help=host_help or "interface the controller binds (default %s)" % node.host)
        if node.tie is None:
            add("--tie-every-s", type=float, default=absent,
                help="tie the node centres every so many seconds")
            add("--tie-every-syncs", type=int, default=absent,
                help="tie the node centres once every node's workers have made so many syncs")
        else:
            add("--tie-every-s", type=float, default=absent,
                help="an outer round every so many seconds (default %s)" % tie.every_s)
        add("--tie-beta", type=float, default=absent,
            help="easgd: how far each centre moves toward the mean at a tie, (0, 1] "
                 "(default %g)" % tie.beta)
        add("--tie-compress", choices=TIE_CODECS, default=absent,
            help="how the centres travel at a tie: float32, int8 or int4 (per-block scales, "
                 "3.9x or 7.8x fewer bytes; default %s)" % tie.compress)
        add("--tie-outer", type=outer_rule_argument, default=absent,
            metavar="{easgd,diloco,MODULE:FACTORY}",
            help="what a tie round does: easgd (each centre moves toward the mean), diloco "
                 "(an outer Nesterov step on the nodes' mean pseudo-gradient) or your own "
                 "(FACTORY(tie) gives a platoon.node.outer.OuterRule); default %s" % tie.outer)
        add("--tie-outer-lr", type=float, default=absent,
            help="diloco: the outer learning rate (default %g)" % tie.outer_lr)
        add("--tie-outer-momentum", type=float, default=absent,
            help="diloco: the outer Nesterov momentum (default %g)" % tie.outer_momentum)
        add("--serve-timeout-s", type=float, default=absent,
            help="seconds the controller serves (default: until its workers are done)")
        add("--ready-timeout-s", type=float, default=absent,
            help="seconds for the controller to start serving (default %g)"
                 % node.ready_timeout_s)
        add("--finish-timeout-s", type=float, default=absent,
            help="seconds workers may run on after the controller finished (default %g); "
                 "then they are stopped" % node.finish_timeout_s)

    @classmethod
    def from_arguments(cls, args: argparse.Namespace,
                       defaults: Optional["NodeSettings"] = None) -> "NodeSettings":
        """The settings a namespace of `add_arguments`' options holds (other options in it
        are ignored), `defaults` (or the class's) where one is absent; a tie when
        ``--tie-every-s`` or ``--tie-every-syncs`` was given, or `defaults` hold one (then
        updated with the tie options given). Raises ValueError naming a bad setting
        (`flag_message` names its flag)."""
        given = vars(args)
        tie_given = {f.name: given["tie_" + f.name] for f in dataclasses.fields(CentreTie)
                     if "tie_" + f.name in given}
        tie = None
        if defaults is not None and defaults.tie is not None:
            tie = dataclasses.replace(defaults.tie, **tie_given)
        elif "every_s" in tie_given or "every_syncs" in tie_given:
            tie = CentreTie(tie_given.pop("every_s", None), **tie_given)
        node = {f.name: given[f.name] for f in dataclasses.fields(cls)
                if f.name != "tie" and f.name in given}
        if defaults is None:
            return cls(tie=tie, **node)
        return dataclasses.replace(defaults, tie=tie, **node)


def elastic_node() -> NodeSettings:
    """An elastic node's settings where its command line gives none: one worker, the
    elastic tie (`elastic_tie()`), NodeSettings' other defaults."""
    return NodeSettings(1, tie=elastic_tie())
