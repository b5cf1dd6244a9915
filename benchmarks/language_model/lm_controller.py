"""The controller of the language-model fault runs (run by platoon-launcher; see faults.py):
a barrier ("ready", "go"), then "train" until worker 0 says "stop". A worker's death is
logged and the job goes on (`--keep-going`); under `--restart` a replacement comes instead."""

import logging

from platoon import Controller

log = logging.getLogger(__name__)


class LMController(Controller):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ready, self.stopped = set(), False

    def handle_control(self, req, worker_id, req_info):
        if req == "ready":
            self.ready.add(worker_id)
            return None
        if req == "go":
            return len(self.ready) >= self.num_workers
        if req == "stop":
            self.stopped = True
            return None
        if req == "next":
            return "stop" if self.stopped else "train"
        raise ValueError("unknown request %r" % (req,))

    def handle_worker_death(self, worker_id, exit_info):
        print("worker %d died (%s); going on with the others" % (worker_id, exit_info),
              flush=True)


def main():
    with LMController() as ctl:
        ctl.serve()


if __name__ == "__main__":
    main()
