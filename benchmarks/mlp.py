"""A small numpy MLP on scikit-learn's digits, for the training benchmarks.

Single-threaded numpy (the benchmark caps BLAS threads); parameters are a list
of float32 arrays updated in place, as platoon needs.
"""

import numpy as np


def load_digits_split(path=None, seed=0):
    """(x_train, y_train, x_test, y_test) of the digits, features scaled to [0, 1].

    With `path`, the arrays are cached there as .npz (children load that, not sklearn).
    """
    if path is not None:
        try:
            with np.load(path) as f:
                return f["xtr"], f["ytr"], f["xte"], f["yte"]
        except FileNotFoundError:
            pass
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the training benchmarks need scikit-learn for the digits data: "
                         "pip install -e '.[bench]'") from None
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = len(x) * 4 // 5
    split = x[:cut], y[:cut], x[cut:], y[cut:]
    if path is not None:
        np.savez(path, xtr=split[0], ytr=split[1], xte=split[2], yte=split[3])
    return split


def init_params(sizes, seed=0):
    """He-initialised [W1, b1, W2, b2, ...] for layer sizes such as (64, 512, 512, 10)."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in))
                      .astype(np.float32))
        params.append(np.zeros(n_out, np.float32))
    return params


def forward(params, x):
    """Activations of every layer (ReLU hidden layers, linear output)."""
    acts = [x]
    for i in range(0, len(params), 2):
        z = acts[-1] @ params[i]
        z += params[i + 1]
        if i + 2 < len(params):
            np.maximum(z, 0, out=z)
        acts.append(z)
    return acts


def sgd_step(params, x, y, lr):
    """One minibatch of softmax cross-entropy SGD, in place; returns the loss."""
    acts = forward(params, x)
    logits = acts[-1]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()
    grad = probs
    grad[np.arange(len(y)), y] -= 1
    grad /= len(y)
    for i in range(len(params) - 2, -1, -2):
        a = acts[i // 2]
        g_w = a.T @ grad
        g_b = grad.sum(axis=0)
        if i > 0:
            grad = grad @ params[i].T
            grad *= acts[i // 2] > 0
        params[i] -= lr * g_w
        params[i + 1] -= lr * g_b
    return float(loss)


def accuracy(params, x, y):
    return float((forward(params, x)[-1].argmax(axis=1) == y).mean())
