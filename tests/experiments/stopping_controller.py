"""The default controller; says at the end whether, and why, the job was asked to stop."""

from platoon import Controller

with Controller() as ctl:
    ctl.serve()
    print("SERVED stop requested by a worker: %s (%s)" % (ctl.stop_requested, ctl.stop_reason),
          flush=True)
