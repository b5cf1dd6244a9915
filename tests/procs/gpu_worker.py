"""A worker for GPU tests: a tensor on cuda:0 (or DEVICE) synced in turn with the others.

usage: gpu_worker.py PORT NUM_WORKERS DTYPE [DEVICE]
Every worker starts from zeros (DTYPE: float32 or bfloat16), adds worker_id + 1, then syncs
(EASGD 0.5) in worker-id order between barriers. Prints "DEVICE <device> <name>",
"RESULT <worker_id> <value of element 0>" (all elements are equal) and "DONE <worker_id>".
"""

import sys

import torch

from platoon import EASGD, Worker


def main():
    port, num_workers, dtype = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3])
    device = sys.argv[4] if len(sys.argv) > 4 else "cuda:0"
    x = torch.zeros(1000, device=device, dtype=dtype)
    name = torch.cuda.get_device_name(x.device) if x.is_cuda else "host"
    print("DEVICE %s %s" % (x.device, name), flush=True)
    with Worker(control_port=port, timeout_s=60) as w:
        w.init_shared_params([x], EASGD(0.5))
        w.barrier()
        x += w.worker_id + 1
        for turn in range(num_workers):
            if turn == w.worker_id:
                w.sync_params()
            w.barrier()
        values = x.float().cpu()
        assert bool((values == values[0]).all()), values
        print("RESULT %d %r" % (w.worker_id, values[0].item()), flush=True)
        print("DONE %d" % w.worker_id, flush=True)


if __name__ == "__main__":
    main()
