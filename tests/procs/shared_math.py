"""Parameters and local changes shared by the sync tests and their worker processes."""

import numpy as np

SHAPES = [(7, 300), (1001,)]


def initial_params(dtype):
    return [np.linspace(-1.0, 1.0, int(np.prod(s)), dtype=dtype).reshape(s) for s in SHAPES]


def local_delta(worker_id, round_index, dtype):
    scale = 0.01 * (worker_id + 1) * (round_index + 1)
    return [(scale * np.cos(np.arange(int(np.prod(s))) * (worker_id + 1))).astype(dtype).reshape(s)
            for s in SHAPES]
