"""A small numpy MLP and the digits data split shared by the example's controller and workers."""

import numpy as np

HIDDEN = 128
BATCH_SIZE = 32  # defaults shared by the workers and the controller's single-process baseline
# Learning rates from 0.1, 0.2, 0.4, 0.8 tried (3 seeds each): one process reached the best
# validation accuracy (96.9%) soonest at 0.4 (0.8 is quicker to 96% but stops at 96.6%); the
# workers did best at 0.8: the elastic pull toward the centre damps their steps.
LR = 0.4  # the single-process baseline
WORKER_LR = 0.8


def load_split(seed=0):
    """scikit-learn's bundled 8x8 digits (no download), split train/valid/test = 60/20/20%."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test, n_valid = len(y) // 5, len(y) // 5
    test = x[:n_test], y[:n_test]
    valid = x[n_test:n_test + n_valid], y[n_test:n_test + n_valid]
    train = x[n_test + n_valid:], y[n_test + n_valid:]
    return train, valid, test


def init_params(n_in=64, n_out=10, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n_in, HIDDEN)) * np.sqrt(2.0 / n_in)).astype(np.float32),
            np.zeros(HIDDEN, np.float32),
            (rng.normal(size=(HIDDEN, n_out)) * np.sqrt(1.0 / HIDDEN)).astype(np.float32),
            np.zeros(n_out, np.float32)]


def logits(params, x):
    w1, b1, w2, b2 = params
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def loss_and_grads(params, x, y):
    """Mean cross-entropy of a minibatch and its gradients with respect to `params`."""
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0.0)
    z = h @ w2 + b2
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    dz = p
    dz[np.arange(len(y)), y] -= 1.0
    dz /= len(y)
    dh = (dz @ w2.T) * (h > 0)
    return loss, [x.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]


def error_rate(params, x, y):
    return float((logits(params, x).argmax(axis=1) != y).mean())


def sgd_step(params, x, y, lr):
    """One plain SGD step on a minibatch, updating `params` in place; returns the loss."""
    loss, grads = loss_and_grads(params, x, y)
    for p, g in zip(params, grads):
        p -= lr * g
    return loss


class EarlyStopping:
    """Patience-based early stopping on a validation error: `done` once the error has not
    improved for `patience` evaluations in a row, or once `max_minibatches` were trained.
    Shared by the platoon controller and the single-process baseline, so both stop alike."""

    def __init__(self, patience, max_minibatches):
        self.patience = patience
        self.max_minibatches = max_minibatches
        self.best_error = np.inf
        self.best_params = None
        self.best_time_s = None
        self.bad_evals = 0
        self.done = False

    def update(self, error, params, minibatches, time_s):
        """Record one evaluation (`params` is kept, not copied); returns `done`."""
        if error < self.best_error:
            self.best_error, self.best_params, self.best_time_s = error, params, time_s
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        self.done = self.bad_evals >= self.patience or minibatches >= self.max_minibatches
        return self.done
