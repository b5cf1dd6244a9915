"""Uncaught exceptions in the threads of a process, kept for the controller.

While a `ThreadFailures` watches (from `watch()` to `close()`), the first exception that
ends any thread of the process (but SystemExit and the `ignore`d kinds) is kept with the
thread's name. In that thread, first the hook that was installed before
(`threading.excepthook`) runs, so the traceback is logged as usual, then
`on_failure(exception, thread name)`, and only then is the failure published in `first`:
whoever acts on `first` comes after both.
"""

import logging
import threading
from typing import Callable, Optional, Tuple

log = logging.getLogger("platoon.controller")  # the controller's log: users filter on its name


class ThreadFailures:
    """Watches `threading.excepthook` for a controller; `first` is (exception, thread name)."""

    def __init__(self, on_failure: Optional[Callable[[BaseException, str], None]] = None,
                 ignore: Tuple[type, ...] = ()):
        self.first: Optional[Tuple[BaseException, str]] = None
        self._claimed = False  # a failure is being handled (then published in `first`)
        self._on_failure = on_failure
        self._ignore = (SystemExit,) + tuple(ignore)
        self._previous: Optional[Callable[..., object]] = None
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
            threading.excepthook = self._previous or threading.__excepthook__

    def _hook(self, args) -> None:
        first = False
        exc, name = args.exc_value, args.thread.name if args.thread is not None else "unknown"
        if self._watching and exc is not None and not issubclass(args.exc_type, self._ignore):
            with self._lock:
                first, self._claimed = not self._claimed, True
            if first and hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note("(raised in the controller's thread %r)" % name)
        (self._previous or threading.__excepthook__)(args)
        if not first:
            return
        try:
            if self._on_failure is not None:
                self._on_failure(exc, name)
        except Exception:  # the failure itself is kept; this one is only logged
            log.exception("handling the failure of thread %r failed", name)
        finally:
            self.first = (exc, name)
