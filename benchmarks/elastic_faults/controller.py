"""The controller of a fault-race node, elastic or fixed-world (`--controller
benchmarks/elastic_faults/controller.py --controller-args "EVENTS_DIR INCARNATION
[CHECKPOINT_DIR EVERY_S]"`).

Appends to EVENTS_DIR/NODE-INCARNATION-controller.jsonl a "round" event each time its tie's
round count grows and, with CHECKPOINT_DIR (the fixed-world job), a "checkpoint" event each
time its node's periodic checkpoint CHECKPOINT_DIR/NODE.npz is renewed (every EVERY_S seconds);
it starts from that checkpoint when there is one (what `--resume` does for a launcher job).
"""

import os
import socket
import sys
import threading
import time

from platoon import Controller

POLL_S = 0.02


def main(argv):
    from benchmarks.elastic_faults.worker import Events
    events_dir, incarnation = argv[1], int(argv[2])
    node = socket.gethostname().replace("node", "", 1)
    events = Events(os.path.join(events_dir, "%s-%d-controller.jsonl" % (node, incarnation)))
    settings, path = {}, None
    if len(argv) > 3:
        path = os.path.join(argv[3], node + ".npz")
        settings = {"checkpoint_path": path, "checkpoint_every_s": float(argv[4])}
        if os.path.exists(path):
            settings["resume_from"] = path
            events("resumed", path=path)
    with Controller(**settings) as ctl:
        def watch():
            rounds, saved = 0, os.stat(path).st_mtime if path and os.path.exists(path) else None
            while True:
                link = getattr(ctl, "node_link", None)
                now = link.totals().get("tie_rounds", 0) if link is not None else 0
                if now > rounds:
                    rounds = now
                    events("round", rounds=now)
                if path:
                    try:
                        mtime = os.stat(path).st_mtime
                    except OSError:
                        mtime = None
                    if mtime is not None and mtime != saved:
                        saved = mtime
                        events("checkpoint", mtime=mtime)
                time.sleep(POLL_S)
        threading.Thread(target=watch, daemon=True).start()
        ctl.serve(timeout_s=24 * 3600)


if __name__ == "__main__":
    main(sys.argv)
