"""Entry point of benchmark child processes: `python -m benchmarks._child ROLE ARGS...`."""

import signal
import sys


def main():
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    role, args = sys.argv[1], sys.argv[2:]
    if role == "syncer":
        from .bench_sync import syncer as run
    elif role in ("raw_rep", "ping_controller", "mb_sender"):
        from . import bench_transport
        run = getattr(bench_transport, role)
    elif role in ("train", "train_controller"):
        from . import bench_training
        run = getattr(bench_training, role)
    else:
        raise SystemExit("unknown benchmark role %r" % role)
    run(*args)


if __name__ == "__main__":
    main()
