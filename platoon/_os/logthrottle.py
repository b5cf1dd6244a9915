"""Repeated warnings, throttled: a flood of bad input must not flood the log."""

import logging
import time
from typing import Dict, List

OVERFLOW = "other"  # the kind that counts warnings of kinds past `max_kinds`


class ThrottledLog:
    """Logs at most `burst` warnings of one kind per `period_s` seconds and counts the rest;
    `flush` (or the next warning of that kind after the period) logs how many were
    suppressed. At most `max_kinds` kinds are tracked at once (a kind per source of bad input
    must not grow without bound): past them, warnings of new kinds count as kind "other"."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0, burst: int = 5,
                 max_kinds: int = 1000) -> None:
        self._logger = logger
        self.period_s = period_s
        self.burst = burst
        self.max_kinds = max_kinds
        # kind -> [start of the period, logged, suppressed]
        self._kinds: Dict[str, List[float]] = {}

    def warning(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if kind not in self._kinds and len(self._kinds) >= self.max_kinds:
            self.flush(expired_only=True)
            if len(self._kinds) >= self.max_kinds:
                kind, msg, args = OVERFLOW, "warnings of more kinds than %d", (self.max_kinds,)
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.period_s:
            if state is not None:
                self._summarise(kind, state)
            state = self._kinds[kind] = [now, 0, 0]
        if state[1] < self.burst:
            state[1] += 1
            self._logger.warning(msg, *args)
        else:
            state[2] += 1

    def flush(self, expired_only: bool = False) -> None:
        """Log the suppressed counts (of periods that are over, with `expired_only`)."""
        now = time.monotonic()
        for kind, state in list(self._kinds.items()):
            if not expired_only or now - state[0] >= self.period_s:
                self._summarise(kind, state)
                del self._kinds[kind]

    def _summarise(self, kind: str, state: List[float]) -> None:
        if state[2]:
            self._logger.warning("%d more %s warning(s) in %.3g s were not logged",
                                 state[2], kind, time.monotonic() - state[0])
