"""Who may reach a controller: only holders of the job's keys (CURVE), keys that stay private,
and no other user of this machine, whose connections are dropped. The log directory: no other
user can redirect what the job writes there."""

import json
import os
import re
import resource
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq

from platoon import EASGD, Controller, ControllerTimeout, PlatoonError, Worker, load_centre
from platoon.security import generate_keys, is_loopback, load_keys

from helpers import EXPERIMENTS


class Echo(Controller):
    def handle_control(self, req, worker_id, req_info):
        return req_info


@pytest.fixture
def keys(tmp_path):
    return generate_keys(str(tmp_path / "keys.json"))


def test_keys_file_is_private_and_checked(keys, tmp_path):
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    assert set(load_keys(keys)) == {"server_public", "server_secret", "client_public",
                                    "client_secret"}
    os.chmod(keys, 0o644)
    with pytest.raises(PlatoonError, match="chmod 600"):
        load_keys(keys)
    with pytest.raises(FileExistsError):
        generate_keys(keys)  # never overwritten


def test_only_key_holders_get_in(keys, tmp_path, serve):
    ctl = Echo(control_port=0, data_port=0, keys_file=keys)
    serving = serve(ctl)
    with Worker(ctl.control_port, ctl.data_port, timeout_s=5, keys_file=keys) as w:
        assert w.send_req("hello", [1]) == [1]
        w.init_shared_params([np.ones(3)], EASGD(0.5))
        with pytest.raises(ControllerTimeout):
            Worker(ctl.control_port, timeout_s=0.5)  # no keys: the handshake never completes
        stranger = generate_keys(str(tmp_path / "other.json"))
        with pytest.raises(ControllerTimeout):
            Worker(ctl.control_port, timeout_s=0.5, keys_file=stranger)  # wrong keys
        ctx = zmq.Context()
        try:
            thief = ctx.socket(zmq.PULL)
            thief.linger = 0
            thief.connect("tcp://127.0.0.1:%d" % ctl.data_port)
            takers = []
            sender = threading.Thread(target=lambda: takers.extend(
                ctl.send_mb([np.full(2, i)], timeout_s=5) for i in range(4)))
            sender.start()  # minibatches go out as the worker asks for them
            got = [int(w.recv_mb()[0][0]) for _ in range(4)]
            sender.join(10)
            assert got == [0, 1, 2, 3]  # all of them reached the authenticated worker
            assert takers == [w.worker_id] * 4
            assert thief.poll(300) == 0  # and none the stranger
        finally:
            ctx.destroy(linger=0)
    serving.join()


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_launcher_curve_job(tmp_path):
    out = subprocess.run([sys.executable, "-m", "platoon.launch.cli",
                          os.path.join(EXPERIMENTS, "envcheck"), "-n", "2", "--curve",
                          "--log-dir", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    keys = tmp_path / "logs" / "curve_keys.json"
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600


def test_keys_of_another_user_or_behind_a_link_are_refused(keys, tmp_path):
    link = tmp_path / "link.json"
    os.symlink(keys, link)
    with pytest.raises(PlatoonError, match="cannot read the job's keys from %s" % link):
        load_keys(str(link))  # never followed, even to keys of our own
    os.chown(keys, 65534, 65534)  # the tests run as root: "another user"
    with pytest.raises(PlatoonError, match=r"keys file %s belongs to uid 65534, not to you"
                       % keys):
        load_keys(keys)


@pytest.mark.skipif(os.getuid() != 0, reason="opening connections as another user needs root")
@pytest.mark.parametrize("flooded", ["control", "data"])
def test_a_flood_of_idle_connections_from_another_user_ends_nothing(procs, tmp_path, flooded):
    """Another local user opening more idle connections than the controller may hold
    descriptors (here 128) starves neither registration, syncs nor checkpoints: its
    connections are dropped as they are accepted."""
    checkpoint = tmp_path / "centre.npz"
    ctl = procs("flood_controller.py", 128, checkpoint)
    control_port, data_port = map(int, ctl.wait_for_line("PORT").split()[1:])
    flood = procs("flood_connect.py", control_port if flooded == "control" else data_port,
                  300, 60, "hold")
    flood.wait_for_line("FLOODING", timeout=30)
    worker = procs("sync_worker.py", control_port, 1, 3, "ordered", "easgd",
                   str(tmp_path / "params%d.npz"))
    worker.wait_for_line("DONE 0", timeout=40)
    assert worker.wait(30) == 0, worker.output
    ctl.wait_for_line("SERVED", timeout=30)
    assert ctl.wait(30) == 0, ctl.output
    assert "Too many open files" not in ctl.output
    assert "from uid 65534 (another user on this machine)" in ctl.output
    with np.load(checkpoint) as saved:
        assert {"param_0", "param_1"} <= set(saved.files)  # sync_worker's two arrays


def test_a_controller_may_open_as_many_descriptors_as_its_hard_limit_allows():
    """Connections each take a descriptor: a tcp controller raises its soft limit to the
    hard one, so that the job's files keep room beside them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip("a hard limit of %d descriptors leaves nothing to raise" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        with Controller(control_port=0):
            raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised == hard


OTHER_UID = 65534  # nobody: "another user" (the tests run as root, which may chown)


def _launch(log_dir, cwd):
    """(exit code, output) of a one-worker launcher job logging to `log_dir`."""
    done = subprocess.run([sys.executable, "-m", "platoon.launch.cli",
                           os.path.join(EXPERIMENTS, "envcheck"), "-n", "1",
                           "--log-dir", str(log_dir)],
                          capture_output=True, text=True, timeout=60, cwd=str(cwd))
    return done.returncode, done.stdout + done.stderr


def test_a_log_dir_below_a_directory_others_can_change_is_refused(tmp_path):
    """The log directory's owner could be us, but whoever can change a directory on the way
    could swap it for a link (to a victim's directory, or their own) after the check."""
    theirs = tmp_path / "theirs"  # another user's: they may rename what is in it
    (theirs / "logs").mkdir(parents=True, mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    shared = tmp_path / "shared"  # anyone may rename what is in it (not sticky)
    (shared / "logs").mkdir(parents=True, mode=0o700)
    os.chmod(shared, 0o777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "their-link"  # theirs: they choose, and change, where it leads
    os.symlink(mine, link)
    os.lchown(link, OTHER_UID, OTHER_UID)
    for log_dir, says in (
            (theirs / "logs", r"is reached through %s, which belongs to uid %d \(\w+\)"
             % (theirs, OTHER_UID)),
            (shared / "logs", r"is reached through %s, which other users may write in "
             r"\(mode 777, not sticky\)" % shared),
            (link / "logs", r"is reached through %s, a link of uid %d \(\w+\), not yours"
             % (link, OTHER_UID))):
        code, out = _launch(log_dir, tmp_path)
        assert code == 2, out
        assert re.search(r"log directory %s %s.*choose a --log-dir of your own"
                         % (re.escape(str(log_dir)), says), out), out
        assert "job " not in out, out  # nothing started
    assert os.listdir(theirs / "logs") == [] and os.listdir(shared / "logs") == []
    assert os.listdir(mine) == []
    # Directories only root or we can change are fine, a sticky one such as /tmp (which
    # tmp_path is in), and our own links to them.
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "alias")
    code, out = _launch(tmp_path / "alias" / "logs", tmp_path)
    assert code == 0, out
    assert {"controller.log", "worker0.log", "status.json", "centre.npz"} <= set(
        os.listdir(real / "logs")), os.listdir(real / "logs")


def test_the_controller_writes_in_the_log_dir_the_launcher_opened_whatever_its_path_leads_to(
        serve, tmp_path, monkeypatch):
    """The launcher hands the controller its log directory opened (PLATOON_LOG_DIR_FD): the
    status file and the checkpoints are written there even after its path was swapped for a
    link, by whoever could, to a victim's directory."""
    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"  # a 0700 directory the link leads to
    victim.mkdir(mode=0o700)
    dir_fd = os.open(logs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        monkeypatch.setenv("PLATOON_LOG_DIR_FD", str(dir_fd))
        monkeypatch.setenv("PLATOON_STATUS_FILE", str(logs / "status.json"))
        monkeypatch.setenv("PLATOON_CHECKPOINT_PATH", str(logs / "centre.npz"))
        ctl = Controller(control_port=0)
        serving = serve(ctl)
        with Worker(ctl.control_port, timeout_s=10) as w:
            w.init_shared_params([np.arange(4.0)], EASGD(0.5))
            os.rename(logs, tmp_path / "job" / "moved")  # the swap, before anything is written
            os.symlink(victim, logs)
            ctl.checkpoint()
            w.report(minibatches=3)  # the status file is written at once
        serving.join()  # and the final checkpoint
    finally:
        os.close(dir_fd)
    assert os.listdir(victim) == []
    moved = tmp_path / "job" / "moved"
    assert sorted(os.listdir(moved)) == ["centre.npz", "status.json"]
    assert json.loads((moved / "status.json").read_text())["minibatches"] == 3
    np.testing.assert_array_equal(load_centre(str(moved))["param_0"], np.arange(4.0))
