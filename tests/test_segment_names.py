"""Shared-memory names another local user cannot squat, and registrations that are all or
nothing. Real controller and worker processes, real POSIX shared memory."""

import os
import secrets

import numpy as np
import pytest

from platoon import Controller, PlatoonError, RemoteError, Worker
from platoon._centre.shmem import SharedCentre
from platoon._os.process import job_segments
from platoon.protocol import layout_of

SHM = "/dev/shm"
NOBODY = 65534  # squatted names belong to another user, as in an attack (when we are root)
KINDS = ("centre", "stop", "state-opt", "ar-f8-4")  # every kind segments_worker.py makes


@pytest.fixture
def squat():
    """squat(names): pre-create /dev/shm/NAME for each name, as another local user could
    (owned by nobody when the tests run as root). Removed at teardown."""
    made = []

    def create(names):
        for name in names:
            path = os.path.join(SHM, name)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            made.append(path)
            if os.getuid() == 0:
                os.chown(path, NOBODY, NOBODY)
        return made

    yield create
    for path in made:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def guessable_names(job_id):
    """What an attacker who read the job id in /dev/shm can pre-create: the names platoon
    derived from it before (platoon-JOB-KIND), and names of the new form with guessed tokens."""
    names = ["platoon-%s-%s" % (job_id, kind) for kind in KINDS]
    for kind in KINDS:
        names += ["platoon-%s-%s-%s" % (job_id, kind, token)
                  for token in ("0" * 16, "f" * 16, secrets.token_hex(8), secrets.token_hex(8))]
    return names


def test_a_job_starts_and_trains_with_its_guessable_names_squatted(procs, tmp_path, squat):
    """Before: the controller created platoon-JOB-stop, -centre, -state-NAME, -ar-... with
    O_EXCL, so any local user who pre-created one stopped the job ("already exists")."""
    job_id = secrets.token_hex(8)
    squatted = squat(guessable_names(job_id))
    ctl = procs("step_controller.py", 2, tmp_path / "c.npz", 60,
                env={"PLATOON_JOB_ID": job_id})
    port = int(ctl.wait_for_line("PORT").split()[1])
    assert ctl.wait_for_line("JOB").split()[1] == job_id
    workers = [procs("segments_worker.py", port) for _ in range(2)]
    for worker in workers:
        assert worker.wait(60) == 0, worker.output + "\n" + ctl.output
        assert worker.wait_for_line("DONE").split()[2] == "3", worker.output
    assert ctl.wait(30) == 0, ctl.output
    assert not job_segments(job_id), "the controller left segments: %s" % job_segments(job_id)
    assert all(os.path.exists(path) for path in squatted)  # another user's files: untouched


def test_segment_names_are_random_and_a_squatted_one_is_replaced(squat, monkeypatch, caplog):
    """A new segment's name ends in a random token; should one exist already (an attacker
    guessed it), another is drawn; after a few such draws the error says what happened."""
    job_id = secrets.token_hex(8)
    layout = layout_of([np.zeros(4)])
    first, second = SharedCentre.create(job_id, layout), SharedCentre.create(job_id, layout)
    try:
        assert first.name != second.name
        assert first.name.startswith("/platoon-%s-centre-" % job_id)
        assert len(first.name) == len("/platoon-%s-centre-" % job_id) + 16
    finally:
        for centre in (first, second):
            centre.close()
            centre.unlink()
    squat(["platoon-%s-centre-%s" % (job_id, "0" * 16)])
    draws = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    with SharedCentre.create(job_id, layout) as centre:
        assert centre.name == "/platoon-%s-centre-%s" % (job_id, "1" * 16)
    assert "exists already" in caplog.text
    monkeypatch.setattr(secrets, "token_hex", lambda n: "0" * 16)
    with pytest.raises(PlatoonError, match="another local user may be squatting"):
        SharedCentre.create(job_id, layout)


def test_a_registration_refused_for_a_squatted_name_is_not_counted(serve, squat):
    """Before: with platoon-JOB-stop squatted the first registration failed, yet the controller
    counted the worker: every retry was refused ("job is full") and serve() timed out."""
    job_id = secrets.token_hex(8)
    squat(["platoon-%s-stop" % job_id])
    ctl = Controller(control_port=0, num_workers=1, job_id=job_id)
    serving = serve(ctl, timeout=20)
    for attempt in range(2):  # (before, the first failed and the second was refused)
        try:
            with Worker(ctl.control_port, timeout_s=5) as w:
                assert w.worker_id == 0
            break
        except RemoteError:
            assert attempt == 0
    serving.join()
    assert ctl.workers == [0]


def test_a_registration_whose_reply_cannot_be_built_leaves_no_trace(serve):
    """Shared memory exhausted at registration (the stop signal does not fit in
    max_shared_bytes): the worker is told so and is not registered, so once there is room
    its retry is welcome and serve() finishes. Before: it counted as registered."""
    ctl = Controller(control_port=0, num_workers=1, max_shared_bytes=4096)
    serving = serve(ctl, timeout=20)
    with pytest.raises(RemoteError, match="the stop signal needs 8192 bytes of shared memory"):
        Worker(ctl.control_port, timeout_s=5)
    assert ctl.workers == []
    ctl.max_shared_bytes = 1 << 20
    with Worker(ctl.control_port, timeout_s=5) as w:
        assert w.worker_id == 0 and w.is_first
    serving.join()
    assert ctl.workers == [0]
