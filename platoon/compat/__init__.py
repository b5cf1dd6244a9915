"""The original Platoon's names: `channel` (Controller, Worker, Lieutenant, Soldier),
`param_sync` (its rules module), `controller_args` (its controller command line) and
`deprecation` (old keyword names, with a warning)."""
