"""A controller that carries on when a worker fails."""

from platoon import Controller


class Tolerant(Controller):
    def handle_worker_death(self, worker_id, exit_info):
        print("SURVIVED the loss of worker %d: %s" % (worker_id, exit_info.get("error")),
              flush=True)


with Tolerant() as ctl:
    ctl.serve()
