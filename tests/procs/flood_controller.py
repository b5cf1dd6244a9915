"""A controller for one worker whose process may hold at most FDS descriptors (soft and hard
limit), checkpointing to PATH every 0.2 s; prints PORT P once listening, then SERVED once the
worker is done and the final checkpoint is written.

usage: flood_controller.py FDS PATH
"""

import resource
import sys

from platoon import Controller

fds, path = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))
with Controller(control_port=0, data_port=0, num_workers=1, checkpoint_path=path,
                checkpoint_every_s=0.2) as ctl:
    print("PORT %d %d" % (ctl.control_port, ctl.data_port), flush=True)
    ctl.serve(timeout_s=60)
    print("SERVED", flush=True)
