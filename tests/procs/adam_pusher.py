"""A Downpour(Adam) worker whose every push moves each central value by exactly -LR and adds
one to Adam's step count in the shared state, so a consistent snapshot of the job holds
centre == -LR * steps (from a zero centre), parameter by parameter.

usage: adam_pusher.py PORT
Pushes until killed (exits by itself after 60 s); prints READY after its first push.
Adam(beta1=0, beta2=0, eps=1e-300) with g = STEP (a power of two) gives m_hat = g and
sqrt(v_hat) = g exactly, so each update is lr * g / (g + eps) = lr, exactly.
"""

import sys
import time

import numpy as np

from platoon import Adam, Downpour, Worker

SHAPES = [(4096,), (3,)]
STEP = 0.015625  # 2**-6: the descent each push carries
LR = 0.0625  # 2**-4: the centre's move per push


def main():
    params = [np.zeros(shape) for shape in SHAPES]
    with Worker(control_port=int(sys.argv[1]), timeout_s=30) as w:
        w.init_shared_params(params, Downpour(Adam(LR, beta1=0.0, beta2=0.0, eps=1e-300)))
        deadline = time.monotonic() + 60
        pushes = 0
        while time.monotonic() < deadline:
            for p in params:
                p -= STEP
            w.sync_params()
            pushes += 1
            if pushes == 1:
                print("READY", flush=True)


if __name__ == "__main__":
    main()
