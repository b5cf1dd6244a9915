"""The controller of the language-model fault runs (run by platoon-launcher; see faults.py):
a barrier ("ready", "go"), then "train" until worker 0 says "stop". A worker's death is
logged and the job goes on (`--keep-going`); under `--restart` a replacement comes instead."""

import logging

from benchmarks.time_to_accuracy.harness import StopOnRequest

log = logging.getLogger(__name__)


class LMController(StopOnRequest):
    """`StopOnRequest` behind a barrier: workers say "ready", then ask "go" until all have."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ready = set()

    def handle_control(self, req, worker_id, req_info):
        if req == "ready":
            self.ready.add(worker_id)
            return None
        if req == "go":
            return len(self.ready) >= self.num_workers
        return super().handle_control(req, worker_id, req_info)

    def handle_worker_death(self, worker_id, exit_info):
        print("worker %d died (%s); going on with the others" % (worker_id, exit_info),
              flush=True)


def main():
    with LMController() as ctl:
        ctl.serve()


if __name__ == "__main__":
    main()
