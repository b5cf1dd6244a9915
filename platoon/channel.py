"""Names of the original design, kept so existing scripts run unchanged."""

from .controller import Controller as Lieutenant
from .worker import Worker as Soldier

__all__ = ["Lieutenant", "Soldier"]
