"""Old keyword names kept working, with a DeprecationWarning naming the new one
(`renamed_keywords`; its home is the private `platoon._deprecation`, which the core imports)."""

from .._deprecation import renamed_keywords

__all__ = ["renamed_keywords"]
