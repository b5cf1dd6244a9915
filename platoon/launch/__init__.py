"""The launcher's processes: `platoon-launcher` (`cli`), the supervision of a job's
children (`supervision`, `process`), the bootstrap of every child (`child`), the
watchdog of a killed controller (`reaper`) and the settings handed to children
(`environment`). Nothing here loads zmq or numpy (tests/test_imports.py)."""
