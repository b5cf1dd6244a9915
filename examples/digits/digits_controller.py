"""The digits controller: hands out work, early-stops on the centre's validation error, then
trains a single-process baseline (same MLP, initial parameters, minibatch size, learning rate and
early stopping); reports both test accuracies and plots both validation curves against time.

Run by the launcher:  platoon-launcher examples/digits/digits -n 2
"""

import argparse
import logging
import os
import time

import numpy as np

from platoon import Controller

import baseline
import mlp

log = logging.getLogger("digits")


class DigitsController(Controller):
    """Early-stops on the centre's validation error (`mlp.EarlyStopping`), evaluated every
    `eval_every` minibatches summed over the workers, through the job's stop signal
    (`request_stop`: every worker sees it at once). Time counts from the first request."""

    def __init__(self, patience, eval_every, max_minibatches, **kwargs):
        super().__init__(**kwargs)
        _, (self.x_valid, self.y_valid), (self.x_test, self.y_test) = mlp.load_split()
        self.eval_every = eval_every
        self.stopping = mlp.EarlyStopping(patience, max_minibatches)
        self.minibatches = 0
        self.next_eval = eval_every
        self.start = None
        self.curves = {"centre": []}

    def elapsed_s(self):
        if self.start is None:
            self.start = time.monotonic()
        return time.monotonic() - self.start

    def handle_control(self, req, worker_id, req_info):
        now = self.elapsed_s()
        if req == "start":
            return None
        if req == "done":
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
        self.stopping.update(error, params, self.minibatches, now)
        log.info("%d minibatches, %.1f s: centre validation error %.4f (best %.4f)",
                 self.minibatches, now, error, self.stopping.best_error)
        if self.stopping.done and not self.stop_requested:
            self.request_stop("early stopping after %d minibatches: best validation error %.4f"
                              % (self.minibatches, self.stopping.best_error))


class Run:
    """One finished training run as the plot and the comparison line see it."""

    def __init__(self, name, curve, stopping, x_test, y_test):
        self.name, self.curve, self.stopping = name, curve, stopping
        self.accuracy = 1.0 - mlp.error_rate(stopping.best_params, x_test, y_test)

    def time_to(self, error):
        """Seconds until the validation error first reached `error`, or None."""
        return next((t for t, e in self.curve if e <= error), None)


TARGETS = (0.99, 0.98, 0.97, 0.96, 0.95, 0.9, 0.8, 0.5)  # validation accuracies


def comparison(runs):
    """The line comparing the runs' times to the best validation accuracy all of them reach."""
    best = min(1.0 - r.stopping.best_error for r in runs)
    target = next((a for a in TARGETS if a <= best + 1e-9), TARGETS[-1])
    times = [r.time_to(1.0 - target + 1e-9) for r in runs]
    parts = ["%s %s" % (r.name, "not reached" if t is None else "%.1f s" % t)
             for r, t in zip(runs, times)]
    line = "time to %g%% validation accuracy: %s" % (100 * target, ", ".join(parts))
    if len(runs) == 2 and None not in times and times[0] > 0:
        line += " (speed-up %.2fx)" % (times[1] / times[0])
    return line


def plot(path, runs, workers):
    """Validation error (%, log scale) against seconds: each run's curve, workers' lighter."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, run in enumerate(runs):
        colour = "C%d" % i
        t, err = zip(*run.curve)
        ax.plot(t, 100 * np.asarray(err), color=colour, linewidth=2.2,
                label="%s: test accuracy %.2f%%, best validation at %.1f s"
                      % (run.name, 100 * run.accuracy, run.stopping.best_time_s))
        ax.plot(run.stopping.best_time_s, 100 * run.stopping.best_error, "o", color=colour)
        if i == 0:
            for name, points in sorted(workers.items()):
                if points:
                    wt, werr = zip(*points)
                    ax.plot(wt, 100 * np.asarray(werr), color=colour, linewidth=0.7, alpha=0.3,
                            label="%s (own parameters)" % name)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 70, 100]))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g%%" % v))
    errors = [100 * e for run in runs for _, e in run.curve]
    ax.set_ylim(0.85 * min(errors), min(100.0, 1.2 * max(errors)))
    ax.set_xlim(left=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("seconds since training started")
    ax.set_ylabel("validation error")
    ax.set_title("digits MLP: %s" % " vs ".join(r.name for r in runs))
    ax.legend(fontsize=8)
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
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the single-process baseline")
    parser.add_argument("--batch-size", type=int, default=mlp.BATCH_SIZE,
                        help="baseline minibatch size (match the workers')")
    parser.add_argument("--lr", type=float, default=mlp.LR,
                        help="baseline learning rate (the workers' is their --lr)")
    args = parser.parse_args()
    with DigitsController(args.patience, args.eval_every, args.max_minibatches,
                          control_port=args.port, num_workers=args.workers) as ctl:
        if ctl.control_port is None:
            ctl.init_control(5567)
        # under the launcher, next to the job's logs
        plot_path = args.plot or os.path.join(ctl.log_dir or ".", "digits_curves.png")
        ctl.serve()
        ctl.evaluate_centre(ctl.elapsed_s())
        n_workers = len(ctl.workers)
        name = "%d worker%s" % (n_workers, "s" * (n_workers != 1))
        platoon = Run(name, ctl.curves.pop("centre"), ctl.stopping, ctl.x_test, ctl.y_test)
        print("trained %d minibatches in %.1f s with %d workers; best validation error %.4f"
              % (ctl.minibatches, ctl.elapsed_s(), n_workers, ctl.stopping.best_error))
        print("test accuracy %.2f%%" % (100 * platoon.accuracy))
    runs = [platoon]

    if not args.no_baseline:
        log.info("training the single-process baseline")
        stopping, curve, minibatches = baseline.train_single_process(
            args.patience, args.eval_every, args.max_minibatches, args.batch_size, args.lr)
        single = Run("single process", curve, stopping, ctl.x_test, ctl.y_test)
        runs.append(single)
        print("single process: trained %d minibatches in %.1f s; best validation error %.4f; "
              "test accuracy %.2f%%" % (minibatches, curve[-1][0], stopping.best_error,
                                        100 * single.accuracy))
        print(comparison(runs))
    plot(plot_path, runs, ctl.curves)
    print("training curves written to %s" % plot_path)


if __name__ == "__main__":
    main()
