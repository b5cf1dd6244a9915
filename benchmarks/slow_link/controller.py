"""The controller of a slow-link platoon run, one per node (`python -m platoon.mpi
--controller benchmarks/slow_link/controller.py --controller-args "RESULT_DIR DEADLINE_S"`).

The job stops when rank 0's worker reaches the target or its cap (`Worker.request_stop`,
seen by every node); this controller also stops it at DEADLINE_S after it starts serving, in
case a worker never gets there. After `serve()` it writes RESULT_DIR/controller-N.json: the
tie's rounds and the bytes it counted as sent from this node, and this process's CPU time.
"""

import json
import os
import resource
import sys
import threading

from platoon import Controller


def main(argv):
    result_dir, deadline_s = argv[1], float(argv[2])
    with Controller() as ctl:
        timer = threading.Timer(deadline_s, ctl.request_stop, ("the run's deadline",))
        timer.daemon = True
        timer.start()
        ctl.serve(timeout_s=deadline_s + 120)
        timer.cancel()
        link = ctl.node_link
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out = {"node": link.rank if link is not None else 0,
               "tie_rounds": link.tie_rounds if link is not None else 0,
               "tie_bytes_sent": link.tie_bytes_sent if link is not None else 0,
               "cpu_s": usage.ru_utime + usage.ru_stime}
    path = os.path.join(result_dir, "controller-%d.json" % out["node"])
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv)
