"""The digits controller: hands out work, early-stops on the centre's validation error,
reports test accuracy, and plots validation error against time for each worker and the centre.

Run by the launcher:  platoon-launcher examples/digits/digits -n 2
"""

import argparse
import logging
import os
import time

import numpy as np

import mlp
from platoon import Controller
from platoon.environment import JobEnvironment

log = logging.getLogger("digits")


class DigitsController(Controller):
    """Patience-based early stopping: stop once the centre's validation error has not
    improved for `patience` evaluations in a row (or after `max_minibatches`)."""

    def __init__(self, patience, eval_every, max_minibatches, **kwargs):
        super().__init__(**kwargs)
        _, (self.x_valid, self.y_valid), (self.x_test, self.y_test) = mlp.load_split()
        self.patience = patience
        self.eval_every = eval_every
        self.max_minibatches = max_minibatches
        self.minibatches = 0
        self.next_eval = eval_every
        self.best_error = np.inf
        self.best_params = None
        self.bad_evals = 0
        self.stopping = False
        self.start = time.monotonic()
        self.curves = {"centre": []}

    def handle_control(self, req, worker_id, req_info):
        if req == "next":
            return "stop" if self.stopping else "train"
        if req == "done":
            now = time.monotonic() - self.start
            self.minibatches += req_info["n"]
            self.add_progress(worker_id, req_info["n"], req_info["syncs"],
                              {"loss": req_info["loss"], "valid_error": req_info["valid_error"]})
            self.curves.setdefault("worker %d" % worker_id, []).append(
                (now, req_info["valid_error"]))
            if self.minibatches >= self.next_eval:
                self.next_eval += self.eval_every
                self.evaluate_centre(now)
            return None
        raise ValueError("unknown request %r" % (req,))

    def evaluate_centre(self, now):
        params = self.snapshot_centre()
        error = mlp.error_rate(params, self.x_valid, self.y_valid)
        self.curves["centre"].append((now, error))
        if error < self.best_error:
            self.best_error, self.best_params, self.bad_evals = error, params, 0
        else:
            self.bad_evals += 1
        log.info("%d minibatches, %.1f s: centre validation error %.4f (best %.4f)",
                 self.minibatches, now, error, self.best_error)
        if self.bad_evals >= self.patience or self.minibatches >= self.max_minibatches:
            self.stopping = True

    def plot(self, path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, points in sorted(self.curves.items()):
            if points:
                t, err = zip(*points)
                ax.plot(t, err, label=name, linewidth=2.5 if name == "centre" else 1.0)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("validation error")
        ax.set_yscale("log")
        ax.set_title("digits MLP, EASGD with %d workers" % len(self.workers))
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="by hand: port to listen on")
    parser.add_argument("--workers", type=int, default=None, help="by hand: number of workers")
    parser.add_argument("--patience", type=int, default=15, help="evaluations without progress")
    parser.add_argument("--eval-every", type=int, default=200, help="minibatches, all workers")
    parser.add_argument("--max-minibatches", type=int, default=30000)
    parser.add_argument("--plot", default=None, help="PNG path (default: the log directory)")
    args = parser.parse_args()
    status = JobEnvironment.read().status_file  # under the launcher: its log directory
    plot = args.plot or os.path.join(os.path.dirname(status) if status else ".",
                                     "digits_curves.png")

    with DigitsController(args.patience, args.eval_every, args.max_minibatches,
                          control_port=args.port, num_workers=args.workers) as ctl:
        if ctl.control_port is None:
            ctl.init_control(5567)
        ctl.serve()
        ctl.evaluate_centre(time.monotonic() - ctl.start)
        accuracy = 1.0 - mlp.error_rate(ctl.best_params, ctl.x_test, ctl.y_test)
        ctl.plot(plot)
        print("trained %d minibatches in %.1f s with %d workers; best validation error %.4f"
              % (ctl.minibatches, time.monotonic() - ctl.start, len(ctl.workers),
                 ctl.best_error))
        print("test accuracy %.2f%%" % (100 * accuracy))
        print("training curves written to %s" % plot)


if __name__ == "__main__":
    main()
