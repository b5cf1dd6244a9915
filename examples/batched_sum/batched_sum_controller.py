"""The controller feeds minibatches over the data channel and checks the workers' sums.

Run by the launcher:  platoon-launcher examples/batched_sum/batched_sum -n 2
"""

import argparse
import threading

import numpy as np

from platoon import Controller


class BatchedSumController(Controller):
    def __init__(self, batches, **kwargs):
        super().__init__(**kwargs)
        self.expected = {}
        self.checked = 0
        self.wrong = []
        self.batches = batches

    def handle_control(self, req, worker_id, req_info):
        if req == "next":  # a worker found its queue empty: done once every sum is in
            return "stop" if self.checked >= self.batches else "wait"
        if req == "result":
            want = self.expected.pop(req_info["batch"])
            self.checked += 1
            if not np.isclose(req_info["sum"], want):
                self.wrong.append((req_info["batch"], req_info["sum"], want))
            self.add_progress(worker_id, 1, metrics={"checked": self.checked})
            return None
        raise ValueError("unknown request %r" % (req,))

    def feed(self, batches, batch_size, seed=0):
        """Send every minibatch (run in a thread while serve() answers requests)."""
        rng = np.random.default_rng(seed)
        for i in range(batches):
            data = rng.normal(size=(batch_size, 8)).astype(np.float32)
            self.expected[i] = float(data.astype(np.float64).sum())
            self.send_mb([np.array([i], np.int64), data])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    with BatchedSumController(args.batches) as ctl:
        if ctl.control_port is None:
            ctl.init_control(5567)
        ctl.init_data()
        feeder = threading.Thread(target=ctl.feed, args=(args.batches, args.batch_size),
                                  daemon=True)
        feeder.start()
        ctl.serve()
        feeder.join(10)
        print("checked %d sums from %d workers: %d wrong"
              % (ctl.checked, len(ctl.workers), len(ctl.wrong)))
        if ctl.wrong or ctl.checked != args.batches:
            raise SystemExit("batched_sum failed: %r" % ctl.wrong[:5])


if __name__ == "__main__":
    main()
