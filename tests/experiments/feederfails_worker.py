"""Waits for minibatches (40 s each) until the job stops."""

from platoon import Worker

with Worker(timeout_s=30) as w:
    w.init_mb_sock()
    while True:
        w.recv_mb(timeout_s=40)
