"""The LSTM example's controller: hands out work until the workers' validation error
stops improving (patience, in reports per worker) or a minibatch budget is spent; then
every worker stops.
"""

import argparse

from platoon import Controller


class LSTMController(Controller):
    def __init__(self, patience, max_minibatches, **kwargs):
        super().__init__(**kwargs)
        self.patience = patience
        self.max_minibatches = max_minibatches
        self.minibatches = 0
        self.best_error = 1.0
        self.bad_reports = 0
        self.stopping = False

    def handle_control(self, req, worker_id, req_info):
        if req == "next":
            # Patience per worker: n workers report n times as often as one. Once stopping,
            # every worker stops (a later improvement must not restart only some of them).
            self.stopping = self.stopping or self.minibatches >= self.max_minibatches \
                or self.bad_reports >= self.patience * max(1, len(self.workers))
            return "stop" if self.stopping else "train"
        if req == "done":
            self.minibatches += req_info["n"]
            # the worker's PeriodicSync reports its minibatches: only the metrics here
            self.add_progress(worker_id, 0, req_info["syncs"],
                              {"loss": req_info["loss"], "valid_error": req_info["valid_error"]})
            if req_info["valid_error"] < self.best_error:
                self.best_error, self.bad_reports = req_info["valid_error"], 0
            else:
                self.bad_reports += 1
            return None
        raise ValueError("unknown request %r" % (req,))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="by hand: port to listen on")
    parser.add_argument("--workers", type=int, default=None, help="by hand: number of workers")
    parser.add_argument("--patience", type=int, default=60,
                        help="reports per worker without progress")
    parser.add_argument("--max-minibatches", type=int, default=6000)
    args = parser.parse_args()
    with LSTMController(args.patience, args.max_minibatches, control_port=args.port,
                        num_workers=args.workers) as ctl:
        if ctl.control_port is None:
            ctl.init_control(5567)
        ctl.serve()
        print("trained %d minibatches with %d workers; best validation error %.4f"
              % (ctl.minibatches, len(ctl.workers), ctl.best_error))


if __name__ == "__main__":
    main()
