"""The controller's parts, behind `platoon.controller.Controller`: requests (`dispatch`),
workers (`registry`, `peers`), the barrier and the centre's initialisation
(`rendezvous`), checkpoints (`checkpointing`), the status file (`status`), sockets
(`endpoints`), late replies (`afterjob`), settings (`config`) and what they may ask of
the controller (`services`). Private: import from `platoon`."""
