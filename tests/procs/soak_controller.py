"""Soak-test controller: counts requests, sums the workers' reported total changes, and
prints its memory use at the first and the last quarter of the run.

usage: soak_controller.py NUM_WORKERS EXPECTED_STEPS OUT
"""

import json
import sys

import numpy as np

from platoon import Controller


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class SoakController(Controller):
    def __init__(self, expected_steps, **kwargs):
        super().__init__(**kwargs)
        self.expected_steps = expected_steps
        self.steps = 0
        self.total_change = None
        self.rss = []

    def handle_control(self, req, worker_id, req_info):
        if req == "step":
            self.steps += 1
            if self.steps in (self.expected_steps // 4, self.expected_steps):
                self.rss.append(rss_kib())
            return self.steps
        if req == "total":
            change = np.array(req_info, dtype=np.float64)
            self.total_change = change if self.total_change is None else self.total_change + change
            return None
        raise ValueError("unknown request %r" % (req,))


def main():
    num_workers, expected, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with SoakController(expected, control_port=0, num_workers=num_workers) as ctl:
        print("PORT %d" % ctl.control_port, flush=True)
        ctl.serve(timeout_s=120)
        with open(out, "w") as f:
            json.dump({"steps": ctl.steps, "rss_kib": ctl.rss,
                       "centre": ctl.centre[0].tolist(),
                       "total_change": ctl.total_change.tolist()}, f)
        print("DONE", flush=True)


if __name__ == "__main__":
    main()
