"""A worker script for tests/elastic/test_prefork.py (run as a script or with -m): opens a
file, then its body ends while a non-daemon thread still runs; that thread, then an atexit
handler, write to the file and say whether ``__main__`` is still this script's module."""

import atexit
import sys
import tempfile
import threading
import time

MAIN = sys.modules["__main__"]
out = tempfile.TemporaryFile()  # (the lowest file descriptor free)


def later():
    time.sleep(0.2)  # (the body has ended)
    out.write(b"thread")
    out.flush()
    print("THREAD wrote, own main %s" % (sys.modules["__main__"] is MAIN), flush=True)


def at_exit():
    out.seek(0)
    print("ATEXIT read %s, own main %s" % (out.read().decode(),
                                           sys.modules["__main__"] is MAIN))


threading.Thread(target=later).start()
atexit.register(at_exit)
