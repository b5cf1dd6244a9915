"""Uncaught exceptions in the threads of a process, kept for the controller.

While a `ThreadFailures` watches (from `watch()` to `close()`), the first exception that
ends any thread of the process (but SystemExit and the `ignore`d kinds) is kept with the
thread's name, and
`on_failure` is called in that thread. The hook that was installed before
(`threading.excepthook`) still runs, so the traceback is logged as usual.
"""

import logging
import threading
from typing import Callable, Optional, Tuple

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class ThreadFailures:
    """Watches `threading.excepthook` for a controller; `first` is (exception, thread name)."""

    def __init__(self, on_failure: Optional[Callable[[], None]] = None,
                 ignore: Tuple[type, ...] = ()):
        self.first: Optional[Tuple[BaseException, str]] = None
        self._on_failure = on_failure
        self._ignore = (SystemExit,) + tuple(ignore)
        self._previous = None
        self._watching = False
        self._lock = threading.Lock()

    def watch(self) -> None:
        """Install the hook (chained to the current one). Idempotent."""
        if not self._watching:
            self._previous = threading.excepthook
            threading.excepthook = self._hook
            self._watching = True

    def close(self) -> None:
        """Stop watching; the previous hook is put back unless another replaced ours since
        (then ours only passes exceptions on). Idempotent."""
        self._watching = False
        if threading.excepthook == self._hook:
            threading.excepthook = self._previous

    def _hook(self, args) -> None:
        first = False
        if self._watching and args.exc_value is not None \
                and not issubclass(args.exc_type, self._ignore):
            name = args.thread.name if args.thread is not None else "unknown"
            with self._lock:
                if self.first is None:
                    self.first = (args.exc_value, name)
                    first = True
            if first and hasattr(args.exc_value, "add_note"):  # Python 3.11+
                args.exc_value.add_note("(raised in the controller's thread %r)" % name)
        (self._previous or threading.__excepthook__)(args)
        if first and self._on_failure is not None:
            try:
                self._on_failure()
            except Exception:  # the failure itself is kept; this one is only logged
                log.exception("handling the failure of thread %r failed", name)
