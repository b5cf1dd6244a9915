"""The settings of an elastic job's processes, declared, defaulted and checked once, each with
the command line it crosses to its process: the lighthouse's (`LighthouseSettings`: its
membership rule, `MembershipSettings`, where it binds, what it serves one source, `Limits`)
and an elastic node's (`ElasticNodeSettings`: the lighthouse it joins, its name and slot, the
bounds of its rounds, and its node, a `NodeSettings` with the elastic node's defaults).

``platoon-launcher --elastic`` builds them and makes each process's argv with `to_argv`
(pinned by golden files in the tests); ``python -m platoon.elastic.lighthouse`` and
``python -m platoon.elastic.node`` read it back with `add_arguments` and `from_arguments`. A
setting left at its default is not written: the reader takes the same default, from here.
Each process tells its launcher how it is doing through the status file its settings name
(`status_file`; the keys: `platoon._os.statusfile`).

The standard library only (the launcher loads no elastic module): `platoon.elastic`
re-exports `MembershipSettings`, and `platoon.elastic.lighthouse` `Limits`.
"""

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .argv import word
from .checks import check_count, check_seconds
from .nodesettings import CentreTie, NodeSettings, elastic_node, flag_message

FINAL_TIMEOUT_S = 120.0  # a done node's wait for a round of its group (then it gives up)
ELASTIC_HOST_HELP = (
    "the address at which the other nodes reach this node's data plane: its store listens "
    "there and gloo binds it (default 127.0.0.1, which other machines cannot reach: give an "
    "address they can; the store and gloo accept whoever reaches them: run the data plane on "
    "a trusted network or behind a firewall; the controller serves its workers on 127.0.0.1)")


@dataclass(frozen=True)
class MembershipSettings:
    """The lighthouse's rule. min_nodes: no quorum with fewer live nodes.
    heartbeat_timeout_s: a node silent this long is out of the next quorum.
    join_grace_s: once the live nodes differ from the quorum's, wait this long for more
    joiners (or leavers) before issuing the next quorum; joiners to a running quorum (its
    members all live) wait only until that quorum is this old (`Membership.tick`)."""

    min_nodes: int = 1
    heartbeat_timeout_s: float = 5.0
    join_grace_s: float = 0.3

    def __post_init__(self):
        if not (isinstance(self.min_nodes, int) and self.min_nodes >= 1):
            raise ValueError("min_nodes must be an integer >= 1, got %r" % (self.min_nodes,))
        if not self.heartbeat_timeout_s > 0:
            raise ValueError("heartbeat_timeout_s must be > 0 seconds, got %r"
                             % (self.heartbeat_timeout_s,))
        if not self.join_grace_s >= 0:
            raise ValueError("join_grace_s must be >= 0 seconds, got %r" % (self.join_grace_s,))


@dataclass(frozen=True)
class Limits:
    """What the lighthouse serves one source address (a host: a stranger's, or several
    nodes'): at most `connections_per_source` connections at once (each node holds one;
    give more when many nodes share one address, 0 for no cap), and at most
    `refusals_per_source` replies to requests without the job's secret per `log_period_s`
    seconds, in which each source's refusals make one log line, with a count. And what all
    its nodes send it: about `heartbeats_per_s` heartbeats a second (its replies ask the nodes
    to heartbeat no more often than every live nodes / `heartbeats_per_s` seconds, within a
    fifth of the heartbeat timeout: `platoon.elastic.lighthouse.pace_s`; the default keeps up
    to 200 nodes at their own 0.1 s). Raises ValueError naming a bad setting."""

    connections_per_source: int = 64
    refusals_per_source: int = 10
    log_period_s: float = 10.0
    heartbeats_per_s: int = 2000

    def __post_init__(self):
        check_count("Limits connections_per_source", self.connections_per_source)
        check_count("Limits refusals_per_source", self.refusals_per_source)
        check_seconds("Limits log_period_s", self.log_period_s)
        check_count("Limits heartbeats_per_s", self.heartbeats_per_s, 1)


# The lighthouse's options: (flag, the part of LighthouseSettings that holds the setting
# (None: itself), the setting, type, metavar, help ({default}: its default))
_LIGHTHOUSE_OPTIONS = (
    ("--min-nodes", "membership", "min_nodes", int, "M",
     "no quorum with fewer live nodes (default {default})"),
    ("--heartbeat-timeout-s", "membership", "heartbeat_timeout_s", float, "S",
     "a node silent this many seconds is out of the next quorum (default {default:g}; 1 for "
     "fast recovery on a quiet network; a node another reports gone, its data plane closed "
     "as a round broke or a group waited for it, is out after 1 s of silence)"),
    ("--join-grace-s", "membership", "join_grace_s", float, "S",
     "wait this long after a change for more joiners or leavers (joiners to a running "
     "quorum: until it is this old) (default {default:g})"),
    ("--bind", None, "bind", str, "HOST:PORT",
     "where nodes reach it (default {default}; port 0 picks one)"),
    ("--secret-file", None, "secret_file", str, "PATH",
     "the job's secret (default: $PLATOON_ELASTIC_SECRET_FILE)"),
    ("--max-connections-per-source", "limits", "connections_per_source", int, "N",
     "serve at most N connections from one source address (default {default}; each node "
     "holds one: raise it when more nodes share an address; 0: no cap)"),
    ("--max-refusals-per-source", "limits", "refusals_per_source", int, "N",
     "answer at most N requests without the job's secret from one source address per "
     "--log-period-s (default {default})"),
    ("--log-period-s", "limits", "log_period_s", float, "S",
     "each source's refusals make one log line per S seconds (default {default:g})"),
    ("--max-heartbeats-per-s", "limits", "heartbeats_per_s", int, "N",
     "ask the nodes to heartbeat no more often than every live nodes / N seconds (never "
     "more than a fifth of --heartbeat-timeout-s; a node's own interval when longer): about "
     "N heartbeats a second in all (default {default}: up to 200 nodes keep their 0.1 s; "
     "with more, a quorum change reaches the members up to one such pace later)"),
    ("--status-file", None, "status_file", str, "PATH",
     "write the lighthouse's status (its address, latest quorum and what each node last "
     "told it, JSON) to PATH, atomically, as it starts, at each new quorum, as the nodes' "
     "statuses change and as it ends (platoon-launcher --elastic reads it)"),
)


@dataclass(frozen=True)
class LighthouseSettings:
    """What the lighthouse of an elastic job runs (``python -m platoon.elastic.lighthouse``):
    its membership rule, where it binds ("HOST:PORT"; port 0 picks one), the job's secret
    file (None: $PLATOON_ELASTIC_SECRET_FILE), what it serves one source (`limits`), and
    where it writes its status file (None: nowhere). Raises ValueError naming a bad setting."""

    membership: MembershipSettings = field(default_factory=MembershipSettings)
    bind: str = "127.0.0.1:29510"
    secret_file: Optional[str] = None
    limits: Limits = field(default_factory=Limits)
    status_file: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.membership, MembershipSettings):
            raise ValueError("LighthouseSettings: membership must be a MembershipSettings, "
                             "got %r" % (self.membership,))
        if not isinstance(self.limits, Limits):
            raise ValueError("LighthouseSettings: limits must be a Limits, got %r"
                             % (self.limits,))
        _check_address("LighthouseSettings bind", self.bind, zero=True)

    def to_argv(self) -> List[str]:
        """The lighthouse's options for these settings: each that is not its default."""
        argv: List[str] = []
        default = LighthouseSettings()
        for flag, part, name, _, _, _ in _LIGHTHOUSE_OPTIONS:
            value = _setting(self, part, name)
            if value != _setting(default, part, name):
                argv += [flag, word(value)]
        return argv

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The lighthouse's options (what `to_argv` writes) on `parser`; a setting not given
        is absent from the parsed namespace, and `from_arguments` takes its default."""
        default = LighthouseSettings()
        for flag, part, name, kind, metavar, text in _LIGHTHOUSE_OPTIONS:
            parser.add_argument(flag, type=kind, metavar=metavar, default=argparse.SUPPRESS,
                                help=text.format(default=_setting(default, part, name)))

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> "LighthouseSettings":
        """The settings a namespace of `add_arguments`' options holds (other options in it
        are ignored). Raises ValueError naming the flag of a bad setting."""
        given = vars(args)
        parts: dict = {"membership": {}, "limits": {}, None: {}}
        for flag, part, name, _, _, _ in _LIGHTHOUSE_OPTIONS:
            dest = flag[2:].replace("-", "_")
            if dest in given:
                parts[part][name] = given[dest]
        flags = {name: flag for flag, _, name, _, _, _ in _LIGHTHOUSE_OPTIONS}
        try:
            return cls(membership=MembershipSettings(**parts["membership"]),
                       limits=Limits(**parts["limits"]), **parts[None])
        except ValueError as exc:
            raise ValueError(flag_message(exc, "--", flags)) from None


@dataclass(frozen=True)
class ElasticNodeSettings:
    """What a node of an elastic job runs (``python -m platoon.elastic.node``): it joins the
    lighthouse at `join` ("HOST:PORT") as `name` (its stable name: a restarted node gives the
    same), with the job's secret file (None: $PLATOON_ELASTIC_SECRET_FILE); `node`: its
    workers, controller, data-plane address (`host`), tie and timeouts (default
    `elastic_node()`: one worker, the elastic tie; always tied, paced in seconds); `slot`
    (I, N): its place among N node slots, by which its workers' data is split (None: its
    own); `tie_timeout_s`: a round's collectives wait at most this long for a silent member
    (more than the tie's every_s); `final_timeout_s`: a node whose workers are done waits
    this long without a round for the final one, then keeps its own centre (more than
    tie_timeout_s); `status_file`: where it writes its status (None: nowhere). Raises
    ValueError naming a bad setting."""

    join: str
    name: str
    node: NodeSettings = field(default_factory=elastic_node)
    secret_file: Optional[str] = None
    slot: Optional[Tuple[int, int]] = None
    tie_timeout_s: float = 30.0
    final_timeout_s: float = FINAL_TIMEOUT_S
    status_file: Optional[str] = None

    def __post_init__(self):
        _check_address("ElasticNodeSettings join", self.join)
        if not (isinstance(self.name, str) and self.name):
            raise ValueError("ElasticNodeSettings name must be a non-empty string, got %r"
                             % (self.name,))
        node = self.node
        if not isinstance(node, NodeSettings) or node.tie is None or node.tie.every_s is None:
            raise ValueError("ElasticNodeSettings: node must be a NodeSettings whose tie has "
                             "every_s (an elastic node's rounds come every so many seconds), "
                             "got %r" % (node,))
        if self.slot is not None:
            slot = tuple(self.slot)
            if not (len(slot) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                           for x in slot) and 0 <= slot[0] < slot[1]):
                raise ValueError("ElasticNodeSettings slot must be I of N node slots, "
                                 "0 <= I < N, got %r" % (self.slot,))
            object.__setattr__(self, "slot", slot)
        check_seconds("ElasticNodeSettings tie_timeout_s", self.tie_timeout_s)
        check_seconds("ElasticNodeSettings final_timeout_s", self.final_timeout_s)
        if not self.tie_timeout_s > node.tie.every_s:
            raise ValueError("ElasticNodeSettings tie_timeout_s must be more than the tie's "
                             "every_s (%g s), got %r" % (node.tie.every_s, self.tie_timeout_s))
        if not self.final_timeout_s > self.tie_timeout_s:
            raise ValueError("ElasticNodeSettings final_timeout_s must be more than "
                             "tie_timeout_s (%g s), got %r"
                             % (self.tie_timeout_s, self.final_timeout_s))

    @property
    def tie(self) -> CentreTie:
        """The node's tie (an elastic node always has one)."""
        assert self.node.tie is not None  # (checked at construction)
        return self.node.tie

    def to_argv(self) -> List[str]:
        """The elastic node's options for these settings (the worker command goes after them,
        behind ``--``): ``--join``, ``--name``, then each setting that is not its default,
        the node's as `NodeSettings.to_argv` writes them against `elastic_node()`."""
        argv = ["--join", self.join, "--name", self.name]
        if self.secret_file is not None:
            argv += ["--secret-file", self.secret_file]
        if self.slot is not None:
            argv += ["--slot", str(self.slot[0]), "--slots", str(self.slot[1])]
        argv += self.node.to_argv(defaults=elastic_node())
        for name in ("tie_timeout_s", "final_timeout_s", "status_file"):
            value = getattr(self, name)
            if value != _DEFAULTS[name]:
                argv += ["--" + name.replace("_", "-"), word(value)]
        return argv

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The elastic node's options (what `to_argv` writes) on `parser`; a setting not
        given is absent from the parsed namespace, and `from_arguments` takes its default."""
        absent = argparse.SUPPRESS
        add = parser.add_argument
        add("--join", required=True, metavar="HOST:PORT",
            help="the lighthouse (python -m platoon.elastic.lighthouse)")
        add("--name", required=True,
            help="this node's stable name: its slot (a restarted node keeps it)")
        add("--secret-file", default=absent, metavar="PATH",
            help="the job's secret (default: $PLATOON_ELASTIC_SECRET_FILE)")
        add("--slot", type=int, default=absent, metavar="I",
            help="this node's place among --slots N node slots (0 <= I < N; platoon-launcher "
                 "gives each host its own): its workers' global_rank and global_size count "
                 "every slot's workers, and platoon.shard gives each slot its own part of "
                 "the data")
        add("--slots", type=int, default=absent, metavar="N",
            help="how many node slots the job has (with --slot)")
        NodeSettings.add_arguments(parser, elastic_node(), ELASTIC_HOST_HELP)
        add("--tie-timeout-s", type=float, default=absent, metavar="S",
            help="a round's collectives wait at most this long for a member that stops "
                 "answering (default %g; more than --tie-every-s)"
                 % ElasticNodeSettings.tie_timeout_s)
        add("--final-timeout-s", type=float, default=absent, metavar="S",
            help="a node whose workers are done waits for the final round as long as its "
                 "quorum makes rounds; after this long without one (its peers gone, too few "
                 "nodes, the lighthouse gone) it keeps its own centre and ends (default %g; "
                 "more than --tie-timeout-s)" % ElasticNodeSettings.final_timeout_s)
        add("--status-file", default=absent, metavar="PATH",
            help="write this node's status (its state, quorum and final result, JSON) to "
                 "PATH, atomically, as it changes (platoon-launcher --elastic reads it; the "
                 "folder is made if missing)")

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> "ElasticNodeSettings":
        """The settings a namespace of `add_arguments`' options holds (other options in it
        are ignored). Raises ValueError naming the flag of a bad setting."""
        given = vars(args)
        try:
            if ("slot" in given) != ("slots" in given):
                raise ValueError("ElasticNodeSettings slot needs both --slot I and --slots N")
            own = {f.name: given[f.name] for f in dataclasses.fields(cls)
                   if f.name not in ("node", "slot") and f.name in given}
            slot = (given["slot"], given["slots"]) if "slot" in given else None
            return cls(node=NodeSettings.from_arguments(args, defaults=elastic_node()),
                       slot=slot, **own)
        except ValueError as exc:
            raise ValueError(flag_message(exc)) from None


_DEFAULTS: Dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ElasticNodeSettings)}


def _setting(settings: LighthouseSettings, part: Optional[str], name: str):
    return getattr(settings if part is None else getattr(settings, part), name)


def _check_address(name: str, address, zero: bool = False) -> None:
    """Raise ValueError naming setting `name` unless `address` is "HOST:PORT" (a port from 1,
    or 0 with `zero`, to 65535)."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not (host and port.isdigit() and (0 if zero else 1) <= int(port) <= 65535):
        raise ValueError("%s must be HOST:PORT%s, got %r"
                         % (name, " (port 0 picks a free one)" if zero else "", address))


__all__ = ["ELASTIC_HOST_HELP", "FINAL_TIMEOUT_S", "ElasticNodeSettings", "LighthouseSettings",
           "Limits", "MembershipSettings"]
