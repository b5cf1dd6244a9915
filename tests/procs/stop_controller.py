"""A controller for the stop-signal tests: answers "ping" with "pong", prints PORT and JOB,
serves until its workers have left, then prints SERVED <stop_requested> <reason>.

usage: stop_controller.py NUM_WORKERS
"""

import logging
import sys

from platoon import Controller


class PingController(Controller):
    def handle_control(self, req, worker_id, req_info):
        if req == "ping":
            return "pong"
        raise ValueError("unknown request %r" % (req,))


logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
with PingController(control_port=0, num_workers=int(sys.argv[1])) as ctl:
    print("PORT %d" % ctl.control_port, flush=True)
    print("JOB %s" % ctl.job_id, flush=True)
    ctl.serve(timeout_s=60)
    print("SERVED %s %s" % (ctl.stop_requested, ctl.stop_reason), flush=True)
