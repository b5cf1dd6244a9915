"""The single-process baseline for the digits example: the workers' MLP, initial parameters,
minibatch size and learning rate, trained with plain SGD in this process (no platoon), under the
controller's early-stopping rule and evaluation cadence (in minibatches)."""

import time

import numpy as np

import mlp


def train_single_process(patience, eval_every, max_minibatches, batch_size=mlp.BATCH_SIZE,
                         lr=mlp.LR, seed=1000):
    """Train until `mlp.EarlyStopping(patience, max_minibatches)` says stop, evaluating the
    validation error every `eval_every` minibatches. `seed` draws the minibatches (worker 0's).

    Returns (stopping, curve, minibatches): the `EarlyStopping` (best error, params and time),
    the list of (seconds since the first step, validation error), and minibatches trained.
    """
    (x_train, y_train), (x_valid, y_valid), _ = mlp.load_split()
    params = mlp.init_params()
    rng = np.random.default_rng(seed)
    stopping = mlp.EarlyStopping(patience, max_minibatches)
    curve, minibatches = [], 0
    start = time.monotonic()
    while not stopping.done:
        for _ in range(eval_every):
            idx = rng.integers(0, len(y_train), batch_size)
            mlp.sgd_step(params, x_train[idx], y_train[idx], lr)
        minibatches += eval_every
        now = time.monotonic() - start
        error = mlp.error_rate(params, x_valid, y_valid)
        curve.append((now, error))
        stopping.update(error, [p.copy() for p in params], minibatches, now)
    return stopping, curve, minibatches
