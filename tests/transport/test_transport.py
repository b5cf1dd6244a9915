"""The ipc transport: the same control and minibatch traffic over Unix-domain sockets."""

import os
import stat
import threading

import numpy as np
import pytest

from platoon import EASGD, Controller, Worker


class Echo(Controller):
    def handle_control(self, req, worker_id, req_info):
        return [req, worker_id, req_info]


def test_ipc_controller_serves_requests_syncs_and_minibatches(serve):
    ctl = Echo(control_port=0, data_port=0, num_workers=2, transport="ipc")
    assert ctl.control_address.startswith("ipc://") and ctl.control_port is None
    assert ctl.data_address.startswith("ipc://")
    ipc_dir = os.path.dirname(ctl.control_address[len("ipc://"):])
    assert stat.S_IMODE(os.stat(ipc_dir).st_mode) == 0o700
    serving = serve(ctl)
    batch = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    sender = threading.Thread(target=lambda: ctl.send_mb(batch, timeout_s=10))
    with Worker(ctl.control_address, data_port=ctl.data_address, timeout_s=10) as a, \
            Worker(ctl.control_address, timeout_s=10) as b:
        assert a.send_req("ping", {"n": 1}) == ["ping", 0, {"n": 1}]
        assert b.send_req("ping") == ["ping", 1, None]
        pa, pb = [np.full(5, 2.0)], [np.zeros(5)]
        a.init_shared_params(pa, EASGD(0.5))
        b.init_shared_params(pb, EASGD(0.5))
        pb[0] += 2.0
        b.sync_params()
        np.testing.assert_array_equal(ctl.centre[0], 3.0)
        sender.start()
        np.testing.assert_array_equal(a.recv_mb()[0], batch[0])
    sender.join(10)
    serving.join()
    ctl.close()
    assert not os.path.exists(ipc_dir)


def test_ipc_needs_port_zero_and_transport_is_checked():
    with Controller(transport="ipc") as ctl:
        with pytest.raises(ValueError, match="port 0"):
            ctl.init_control(5567)
        ctl.init_control(0)
        ipc_dir = os.path.dirname(ctl.control_address[len("ipc://"):])
    assert not os.path.exists(ipc_dir)
    with pytest.raises(ValueError, match="'tcp' or 'ipc'"):
        Controller(transport="udp")


def test_tcp_controller_reports_its_address():
    with Controller(control_port=0) as ctl:
        assert ctl.control_address == "tcp://127.0.0.1:%d" % ctl.control_port
