"""A digits worker: SGD on minibatches of the training set, EASGD with the centre, until the
controller's early stopping asks the job to stop (`Worker.stop_requested`).

Run by the launcher:  platoon-launcher examples/digits/digits -n 2
"""

import argparse

import numpy as np

from platoon import EASGD, Worker

import mlp


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="by hand: the controller's port")
    parser.add_argument("--batch-size", type=int, default=mlp.BATCH_SIZE)
    parser.add_argument("--lr", type=float, default=mlp.WORKER_LR)
    parser.add_argument("--sync-every", type=int, default=10, help="minibatches between syncs")
    parser.add_argument("--report-every", type=int, default=5,
                        help="syncs between reports to the controller (each with the worker's "
                        "validation error)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="EASGD elastic force (default 0.9 / number of workers)")
    args = parser.parse_args()

    (x_train, y_train), (x_valid, y_valid), _ = mlp.load_split()
    params = mlp.init_params()
    with Worker(control_port=args.port) as w:
        rng = np.random.default_rng(1000 + w.worker_id)
        alpha = args.alpha if args.alpha is not None else min(0.9 / w.global_size, 1.0)
        w.init_shared_params(params, param_sync_rule=EASGD(alpha))
        print("worker %d on %s, alpha %.3g" % (w.worker_id, w.device, alpha), flush=True)
        w.send_req("start")  # the controller's clock starts
        while not w.stop_requested:
            for _ in range(args.sync_every):
                idx = rng.integers(0, len(y_train), args.batch_size)
                loss = mlp.sgd_step(params, x_train[idx], y_train[idx], args.lr)
            w.sync_params()
            if w.syncs % args.report_every == 0:  # a round trip and an evaluation: not each sync
                w.send_req("done", {"n": args.sync_every * args.report_every, "syncs": w.syncs,
                                    "loss": loss,
                                    "valid_error": mlp.error_rate(params, x_valid, y_valid)})


if __name__ == "__main__":
    main()
