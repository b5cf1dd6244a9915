"""The launcher app: `platoon-launcher` (`cli`), the supervision of a job's children
(`supervision`), the bootstrap of every child (`child`) and the watchdog of a killed
controller (`reaper`). The OS helpers they share with the other processes (signals,
pids, the ``PLATOON_*`` settings, the status file) are `platoon._os`'s. Nothing here
loads zmq or numpy (tests/package/test_imports.py)."""
