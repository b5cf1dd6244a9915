"""What the tests of platoon.elastic share that is not a fixture: the scripts they run, the
lighthouse's timings in them, the stand-ins of an ElasticTie's world in-process (a centre and
its lock, a quorum's group, a lighthouse client that never hears of a quorum) and the helpers of
the real-process tests. Test files import it (`from elastic_helpers import ...`), never
conftest.py."""

import contextlib
import os
import re
import threading
import time

import numpy as np

from platoon.elastic import MembershipSettings, Quorum
from platoon.elastic.lighthouse import Lighthouse
from platoon.errors import QuorumTimeout

from helpers import PROCS, wait_until

NODE = os.path.join(PROCS, "elastic_node.py")
WORKER = os.path.join(PROCS, "elastic_worker.py")
TIMEOUT_S = 1.0  # the lighthouse's heartbeat timeout in these tests
GRACE_S = 0.3
SLACK_S = 3.0  # scheduling on a loaded machine: python startup, 100 ms heartbeats, ticks
QUORUM = r"lighthouse: quorum (\d+): (.*)$"
# what srun or mpiexec gives a node started one per host
MPI_RANK_VARIABLES = {"PMI_RANK": "1", "PMI_SIZE": "3", "OMPI_COMM_WORLD_SIZE": "3",
                      "RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1"}
SWITCH_IP = "10.219.7.254"  # the switch of the network-namespace tests (conftest.py's switch)


class _Lock:
    """The centre's lock; `after_release()` runs once, at the next release (a worker's sync
    that was waiting for the lock lands then)."""

    def __init__(self):
        self.after_release = None

    def acquire(self, timeout_s=None):
        return True

    def release(self):
        hook, self.after_release = self.after_release, None
        if hook is not None:
            hook()


class _Centre:
    def __init__(self, values):
        self.arrays = [np.array(values, np.float32)]
        self.layout = [{"dtype": "float32", "shape": [len(values)]}]
        self.lock = _Lock()


class _Controller:
    def __init__(self, values):
        self.shared_centre, self.centre_ready = _Centre(values), True
        self.progress = {"minibatches": 0, "syncs": 0, "metrics": {}}  # its workers' syncs


class _Group:
    """A quorum's group as this member sees it: `mean(move, among)` makes each round's mean,
    `raises` (if set) is what every collective raises."""

    def __init__(self, rank, size, mean=None, raises=None, payload=None, rows=None):
        names = tuple("abcdefgh"[:size])
        self.quorum = Quorum(7, names, tuple("h:%d" % i for i in range(size)), "n0nce")
        self.rank, self.size, self.mean, self.raises = rank, size, mean, raises
        self.payload, self.rows = payload, rows  # rows(own message): what the all-gather gives

    def all_gather_bytes(self, message):
        return self.rows(np.array(message, np.uint8))

    def compressed_mean(self, array, codec, feedback=None, out=None, among=None):
        if self.raises is not None:
            raise self.raises
        return self.mean(np.array(array, np.float32), among), 0

    def broadcast_bytes(self, message, root):
        return message if self.rank == root else self.payload

    def close(self):
        pass


class _NoLighthouse:
    """A lighthouse client that never hears of a quorum (it signs as the real one, with the
    secret b"s" * 32)."""

    secret = b"s" * 32

    def sign_header(self, quorum, rank, header):
        from platoon.elastic.secret import sign_header
        return sign_header(self.secret, quorum.id, quorum.nonce, rank, header)

    def header_signed(self, quorum, rank, header, mac):
        return self.sign_header(quorum, rank, header) == mac

    def wait_for_quorum(self, timeout_s=None, newer_than=0):
        time.sleep(min(timeout_s or 0.05, 0.05))
        raise QuorumTimeout("no quorum (test)")

    def current_quorum(self):
        return None

    def report_broken(self, quorum_id):
        pass

    def report_gone(self, names, quorum_id):
        pass

    def close(self):
        pass


@contextlib.contextmanager
def serving_lighthouse(secret, min_nodes, bind="127.0.0.1:0", heartbeat_timeout_s=5.0,
                       **options):
    """A Lighthouse on `bind` (join grace 0.05 s) for holders of `secret`, serving in a
    thread, stopped and joined as the block ends; `options`: Lighthouse's (limits,
    status_file)."""
    settings = MembershipSettings(min_nodes=min_nodes, heartbeat_timeout_s=heartbeat_timeout_s,
                                  join_grace_s=0.05)
    stopping = threading.Event()
    with Lighthouse(settings, bind, secret, **options) as lighthouse:
        serving = threading.Thread(target=lighthouse.serve, args=(stopping.is_set,))
        serving.start()
        try:
            yield lighthouse
        finally:
            stopping.set()
            serving.join(10)


def _tie(values, anchor, *, running=False, **settings):
    """An ElasticTie (float32 moves, DiLoCo lr 0.7, momentum 0.9) over a stand-in centre
    holding `values`, its anchor `anchor` (round 3); its thread ended at once unless
    `running` (then its lighthouse never forms a quorum)."""
    from platoon.elastic.tie import ElasticTie
    from platoon.node.compress import ErrorFeedback
    from platoon.node.tie import CentreTie
    ctl = _Controller(values)
    if not running:
        ctl.shared_centre = None  # the thread waits for it: halted, it ends at once
    failures = []
    tie = ElasticTie(CentreTie(0.05, outer="diloco", compress="float32"), _NoLighthouse, "a",
                     ctl, 1.0, failures.append, **settings)
    if not running:
        assert tie.halt(5)
        tie._halt.clear(), tie._done.clear()
        ctl.shared_centre = _Centre(values)
        tie.client = _NoLighthouse()
    tie.anchor = [np.array(anchor, np.float32)]
    tie.velocity = [np.zeros(len(anchor), np.float32)]
    tie._feedback = [ErrorFeedback(len(anchor), np.dtype(np.float32))]
    tie.round_no = 3
    return tie, ctl.shared_centre, failures


def _in_netns(netns):
    """Proc arguments that run the rest of the command in network namespace `netns` (the same
    pid: python execs `ip netns exec`, which execs python)."""
    if netns is None:
        return []
    return ["-c", "import os, sys; os.execvp('ip', ['ip', 'netns', 'exec', %r, sys.executable]"
                  " + sys.argv[1:])" % netns]


def quorum_of(proc, members, start=0, timeout=10.0):
    """(id, line index) of the lighthouse's first quorum of exactly `members` from `start`."""
    deadline = time.monotonic() + timeout
    while True:
        match, index = proc.wait_for_match(QUORUM, max(0.01, deadline - time.monotonic()),
                                           start)
        if match.group(2) == ", ".join(members):
            return int(match.group(1)), index
        start = index + 1


def _c_is_dropped_and_rejoins_repaired(lighthouse, nodes, stop, tmp_path, drop, restore):
    """Once c has contributed, `drop` it: a and b go on in a quorum of two once their round
    has timed out; `restore` it: c rejoins, its stale anchor is repaired from a peer, and the
    three end on one saved, finite centre."""
    from platoon import load_centre
    nodes["c"].wait_for_match(r".* WARNING: node c: first contributing round", 30)
    _, index = quorum_of(lighthouse, ["a", "b", "c"])
    drop()
    _, index = quorum_of(lighthouse, ["a", "b"], index + 1, timeout=TIMEOUT_S + SLACK_S)
    # the rounds go on between a and b: said by each whose round broke (one of them may have
    # finished the last round with c just before it went, and have nothing to recover from)
    pattern = re.compile(r".* WARNING: node [ab]: outer rounds go on in quorum \d+ \(a, b\)")
    wait_until(lambda: any(pattern.match(line or "") for n in "ab" for line in nodes[n].lines),
               3 + 5 + SLACK_S, "a or b to go on in a quorum of two")
    restore()
    quorum_of(lighthouse, ["a", "b", "c"], index + 1, timeout=5 + SLACK_S)
    nodes["c"].wait_for_match(r".* WARNING: node c: its anchor repaired from [ab] in quorum", 15)
    stop.write_text("")
    for node in nodes.values():
        assert node.wait(30) == 0, node.output
    centres = [load_centre(str(tmp_path / (n + ".npz")))["param_0"] for n in "abc"]
    assert all(np.array_equal(centres[0], c) for c in centres[1:])
    assert np.isfinite(centres[0]).all()
