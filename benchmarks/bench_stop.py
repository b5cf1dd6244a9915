"""The stop signal's check against what a loop would otherwise pay to learn it: a control
round trip (asking the controller "go on?" every iteration) and one sync of a small model."""

import numpy as np

from platoon import EASGD, Worker

from ._util import Children, interleaved

SIZES = (64, 128, 128, 10)  # the digits MLP: about 26K float32


def stop_check(count=2000, rounds=8):
    """Best µs per call of `Worker.stop_requested`, `Worker.send_req` and `sync_params`."""
    with Children() as children:
        ctl = children.start("ping_controller", "tcp")
        with Worker(ctl.line("ADDR")[0], timeout_s=30) as w:
            params = [np.zeros((a, b), np.float32) for a, b in zip(SIZES, SIZES[1:])]
            w.init_shared_params(params, EASGD(0.5))

            def check():
                return w.stop_requested

            t_check, t_request, t_sync = interleaved(
                [check, lambda: w.send_req("ping"), w.sync_params], rounds, count)
        ctl.wait(30)
    return {"check_us": t_check * 1e6, "round_trip_us": t_request * 1e6,
            "sync_us": t_sync * 1e6, "params": sum(p.size for p in params)}
