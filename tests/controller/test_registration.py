"""Registration: ids, is_first, reconnects after a reset, and what an unauthenticated local
peer can claim. Real controllers, workers, sockets and processes."""

import json
import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import zmq

from platoon import EASGD, Controller, ProtocolError, RemoteError, Worker

from helpers import TcpProxy


class Echo(Controller):
    def handle_control(self, req, worker_id, req_info):
        return {"req": req, "worker": worker_id, "info": req_info}


@pytest.fixture
def proxy():
    made = []

    def start(port):
        made.append(TcpProxy(port))
        return made[-1]

    yield start
    for p in made:
        p.close()


def test_a_reset_connection_re_registers_under_the_same_id(serve, proxy):
    """Before: every request after a reset got "connection that has not registered", close()
    could not say done, and the job ended with WorkerDied."""
    ctl = Echo(control_port=0, num_workers=1)
    serving = serve(ctl)
    link = proxy(ctl.control_port)
    with Worker(link.port, timeout_s=10) as w:
        assert w.send_req("before")["worker"] == 0
        link.reset()
        reply = w.send_req("after", {"n": 1})
        assert reply == {"req": "after", "worker": 0, "info": {"n": 1}}
        assert ctl.workers == [0]
    serving.join()  # done was said: no WorkerDied


def test_a_stolen_id_without_the_token_is_refused(serve, raw_client):
    ctl = Echo(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        rogue = raw_client(ctl)
        rogue.send(json.dumps({"req": "platoon-register", "req_info": {
            "pid": os.getpid(), "host": socket.gethostname(), "worker_id": 0,
            "token": "0" * 32}}).encode())
        reply = json.loads(rogue.recv())
        assert not reply["ok"] and "no registered worker has that id and token" in \
            reply["error"]["message"]
        assert w.send_req("still mine")["worker"] == 0
        with Worker(ctl.control_port, timeout_s=5):
            pass
    serving.join()


def test_an_oversized_request_fails_at_once_and_the_worker_stays_usable(serve):
    """Before: a 3 MB request dropped the connection and the worker was never recognised
    again."""
    ctl = Echo(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(ProtocolError, match="over the controller's limit of 1048576 bytes"):
            w.send_req("big", "x" * (3 << 20))
        assert w.send_req("small", 1)["info"] == 1
    serving.join()


def rogue_register(ctl, raw_client, **info):
    sock = raw_client(ctl)
    sock.send(json.dumps({"req": "platoon-register", "req_info": info}).encode())
    return json.loads(sock.recv())


def test_a_rogue_cannot_register_a_dead_pid_or_another_host(serve, raw_client):
    """Before: a REGISTER claiming a dead pid ended the job within a second (WorkerDied)."""
    ctl = Echo(control_port=0, num_workers=2, liveness_interval_s=0.1)
    serving = serve(ctl)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    with Worker(ctl.control_port, timeout_s=5) as w:
        host = socket.gethostname()
        for info, message in [
                ({"pid": dead.pid, "host": host}, "no process %d" % dead.pid),
                ({"pid": 1, "host": host}, "holds 0 connection(s)"),
                ({"host": host}, "must give its pid"),
                ({"pid": dead.pid, "host": "elsewhere"}, "says it runs on host 'elsewhere'")]:
            reply = rogue_register(ctl, raw_client, **info)
            assert not reply["ok"] and message in reply["error"]["message"], (info, reply)
        assert ctl.workers == [0]
        assert w.send_req("alive")["worker"] == 0  # the job goes on
        with Worker(ctl.control_port, timeout_s=5) as second:
            assert second.worker_id == 1
    serving.join()


def test_shared_memory_a_peer_may_ask_for_is_bounded(serve, raw_client):
    """Before: one INIT_PARAMS from any local peer allocated 512 MiB+ of /dev/shm."""
    ctl = Echo(control_port=0, num_workers=1, max_shared_bytes=1 << 20)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(RemoteError, match="the centre needs 8392704 bytes of shared memory, "
                                              "but this job may hold 1048576"):
            w.init_shared_params([np.zeros(1 << 20)], EASGD(0.5))
        with pytest.raises(RemoteError, match="shared state 'big' needs"):
            w.shared_state("big", [{"dtype": "<f8", "shape": [1 << 20]}])
        w.init_shared_params([np.zeros(1000)], EASGD(0.5))  # within the limit: fine
    serving.join()


def test_worker_ids_follow_the_launchers_numbers(serve, monkeypatch):
    """Before: ids went by order of registration, so worker1.log could say "worker 0"."""
    ctl = Echo(control_port=0, num_workers=2)
    serving = serve(ctl)
    monkeypatch.setenv("PLATOON_WORKER_INDEX", "1")
    with Worker(ctl.control_port, timeout_s=5) as second:
        monkeypatch.setenv("PLATOON_WORKER_INDEX", "0")
        with Worker(ctl.control_port, timeout_s=5) as first:
            assert (second.worker_id, first.worker_id) == (1, 0)
    serving.join()


class Tolerant(Echo):
    def handle_worker_death(self, worker_id, exit_info):
        pass


def test_a_replacement_before_the_death_is_noticed_keeps_its_ids(serve, procs, monkeypatch):
    """-n 3 --restart 1, worker 2 slow to start: worker 0's replacement registered before the
    pid check noticed worker 0's death and took id 2 (the lowest free one), and the real
    worker 2 then took id 0 as the replacement. The launcher's number for a worker is its id."""
    ctl = Tolerant(control_port=0, num_workers=3, restarts=1, liveness_interval_s=30)
    serving = serve(ctl)
    victim = procs("die_worker.py", ctl.control_port, "sync", env={"PLATOON_WORKER_INDEX": "0"})
    assert victim.wait_for_line("READY") == "READY 0"
    monkeypatch.setenv("PLATOON_WORKER_INDEX", "1")
    with Worker(ctl.control_port, timeout_s=5) as second:
        victim.kill()  # SIGKILL and reaped, as the launcher has reaped it before replacing it
        monkeypatch.setenv("PLATOON_WORKER_INDEX", "0")
        with Worker(ctl.control_port, timeout_s=5) as replacement:  # long before a pid check
            monkeypatch.setenv("PLATOON_WORKER_INDEX", "2")
            with Worker(ctl.control_port, timeout_s=5) as late:
                ids = (replacement.worker_id, second.worker_id, late.worker_id)
                assert ids == (0, 1, 2)
                assert [r.state.value for r in (ctl._registry.get(0), ctl._registry.get(2))] \
                    == ["registered"] * 2  # noqa: SLF001
    serving.join()
    assert ctl.workers == [0, 1, 2]


def test_is_first_is_the_worker_whose_values_initialise_the_centre(serve):
    """Before: the first to register had is_first=True, but the first to call
    init_shared_params initialised the centre, so a checkpoint loaded "if is_first" was lost."""
    ctl = Echo(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as first, \
            Worker(ctl.control_port, timeout_s=10) as second:
        assert first.is_first and not second.is_first
        loaded = [np.full(5, 7.0) if w.is_first else np.zeros(5) for w in (first, second)]
        # The second calls init_shared_params first: it waits for the first's values.
        late = threading.Thread(target=second.init_shared_params, args=([loaded[1]], EASGD(0.5)))
        late.start()
        late.join(0.3)
        assert late.is_alive()  # still waiting for the first worker's values
        first.init_shared_params([loaded[0]], EASGD(0.5))
        late.join(10)
        assert not late.is_alive()
        assert (loaded[1] == 7.0).all() and (ctl.centre[0] == 7.0).all()
        assert first.is_first and not second.is_first
    serving.join()


def test_the_role_of_first_passes_on_when_the_first_worker_leaves_before_initialising(serve):
    ctl = Echo(control_port=0, num_workers=2)
    serving = serve(ctl)
    first = Worker(ctl.control_port, timeout_s=10)
    with Worker(ctl.control_port, timeout_s=10) as second:
        assert first.is_first and not second.is_first
        first.close()
        params = [np.full(3, 2.0)]
        second.init_shared_params(params, EASGD(0.5))
        assert second.is_first and (ctl.centre[0] == 2.0).all()
    serving.join()


def test_a_registration_over_ipc_needs_a_live_pid(serve):
    ctl = Echo(control_port=0, num_workers=1, transport="ipc")
    serving = serve(ctl)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.rcvtimeo = 5000
        sock.connect(ctl.control_address)
        sock.send(json.dumps({"req": "platoon-register", "req_info": {
            "pid": 1 << 22, "host": socket.gethostname()}}).encode())
        reply = json.loads(sock.recv())
        assert not reply["ok"] and "no process" in reply["error"]["message"]
    finally:
        ctx.destroy(linger=0)
    with Worker(ctl.control_address, timeout_s=5):
        pass
    serving.join()


def test_a_worker_without_a_controller_says_it_is_still_waiting(procs):
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = procs("lonely_worker.py", port, 60)
    line = worker.wait_for_line("WARNING platoon._worker.client: still waiting", 30)
    assert "tcp://127.0.0.1:%d (timeout 60 s)" % port in line
    assert worker.popen.poll() is None  # long before its 60 s timeout
    worker.kill()
