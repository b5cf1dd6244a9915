"""A setting's value, checked where it is declared: a number of seconds, a count. Raises
ValueError naming the setting, what it accepts and the value (the controller's settings,
a node's and its tie's: `platoon._controller.config`, `platoon._os.nodesettings`)."""

import math
import numbers

MAX_SECONDS = 1e9  # a longer wait than this overflows threading's (about 9.2e9 s on Linux)


def check_seconds(name: str, value, low: float = 0.0, high: float = MAX_SECONDS, *,
                  zero: bool = False, none: str = ""):
    """`value` of setting `name`, checked: a number of seconds more than `low` (or equal to
    it with `zero`) and at most `high`, finite; None where `none` says what None means.
    Raises ValueError naming the setting, the accepted range and the value."""
    if value is None and none:
        return None
    seconds = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past float's range
            seconds = math.inf
    if not (math.isfinite(seconds) and (seconds >= low if zero else seconds > low)
            and seconds <= high):
        raise ValueError("%s must be a number of seconds, %s %g %s %g%s; got %r"
                         % (name, "from" if zero else "more than", low,
                            "to" if zero else "and at most", high,
                            ", or None " + none if none else "", value))
    return value


def check_count(name: str, value, low: int = 0, *, none: str = "", what: str = ""):
    """`value` of setting `name`, checked: an integer (not a bool) of at least `low`; None
    where `none` says what None means. Raises ValueError naming the setting."""
    if value is None and none:
        return None
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and int(value) >= low):
        raise ValueError("%s must be an integer%s, at least %d%s; got %r"
                         % (name, what, low, ", or None " + none if none else "", value))
    return value
