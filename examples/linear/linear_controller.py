"""Controller of the linear-regression example: hands out work until a step budget is spent.

Run by hand:  python linear_controller.py --port 5567 --workers 2
"""

import argparse
import logging
import os

import numpy as np

from platoon import Controller


class LinearController(Controller):
    def __init__(self, max_steps, **kwargs):
        super().__init__(**kwargs)
        self.max_steps = max_steps
        self.steps = 0

    def handle_control(self, req, worker_id, req_info):
        if req == "next":
            return "stop" if self.steps >= self.max_steps else "train"
        if req == "done":
            self.steps += req_info["n"]
            return None
        raise ValueError("unknown request %r" % (req,))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("PLATOON_CONTROL_PORT", 5567)))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4000, help="minibatches in total")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(message)s")
    with LinearController(args.steps, control_port=args.port, num_workers=args.workers) as ctl:
        ctl.serve()
        (w,) = ctl.centre
        true_w = np.arange(w.size, dtype=w.dtype) / w.size
        print("trained %d minibatches; distance of the centre to the true weights: %.4f"
              % (ctl.steps, float(np.linalg.norm(w - true_w))))


if __name__ == "__main__":
    main()
