"""How fast failures are noticed and recovered from: python benchmarks/fault_timings.py

For each trial a worker process takes the centre's lock and is SIGKILLed; we time
(a) until another worker gets the lock and syncs, (b) until the controller's
handle_worker_death runs, and (c) until a worker notices a SIGKILLed controller.
"""

import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

from platoon import EASGD, Controller, Worker
from platoon._centre.shmem import pid_alive, segment_owner

HOLDER = textwrap.dedent("""
    import sys, time, numpy as np
    from platoon import EASGD, Worker
    w = Worker(int(sys.argv[1]), timeout_s=30)
    w.init_shared_params([np.zeros(1000)], EASGD(0.5))
    w.lock()
    print("HOLDING", flush=True)
    time.sleep(60)
""")

CONTROLLER = textwrap.dedent("""
    from platoon import Controller
    with Controller(control_port=0, num_workers=2) as ctl:
        print(ctl.control_port, flush=True)
        ctl.serve(timeout_s=60)
""")


class Watching(Controller):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.died = threading.Event()

    def handle_control(self, req, worker_id, req_info):
        return None

    def handle_worker_death(self, worker_id, exit_info):
        self.died.set()


def worker_death_trial():
    ctl = Watching(control_port=0, liveness_interval_s=0.5)
    server = threading.Thread(target=ctl.serve, kwargs={"timeout": 60})
    server.start()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ctl.control_port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "HOLDING"
        with Worker(ctl.control_port, timeout_s=30) as w:
            params = [np.zeros(1000)]
            holder.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            holder.wait()
            w.init_shared_params(params, EASGD(0.5))
            w.sync_params()
            lock_s = time.monotonic() - killed
            ctl.died.wait(10)
            death_s = time.monotonic() - killed
    finally:
        holder.kill()
        holder.wait()
        server.join(30)
        ctl.close()
    return lock_s, death_s


def controller_death_trial():
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(ctl.stdout.readline())
        with Worker(port, timeout_s=30) as w:
            ctl.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            ctl.wait()
            try:
                w.barrier(timeout_s=None)
            except Exception:  # ControllerGone
                pass
            return time.monotonic() - killed
    finally:
        ctl.kill()
        ctl.wait()
        Controller().close()  # removes the centre the killed controller left behind


def main(trials=5):
    lock, death, gone = [], [], []
    for _ in range(trials):
        a, b = worker_death_trial()
        lock.append(a)
        death.append(b)
        gone.append(controller_death_trial())
    for name, values in (("lock free again after its holder is SIGKILLed", lock),
                         ("controller's handle_worker_death runs", death),
                         ("worker notices a SIGKILLed controller", gone)):
        print("%-48s median %7.1f ms  max %7.1f ms" % (name, 1000 * statistics.median(values),
                                                       1000 * max(values)))
    leaked = [n for n in os.listdir("/dev/shm") if n.startswith("platoon-")
              and not pid_alive(segment_owner(os.path.join("/dev/shm", n)) or 0)]
    print("centres of dead jobs left in /dev/shm: %d" % len(leaked))


if __name__ == "__main__":
    main()
