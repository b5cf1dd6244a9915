"""A controller for tests: counts 'step' requests, prints its port, saves the centre at the end.

usage: step_controller.py NUM_WORKERS CENTRE_OUT [SERVE_TIMEOUT_S]
"""

import sys

import numpy as np

from platoon import Controller


class StepController(Controller):
    steps = 0

    def handle_control(self, req, worker_id, req_info):
        if req == "step":
            self.steps += 1
            return self.steps
        if req == "fail":
            raise KeyError("deliberate failure for worker %d" % worker_id)
        raise ValueError("unknown request %r" % (req,))


def main():
    num_workers, centre_out = int(sys.argv[1]), sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    with StepController(control_port=0, data_port=0, num_workers=num_workers) as ctl:
        print("PORT %d" % ctl.control_port, flush=True)
        print("DATA %d" % ctl.data_port, flush=True)
        print("JOB %s" % ctl.job_id, flush=True)
        ctl.serve(timeout_s=timeout)
        if ctl.centre is not None:
            np.savez(centre_out, *ctl.centre)
        print("STEPS %d" % ctl.steps, flush=True)


if __name__ == "__main__":
    main()
