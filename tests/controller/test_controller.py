"""The controller against real sockets: reserved requests, user handlers, and bad input."""

import json
import os
import re
import socket
import threading
import time

import numpy as np
import pytest
import zmq

from platoon import (
    EASGD,
    Controller,
    LayoutMismatch,
    MinibatchTimeout,
    PlatoonError,
    PortInUse,
    RemoteError,
    ServeTimeout,
    Worker,
)
from platoon._os.process import job_segments
from platoon.compat.channel import Lieutenant, Soldier
from platoon.controller import default_max_shared_bytes


class EchoController(Controller):
    def handle_control(self, req, worker_id, req_info):
        if req == "echo":
            return {"worker": worker_id, "info": req_info}
        if req == "fail":
            raise KeyError("no such thing: %r" % (req_info,))
        if req == "unserialisable":
            return object()
        raise ValueError("unknown request %r" % req)


def error_of(raw_reply):
    reply = json.loads(raw_reply)
    assert reply["ok"] is False
    return reply["error"]["message"]


def test_handler_reply_and_done(serve):
    ctl = EchoController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        assert (w.worker_id, w.is_first, w.job_id) == (0, True, ctl.job_id)
        assert w.send_req("echo", {"x": [1, 2]}) == {"worker": 0, "info": {"x": [1, 2]}}
    serving.join()
    assert ctl.all_done()


def test_handler_exception_reaches_the_worker_and_serving_goes_on(serve):
    ctl = EchoController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(RemoteError) as info:
            w.send_req("fail", 42)
        err = info.value
        assert err.remote_type == "KeyError"
        assert "handle_control('fail') raised KeyError" in str(err) and "42" in str(err)
        assert "Controller-side traceback" in str(err) and "raise KeyError" in str(err)
        with pytest.raises(RemoteError, match="not JSON-serialisable"):
            w.send_req("unserialisable")
        assert w.send_req("echo", 1)["info"] == 1
    serving.join()


def test_base_controller_says_to_override_handle_control(serve):
    ctl = Controller(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        with pytest.raises(RemoteError, match="override handle_control"):
            w.send_req("next")
    serving.join()


MALFORMED = [
    ([b"\xff\x00garbage"], "not UTF-8"),
    ([b"not json at all"], "not valid JSON"),
    ([b"[1, 2, 3]"], "must be a JSON object"),
    ([b'{"worker_id": 0}'], "'req' must be a non-empty string"),
    ([b'{"req": ""}'], "'req' must be a non-empty string"),
    ([b'{"req": "x", "worker_id": "zero"}'], "'worker_id' must be an integer"),
    ([b"[" * 50000], "nested too deeply"),
    ([b"x" * (2 << 20)], "exceeds the controller's limit"),
    ([b"a", b"b", b"c"], "expected one request frame, got 3"),
    ([b'{"req": "echo", "worker_id": 0}'], "has not registered"),
    ([b'{"req": "platoon-launch-missiles"}'], "has not registered"),
]


def test_malformed_requests_get_error_replies_and_real_workers_carry_on(serve, raw_client):
    ctl = EchoController(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        sock = raw_client(ctl)
        for frames, message in MALFORMED:
            sock.send_multipart(frames)
            assert message in error_of(sock.recv()), frames[0][:40]
            assert w.send_req("echo", "still here")["info"] == "still here"
        # A raw REQ socket (another language's client) gets replies through its envelope.
        req = raw_client(ctl, zmq.REQ)
        req.send(b'{"req": "echo", "seq": 3}')
        reply = json.loads(req.recv())
        assert reply["seq"] == 3 and "has not registered" in reply["error"]["message"]
    serving.join()


def test_registered_connection_cannot_pose_as_another_worker_or_use_reserved_names(serve,
                                                                                  raw_client):
    ctl = EchoController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        sock = raw_client(ctl)
        sock.send(json.dumps({"req": "platoon-register", "req_info": {
            "pid": os.getpid(), "host": socket.gethostname()}}).encode())
        registered = json.loads(sock.recv())["result"]
        assert registered["worker_id"] == 1 and not registered["is_first"]
        sock.send(b'{"req": "echo", "worker_id": 0}')
        assert "registered as worker 1" in error_of(sock.recv())
        sock.send(b'{"req": "platoon-launch-missiles", "worker_id": 1}')
        assert "unknown reserved request" in error_of(sock.recv())
        sock.send(b'{"req": "platoon-init-params", "worker_id": 1, "req_info": {"layout": 7}}')
        assert "layout must be a non-empty list" in error_of(sock.recv())
        huge = json.dumps({"req": "platoon-init-params", "worker_id": 1, "req_info": {
            "layout": [{"dtype": "<f8", "shape": [1 << 40]}]}}).encode()
        sock.send(huge)  # 8 TiB: refused at once, nothing left behind
        assert "this job may hold" in error_of(sock.recv())
        sock.send(b'{"req": "platoon-done", "worker_id": 1}')
        assert json.loads(sock.recv())["ok"]
        assert w.send_req("echo", 0)["worker"] == 0
    serving.join()


def test_port_in_use_is_a_clear_error():
    with Controller(control_port=0) as first:
        with pytest.raises(PortInUse, match="tcp://127.0.0.1:%d: address already in use"
                           % first.control_port):
            Controller(control_port=first.control_port)


def test_serve_timeout_and_job_full(serve):
    with Controller(control_port=0, num_workers=1) as ctl:
        with pytest.raises(ServeTimeout, match="0 worker"):
            ctl.serve(timeout_s=0.1)
    ctl = EchoController(control_port=0, num_workers=1)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5):
        with pytest.raises(RemoteError, match="is full"):
            Worker(ctl.control_port, timeout_s=5)
    serving.join()


def test_serve_waits_for_num_workers(serve):
    ctl = EchoController(control_port=0, num_workers=2)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5):
        pass
    assert not ctl.all_done()
    with Worker(ctl.control_port, timeout_s=5):
        pass
    serving.join()
    assert ctl.workers == [0, 1]


def test_barrier_releases_all_workers_together(serve):
    ctl = EchoController(control_port=0, num_workers=3)
    serving = serve(ctl)
    workers = [Worker(ctl.control_port, timeout_s=10) for _ in range(3)]
    released = []
    threads = [threading.Thread(target=lambda w=w: (w.barrier(), released.append(w.worker_id)))
               for w in workers[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(0.3)
    assert released == []  # two of three arrived: nobody passes
    workers[2].barrier()
    for t in threads:
        t.join(10)
    assert sorted(released) == [0, 1]
    for w in workers:
        w.close()
    serving.join()


def test_layout_mismatch_is_rejected_and_the_centre_is_untouched(serve):
    ctl = EchoController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as a, Worker(ctl.control_port, timeout_s=5) as b:
        a.init_shared_params([np.ones(3), np.ones((2, 2))], EASGD(0.5))
        with pytest.raises(LayoutMismatch) as info:
            b.init_shared_params([np.zeros(3), np.zeros((2, 3))], EASGD(0.5))
        assert "worker 1: parameter 1 is float64 of shape (2, 3) here but float64 of shape " \
               "(2, 2)" in str(info.value)
        np.testing.assert_array_equal(ctl.centre[1], np.ones((2, 2)))
        with pytest.raises(LayoutMismatch, match="registers 1 parameters but the job's centre "
                                              "holds 2"):
            b.init_shared_params([np.zeros(3)], EASGD(0.5))
        mine = [np.zeros(3), np.zeros((2, 2))]
        b.init_shared_params(mine, EASGD(0.5))  # the right layout still works afterwards
        np.testing.assert_array_equal(mine[1], np.ones((2, 2)))
    serving.join()


def test_idle_serve_uses_no_cpu(procs, tmp_path):
    ctl = procs("step_controller.py", 1, tmp_path / "c.npz", 30)
    ctl.wait_for_line("JOB")

    def cpu_seconds():
        with open("/proc/%d/stat" % ctl.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    time.sleep(0.5)  # past the start of serve() (measuring idle time, not synchronising)
    before, start = cpu_seconds(), time.monotonic()
    time.sleep(3.0)
    used = (cpu_seconds() - before) / (time.monotonic() - start)
    assert used < 0.02, "idle controller used %.1f%% of a core" % (100 * used)


def test_compatibility_names():
    assert issubclass(Lieutenant, Controller) and issubclass(Soldier, Worker)


def test_controller_close_is_idempotent_and_unlinks(serve):
    ctl = EchoController(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        w.init_shared_params([np.ones(3)], EASGD(0.5))
        (name,) = job_segments(ctl.job_id, kind="centre")
        assert os.path.exists(name)
    serving.join()
    ctl.close()
    ctl.close()
    assert not os.path.exists(name)
    with pytest.raises(PlatoonError):
        Worker(ctl.control_port, timeout_s=0.2).close()


def test_a_flood_of_bad_requests_logs_a_few_lines_and_a_count(serve, raw_client, caplog):
    """Before: every bad frame logged a WARNING line (35k frames, 28.5k lines)."""
    ctl = EchoController(control_port=0, num_workers=1)
    serving = serve(ctl)
    with caplog.at_level("WARNING", logger="platoon.controller"):
        with Worker(ctl.control_port, timeout_s=5):
            sock = raw_client(ctl)
            for i in range(1000):
                sock.send(b"not json %d" % i)
            for _ in range(1000):
                assert "not valid JSON" in error_of(sock.recv())
        serving.join()
    lines = [r.getMessage() for r in caplog.records if r.name == "platoon.controller"]
    malformed = [m for m in lines if m.startswith("malformed request rejected")]
    assert 1 <= len(malformed) <= 10, len(malformed)
    assert any(re.match(r"\d+ more malformed-request warning\(s\) in .* were not logged", m)
               and int(m.split()[0]) + len(malformed) == 1000 for m in lines), lines[-5:]


def test_old_duration_keywords_still_work_with_a_warning():
    with Controller(control_port=0, num_workers=1) as ctl:
        with pytest.warns(DeprecationWarning, match=r"Controller\.serve\(timeout=\.\.\.\)"):
            with pytest.raises(ServeTimeout):
                ctl.serve(timeout=0.05)
        with pytest.warns(DeprecationWarning, match=r"Controller\.snapshot_centre\(timeout="):
            with pytest.raises(PlatoonError, match="no centre yet"):
                ctl.snapshot_centre(timeout=1)
        ctl.init_data(0)
        with pytest.warns(DeprecationWarning, match=r"Controller\.send_mb\(timeout="):
            with pytest.raises(MinibatchTimeout, match="no worker asked"):
                ctl.send_mb([np.zeros(1)], timeout=0.05)
        with pytest.warns(DeprecationWarning, match=r"Controller\.flush_mb\(timeout="):
            ctl.flush_mb(timeout=0.05)  # nothing sent: nothing to wait for


class RecordingLink:
    """A node link (`NodeLinkProtocol`, every member) that records what the controller asks
    of it, beyond the calls of every tick (`share_stop`, `totals`)."""

    num_workers = 1
    final_result = None

    def __init__(self):
        self.calls = []

    def start(self, controller):
        self.calls.append("start")

    def topology(self, worker_id):
        return {"global_rank": 10 + worker_id, "global_size": 20, "node_rank": 1,
                "num_nodes": 2}

    def initial_centre(self, centre):
        self.calls.append("initial_centre")
        return False

    def barrier(self):
        self.calls.append("barrier")

    def all_reduce(self, array, op):
        self.calls.append("all_reduce")
        return 1

    def fail_round(self, reason):
        self.calls.append("fail_round")

    def share_stop(self, job_stop):
        pass

    def trained(self):
        self.calls.append("trained")
        return False

    def final_centre(self):
        return None

    def totals(self):
        return {"link_rounds": 3}

    def end_tie(self):
        self.calls.append("end_tie")

    def finish(self):
        self.calls.append("finish")


def test_a_node_link_passed_in_joins_registration_barrier_and_the_end(serve):
    link = RecordingLink()
    ctl = EchoController(control_port=0, num_workers=1, node_link=link)
    assert ctl.node_link is link
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=5) as w:
        assert (w.global_rank, w.global_size, w.node_rank, w.num_nodes) == (10, 20, 1, 2)
        w.init_shared_params([np.zeros(3, np.float32)], EASGD(0.5))
        assert w.is_first  # the link left the first values to the workers
        w.barrier()
    serving.join()
    assert link.calls == ["start", "initial_centre", "barrier", "finish"]
    assert ctl.progress["link_rounds"] == 3  # the link's totals, in the progress
    ctl.close()
    assert link.calls[-1] == "end_tie"


def test_both_node_links_and_the_test_double_keep_the_controllers_contract():
    """mypy holds `platoon.mpi.NodeLink` and `ElasticLink` to `NodeLinkProtocol` where their
    runners pass them (setup.cfg's checks); here the classes, at run time."""
    from platoon._controller.services import NodeLinkProtocol
    from platoon.elastic.link import ElasticLink
    from platoon.mpi import CentreTie, NodeLink
    members = [name for name in dir(NodeLinkProtocol) if not name.startswith("_")]
    methods = [name for name in members if callable(getattr(NodeLinkProtocol, name))]
    assert len(methods) == 12, methods
    for cls in (NodeLink, ElasticLink, RecordingLink):
        assert all(callable(getattr(cls, name, None)) for name in methods), cls
    assert isinstance(RecordingLink(), NodeLinkProtocol)
    assert isinstance(ElasticLink(1, None, "a", CentreTie(1.0, outer="diloco"), 5.0, print),
                      NodeLinkProtocol)


@pytest.mark.parametrize("ports, named", [
    ({"control_port": 70001}, "control_port"), ({"control_port": -1}, "control_port"),
    ({"control_port": 0, "data_port": 65536}, "data_port"),
    ({"control_port": True}, "control_port"), ({"control_port": "5000"}, "control_port")])
def test_a_port_out_of_range_is_refused_naming_it(ports, named):
    """ZeroMQ took 70001 as 4465 and -1 as 65535: the controller listened on a port it did
    not report."""
    value = ports[named]
    with pytest.raises(ValueError, match=r"%s must be a tcp port, 1 to 65535, or 0 \(or None\) "
                       r"for a free one; got %s" % (named, re.escape(repr(value)))):
        Controller(**ports)
    with Controller(control_port=0, data_port=None) as ctl:
        assert 0 < ctl.control_port <= 65535 and ctl.data_port is None
        with pytest.raises(ValueError, match="data_port must be a tcp port"):
            ctl.init_data(-1)
        assert 0 < ctl.init_data(0) <= 65535


def test_leaving_a_with_block_while_serve_runs_in_another_thread_stops_serve_first(procs):
    """close() from another thread made libzmq abort the process (a socket closed under a
    recv), killed the serve thread, or hung; now serve() returns first, then the sockets
    close."""
    proc = procs("close_while_serving.py", 6)
    proc.wait_for_line("ALL OK", timeout=60)
    assert proc.popen.wait(30) == 0, proc.output
    assert "serve() returns" in proc.output  # (the controller's warning)


def test_close_from_inside_serve_is_refused_and_serving_goes_on(serve):
    class Closing(Controller):
        def handle_control(self, req, worker_id, req_info):
            self.close()

    ctl = Closing(control_port=0)
    serving = serve(ctl)
    with Worker(ctl.control_port, timeout_s=10) as w:
        with pytest.raises(RemoteError, match=r"close\(\) called from inside serve\(\)"):
            w.send_req("close")
    serving.join()


def test_each_setting_lives_in_the_config_alone(tmp_path):
    """`ctl.checkpoint_path = x` (and every settable setting) replaces the one config, checked
    again; the parts that use a setting read it from there."""
    path = str(tmp_path / "a.ckpt")
    with Controller(checkpoint_every_s=5.0, liveness_interval_s=0.3) as ctl:
        assert ctl.checkpoint_path is None and ctl.config.checkpoint_every_s == 5.0
        ctl.checkpoint_path = path
        ctl.liveness_interval_s = 0.7
        assert ctl.config.checkpoint_path == path == ctl._checkpointer.path  # noqa: SLF001
        assert ctl.config.liveness_interval_s == 0.7 == ctl._registry.liveness_interval_s  # noqa: SLF001
        with pytest.raises(AttributeError):
            ctl.num_workers = 3  # fixed at start: the registry and collectives count on it
        with pytest.raises(ValueError, match="transport must be"):
            Controller(transport="udp")


def test_the_controllers_keywords_are_the_configs_fields_with_its_defaults():
    """One copy of each default: Controller's signature names ControllerConfig's."""
    import dataclasses
    import inspect

    from platoon._controller.config import ControllerConfig  # noqa: PLC2701 (its defaults)
    keywords = {name: p.default for name, p in
                inspect.signature(Controller.__init__).parameters.items()
                if name not in ("self", "control_port", "data_port", "node_link")}
    fields = {f.name: f.default for f in dataclasses.fields(ControllerConfig)}
    assert keywords == fields


@pytest.mark.parametrize("setting, value", [
    ("liveness_interval_s", float("inf")), ("liveness_interval_s", 0),
    ("liveness_interval_s", -1), ("liveness_interval_s", float("nan")),
    ("checkpoint_every_s", -1), ("checkpoint_every_s", float("nan")),
    ("checkpoint_every_s", float("inf")), ("max_request_bytes", -1), ("max_request_bytes", 0),
    ("max_shared_bytes", -5), ("replacement_timeout_s", float("nan")),
    ("replacement_timeout_s", -1), ("checkpoint_lock_timeout_s", float("inf")),
    ("restarts", -3), ("restarts", 1.5), ("restarts", True), ("num_workers", True),
    ("job_id", "a/b"), ("job_id", ""), ("job_id", "x" * 65)])
def test_a_bad_setting_is_refused_naming_it(setting, value):
    """inf took liveness_interval_s (a SIGKILLed worker was never reported), 0 spun serve, nan
    raised a bare ValueError at the first tick; "a/b" as a job id named no segment."""
    with pytest.raises(ValueError, match=r"^%s must be .*got %s" % (setting,
                                                                      re.escape(repr(value)))):
        Controller(**{setting: value})


@pytest.mark.parametrize("setting, value", [
    ("liveness_interval_s", float("inf")), ("liveness_interval_s", 0),
    ("checkpoint_every_s", float("nan")), ("max_shared_bytes", -5),
    ("replacement_timeout_s", -1), ("checkpoint_lock_timeout_s", float("nan")),
    ("restarts_left", -3), ("restarts_left", 1.5)])
def test_a_bad_setting_is_refused_at_run_time_too(setting, value):
    with Controller(liveness_interval_s=0.3, restarts=2) as ctl:
        with pytest.raises(ValueError, match=r"^%s must be .*got %s" % (setting,
                                                                          re.escape(repr(value)))):
            setattr(ctl, setting, value)
        assert ctl.liveness_interval_s == 0.3 and ctl.restarts_left == 2  # unchanged
        ctl.max_shared_bytes = None  # the default again, as at the start
        assert ctl.max_shared_bytes == default_max_shared_bytes()


def test_good_settings_at_their_bounds_are_taken():
    with Controller(liveness_interval_s=0.01, checkpoint_every_s=1e-3, max_request_bytes=1024,
                    max_shared_bytes=1, replacement_timeout_s=0, restarts=0,
                    job_id="JOB_1.n-2") as ctl:
        ctl.liveness_interval_s = 3600
        ctl.restarts_left = 5
        ctl.checkpoint_every_s = None
        assert (ctl.liveness_interval_s, ctl.restarts_left, ctl.job_id) == (3600, 5, "JOB_1.n-2")


def test_log_dir_is_the_launchers_log_directory_or_none(monkeypatch, tmp_path):
    """A controller script puts its own outputs next to the job's logs without reading the
    launcher's variables itself."""
    monkeypatch.delenv("PLATOON_STATUS_FILE", raising=False)
    with Controller(control_port=0) as ctl:
        assert ctl.log_dir is None
    monkeypatch.setenv("PLATOON_STATUS_FILE", str(tmp_path / "status.json"))
    with Controller(control_port=0) as ctl:
        assert ctl.log_dir == str(tmp_path)
