"""A worker receiving minibatches keeps its heap (`platoon._os.heap`): its ZeroMQ I/O thread
does not touch fresh pages for each one, and a user's own malloc settings are left alone."""

import os
import subprocess
import sys

import numpy as np
import pytest

from platoon import Controller

GLIBC = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None


@pytest.mark.skipif(not GLIBC or not os.path.exists("/proc/self/task"),
                    reason="glibc's malloc and /proc (Linux) only")
def test_a_stream_of_16_kib_minibatches_touches_no_fresh_pages(serve, procs):
    """Before: glibc trimmed the I/O thread's heap after each burst of minibatches and the
    next ones faulted its pages in again: 2.1 minor faults per 16 KiB minibatch (raw
    PUSH/PULL: 0.5-0.8), and 15-16 us of that thread's CPU against 10 us with the heap kept."""
    ctl = Controller(control_port=0, data_port=0, num_workers=1)
    serving = serve(ctl, timeout=90)
    count = 3000
    worker = procs("mb_faults_worker.py", ctl.control_port, ctl.data_port, count)
    batch = [np.ones((64, 64), np.float32), np.arange(64, dtype=np.int64)]  # 16.5 KiB
    for _ in range(count):
        ctl.send_mb(batch, timeout_s=30)
    faults = float(worker.wait_for_line("FAULTS", timeout=60).split()[1])
    assert worker.wait(30) == 0, worker.output
    serving.join(30)
    assert faults < 0.5, "%.2f minor page faults per minibatch in the worker's I/O thread" % faults


@pytest.mark.parametrize("setting", ["", "MALLOC_TRIM_THRESHOLD_=131072",
                                     "GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072"])
def test_the_heap_is_kept_unless_the_user_set_mallocs_thresholds(setting):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if setting:
        name, value = setting.split("=", 1)
        env[name] = value
    out = subprocess.run([sys.executable, "-c", "from platoon._os.heap import keep_heap\n"
                          "print(keep_heap(), keep_heap())"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    kept = bool(GLIBC) and not setting
    assert out.stdout.split() == [str(kept)] * 2, (setting, out.stdout)
