"""The node layer: what a node of a multi-node job runs whichever way it is linked to the
others (a fixed world over MPI, `platoon.mpi`; nodes that come and go, `platoon.elastic`),
none of which needs MPI. Neither of those packages imports the other: both build on this one.

- `runner`: the node runner's parts: its controller, run until it has served, and its
  workers, started once it serves and watched (`Workers`, `run_controller`,
  `serve_then_finish`, `parse_node_arguments`, `say`).
- `reaper`: the watchdog that stops a node's workers and unlinks its shared memory when its
  controller is killed (``python -m platoon.node.reaper``).
- `compress`: the codecs a tie's messages travel in (`make_codec`, `ErrorFeedback`) and the
  mean every member computes alike from the gathered messages (`mean_of_messages`).
- `tie`: the one centre tie both paths run (`NodeTie`: the signed round header and its door,
  the first anchor, healing, outer rounds, the final agreement), over a `group.Group` with a
  `group.Membership` policy (`platoon.mpi.tie`'s fixed world, `platoon.elastic.tie`'s quorums).
- `decision`: what a round does, decided from the gathered headers alone (pure).
- `outer`: the outer rule a round applies (`OuterRule`: DiLoCo's step, EASGD, a user's own).

The controller's side of the link is the controller's own (`NodeLinkProtocol` in
`platoon._controller.services`, the handoff in `platoon._controller.handoff`); the settings a
launcher passes to a node, `platoon._os.nodesettings`.
"""
