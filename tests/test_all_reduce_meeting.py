"""all_reduce's meeting in shared memory with real worker processes: the compiled meeting
(kernels.Meeting) and the Python one meet each other with the same bits, a killed peer
fails a worker waiting in it, and a worker waiting for a late peer sleeps."""

import hashlib
import os
import re
import sys
import time

import numpy as np
import pytest

from platoon import Controller
from platoon.rules import kernels

from helpers import PROCS

sys.path.insert(0, PROCS)
from allreduce_worker import CASES, ROUNDS, contribution  # noqa: E402

UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum}


class Tolerant(Controller):
    """Carries on when a worker dies (the default ends serve)."""

    def handle_worker_death(self, worker_id, exit_info):
        pass


def expected_digest(n):
    """The digest of the rounds' results as numpy reduces them (worker-id order)."""
    digest = hashlib.sha256()
    for rnd in range(ROUNDS):
        for case, (op, _, _) in enumerate(CASES):
            parts = [contribution(k, rnd, case) for k in range(n)]
            result = parts[0].copy()
            for part in parts[1:]:
                UFUNCS[op](result, part, out=result)
            if op == "mean":
                np.divide(result, n, out=result, casting="unsafe")
            digest.update(result.tobytes())
    return digest.hexdigest()


def test_compiled_and_python_meetings_agree_bit_for_bit(serve, procs):
    """Three workers on this machine's cores (more workers than cores here), one meeting in
    Python: every worker gets numpy's bits, late peers or not."""
    n = 3
    ctl = Controller(control_port=0, num_workers=n)
    serving = serve(ctl, timeout=60)
    workers = [procs("allreduce_worker.py", ctl.control_port, "rounds",
                     env={"PLATOON_SYNC_KERNELS": "numpy"} if k == 0 else None)
               for k in range(n)]
    for w in workers:
        assert w.wait(60) == 0, w.output
    paths = sorted(w.wait_for_line("PATH").split()[1] for w in workers)
    if kernels.Meeting is not None:
        assert paths == ["compiled", "compiled", "python"], paths
    want = expected_digest(n)
    for w in workers:
        assert w.wait_for_line("DIGEST").split()[1] == want, w.output
    serving.join()
    assert ctl.all_reduce_rounds == ROUNDS * len(CASES)


def test_a_killed_peer_fails_a_worker_waiting_without_timeout(serve, procs):
    ctl = Tolerant(control_port=0, num_workers=2, liveness_interval_s=0.2)
    serving = serve(ctl)
    survivor, victim = (procs("allreduce_worker.py", ctl.control_port, "forever")
                        for _ in range(2))
    survivor.wait_for_line("READY")
    victim.wait_for_line("READY")
    killed_at = time.monotonic()
    victim.kill()
    assert survivor.wait(10) != 0
    line = survivor.wait_for_line("RAISED")
    assert time.monotonic() - killed_at < 15.0  # (1 s idle; a hang waits forever)
    assert re.search(r"RemoteError: worker \d has left the job", line), survivor.output
    serving.join()


def test_a_worker_waiting_for_a_late_peer_sleeps(serve, procs):
    """The compiled meeting spins for microseconds and yields for 2 ms at most: a worker
    whose peer is a second late uses a small part of a core meanwhile."""
    ctl = Controller(control_port=0, num_workers=2)
    serving = serve(ctl)
    workers = [procs("allreduce_worker.py", ctl.control_port, "late") for _ in range(2)]
    for w in workers:
        assert w.wait(30) == 0, w.output
    waited = [w for w in workers if any(line and line.startswith("WAITED") for line in w.lines)]
    wall, cpu = map(float, waited[0].wait_for_line("WAITED").split()[1:])
    assert wall > 0.5, waited[0].output  # it did wait for the late peer
    assert cpu < 0.25 * wall, "a worker waiting %.2f s in all_reduce used %.2f s of CPU" % (
        wall, cpu)
    serving.join()


@pytest.mark.skipif(kernels.Meeting is None, reason="the compiled module is not built")
def test_meeting_statuses_are_the_compiled_modules():
    for name in ("MEET_DONE", "MEET_ARRIVED", "MEET_PENDING", "MEET_GONE", "MEET_COPY"):
        assert getattr(kernels.compiled, name) == getattr(kernels, name), name


@pytest.mark.skipif(kernels.Meeting is None, reason="the compiled module is not built")
def test_the_compiled_meeting_refuses_buffers_that_do_not_fit():
    data = np.zeros((5, 8), np.float32)  # 2 slots: 2 * 2 + 1 rows, 3 * 2 + 2 control words
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="do not fit"):
            kernels.Meeting(data, np.zeros(7, np.int64), 0, 2, fd, 1)
        with pytest.raises(ValueError, match="slot 2 of 2"):
            kernels.Meeting(data, np.zeros(8, np.int64), 2, 2, fd, 1)
        assert kernels.Meeting(data, np.zeros(8, np.int64), 1, 2, fd, 1) is not None
    finally:
        os.close(fd)
