"""The worker registry's states, ids and restarts, without sockets (workers on other hosts,
so no pid is checked)."""

import pytest

from platoon._controller.config import ControllerConfig
from platoon._controller.registry import WorkerRegistry, WorkerState, describe_death
from platoon.errors import PlatoonError, ProtocolError


def registry(num_workers=2, restarts=0):
    left = []
    config = ControllerConfig(num_workers=num_workers, job_id="job", restarts=restarts,
                              replacement_timeout_s=60, liveness_interval_s=0.5)
    reg = WorkerRegistry(lambda: config, on_left=left.append)
    return reg, left


def join(reg, identity, index=None):
    info = {"pid": 1, "host": "elsewhere.invalid", "index": index}
    return reg.register(identity, info, None, "tcp", 5567)


def test_states_from_registration_to_done():
    reg, left = registry()
    a, new = join(reg, b"a")
    assert new and a.worker_id == 0 and a.state is WorkerState.REGISTERED
    assert join(reg, b"a") == (a, False)  # the same connection again
    reg.mark_ready(a)
    assert a.state is WorkerState.READY
    b, _ = join(reg, b"b")
    with pytest.raises(PlatoonError, match="job job is full"):
        join(reg, b"c")
    reg.done(a)
    reg.done(a)  # once only
    assert a.state is WorkerState.DONE and left == [a]
    assert reg.departed() == [0] and not reg.all_done()
    reg.fail(b, {"pid": 1, "error": "boom"})
    assert b.state is WorkerState.FAILED and b.failed and left == [a, b]
    assert list(reg.deaths) == [(1, {"pid": 1, "error": "boom"})]  # no restarts: the hook's
    assert reg.all_done()


def test_a_replacement_takes_the_failed_workers_id():
    reg, _ = registry(restarts=1)
    first, _ = join(reg, b"a", index=0)
    join(reg, b"b", index=1)
    reg.fail(first, {"pid": 1})
    assert not reg.deaths and reg.restarts_left == 0
    assert reg.still_expected() == 2  # the other, and the replacement
    replacement, new = join(reg, b"c")
    assert new and replacement.worker_id == 0
    assert first.state is WorkerState.REPLACED and reg.get(0) is replacement
    assert reg.by_identity(b"a") is None


def test_a_registration_whose_reply_fails_changes_nothing():
    """All or nothing: a failing `welcome` (the reply could not be built) leaves no record,
    no taken id and no consumed replacement; a reconnection keeps its old connection."""
    reg, _ = registry(restarts=1)
    first, _ = join(reg, b"a", index=0)
    join(reg, b"b", index=1)
    reg.fail(first, {"pid": 1})

    def refuse(record, new):
        raise PlatoonError("no room for the reply of worker %d" % record.worker_id)

    info = {"pid": 1, "host": "elsewhere.invalid"}
    with pytest.raises(PlatoonError, match="no room for the reply of worker 0"):
        reg.register(b"c", info, None, "tcp", 5567, refuse)
    assert reg.by_identity(b"c") is None and reg.get(0) is first
    assert first.state is WorkerState.FAILED and reg.still_expected() == 2
    replacement, new = reg.register(b"c", info, None, "tcp", 5567, lambda rec, new: None)
    assert new and replacement.worker_id == 0 and first.state is WorkerState.REPLACED
    with pytest.raises(PlatoonError, match="no room"):
        reg.register(b"d", {"worker_id": 0, "token": replacement.token}, None, "tcp", 5567,
                     refuse)
    assert reg.by_identity(b"c") is replacement and reg.by_identity(b"d") is None


def test_reconnection_needs_the_token():
    reg, _ = registry()
    a, _ = join(reg, b"a")
    with pytest.raises(ProtocolError, match="no registered worker has that id and token"):
        reg.register(b"x", {"worker_id": 0, "token": "wrong"}, None, "tcp", 5567)
    again, new = reg.register(b"x", {"worker_id": 0, "token": a.token}, None, "tcp", 5567)
    assert again is a and not new and reg.by_identity(b"x") is a
    reg.done(a)
    with pytest.raises(PlatoonError, match="has already left"):
        reg.register(b"y", {"worker_id": 0, "token": a.token}, None, "tcp", 5567)


def test_the_default_death_message_says_what_to_do():
    text = describe_death(3, {"pid": 42, "detected_after_s": 0.5})
    assert "worker 3 (pid 42) died without saying it was done" in text and "--restart" in text
