"""The original Platoon's module of sync rules: `from platoon.param_sync import EASGD` works."""

from ..rules import ASGD, EASGD, ParamSyncRule

__all__ = ["ParamSyncRule", "EASGD", "ASGD"]
