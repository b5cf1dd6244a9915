"""A worker that takes COUNT minibatches and prints FAULTS <minor page faults per minibatch of
its ZeroMQ I/O threads> (from /proc; the first tenth, as the heap grows, not counted).

usage: mb_faults_worker.py CONTROL_PORT DATA_PORT COUNT
"""

import os
import sys

from platoon import Worker


def io_thread_faults():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                if not f.read().startswith("ZMQbg/IO"):
                    continue
            with open("/proc/self/task/%s/stat" % tid) as f:
                total += int(f.read().rsplit(")", 1)[1].split()[7])  # minflt
        except OSError:
            pass
    return total


control_port, data_port, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with Worker(control_port, timeout_s=30) as w:
    w.init_mb_sock(data_port)
    for _ in range(count // 10):
        w.recv_mb()
    before = io_thread_faults()
    for _ in range(count - count // 10):
        w.recv_mb()
    print("FAULTS %.3f" % ((io_thread_faults() - before) / (count - count // 10)), flush=True)
