"""A worker script for tests/elastic/test_prefork.py: says what a forked worker finds (torch
loaded at its first line, its argv, __name__, sys.path[0], its MARK variable, a number from
numpy's global random state; then its __file__, __cached__, __loader__, sys.orig_argv and a
number from torch's default generator), logs through logging.basicConfig, prints at exit
(atexit), then exits with code ARGV[1] ("raise": an uncaught ValueError; "interrupt": a
SIGINT of its own, uncaught)."""

import sys

LOADED = "torch" in sys.modules  # (before any import of its own)

import atexit  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

print("LOADED %s NAME %s ARGV %s PATH0 %s MARK %s RANDOM %d" % (
    LOADED, __name__, " ".join(sys.argv), sys.path[0], os.environ.get("MARK"),
    np.random.randint(1 << 30)))
print("FILE %s CACHED %s LOADER %s ORIG %s TORCH %d" % (
    __file__, __cached__, type(__loader__).__name__,
    " ".join(getattr(sys, "orig_argv", sys.argv)[1:]), torch.randint(1 << 30, ()).item()))
logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
logging.getLogger("prefork_script").info("shown")
atexit.register(lambda: print("ATEXIT"))
if sys.argv[1] == "raise":
    raise ValueError("the script's own error")
if sys.argv[1] == "interrupt":
    signal.raise_signal(signal.SIGINT)  # (its handler runs before this returns: not os.kill,
    # whose signal another thread may take while this one goes on to the exit below)
sys.exit(int(sys.argv[1]))
