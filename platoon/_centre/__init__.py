"""The shared-memory centre, used by the controller and the workers: the segment and its
lock (`shmem`), the sync path (`exchange`), the stop byte (`stopsignal`) and the
checkpoint file format (`checkpoint`). Private: import from `platoon`."""
