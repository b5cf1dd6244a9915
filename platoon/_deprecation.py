"""Old keyword names kept working, with a DeprecationWarning naming the new one.

A leaf the core imports (`controller`, `worker`, `collectives`, `_worker`); users' path to it,
`platoon.compat.deprecation`, re-exports it, so that `compat/` stays a facade above the core."""

import functools
import warnings
from typing import Any, Callable, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Decorator: accept each old keyword name as a deprecated alias of its new name.

    ``@renamed_keywords(timeout="timeout_s")`` lets callers still write
    ``f(timeout=3)``; passing both names raises TypeError.
    """
    old_names = frozenset(old_to_new)

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def accept_old_names(*args, **kwargs):
            if not kwargs:  # the common call, on hot paths (send_req, recv_mb, send_mb)
                return function(*args)
            if old_names.isdisjoint(kwargs):  # new names only (all_reduce(..., out=) in a loop)
                return function(*args, **kwargs)
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError("%s() got both %s= and its old name %s=; pass %s= only"
                                        % (function.__qualname__, new, old, new))
                    warnings.warn("%s(%s=...) is deprecated: call it with %s=..." % (
                        function.__qualname__, old, new), DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        return cast(F, accept_old_names)  # the same signature: old names are not advertised
    return decorate
