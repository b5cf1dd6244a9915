"""The suite's own cleanup: MPICH segments that a killed MPI rank leaves behind."""

import mmap
import os
import time

from helpers import SHM, orphaned_mpich_segments


def test_an_orphaned_mpich_segment_is_found_and_one_in_use_or_older_is_not():
    """Unmapped and made since `since`: orphaned; mapped by a live process (here this one),
    made before `since` or less than a second ago: left alone. (The times lie days back, so
    that the suite's own cleanup, which looks only at segments made since the suite began,
    leaves these to this test.)"""
    made, day = time.time(), 86400
    names = {kind: "mpich_shm_platoontest%d_%s" % (os.getpid(), kind)
             for kind in ("orphan", "mapped", "older", "young")}
    paths = {kind: os.path.join(SHM, name) for kind, name in names.items()}
    try:
        for path in paths.values():
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        for kind in ("orphan", "mapped"):
            os.utime(paths[kind], (made - 5 * day, made - 5 * day))
        os.utime(paths["older"], (made - 20 * day, made - 20 * day))
        with open(paths["mapped"], "r+b") as f, mmap.mmap(f.fileno(), 4096):
            found = orphaned_mpich_segments(since=made - 10 * day)
        assert paths["orphan"] in found
        assert not {paths["mapped"], paths["older"], paths["young"]} & set(found)
    finally:
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)
