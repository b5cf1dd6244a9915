"""A batched_sum worker: sums the minibatches the controller sends until it says stop.

A worker gets minibatches only when it asks (recv_mb, more prefetched within its window), so it
keeps taking them until the controller has every result, asking whenever none arrives for a moment.
"""

import numpy as np

from platoon import MinibatchTimeout, Worker


def main():
    with Worker() as w:
        w.init_mb_sock()
        while True:
            try:
                index, data = w.recv_mb(timeout_s=0.5)
            except MinibatchTimeout:
                if w.send_req("next") == "stop":
                    break
                continue
            w.send_req("result", {"batch": int(index[0]),
                                  "sum": float(data.astype(np.float64).sum())})


if __name__ == "__main__":
    main()
