"""Command-line options of a controller script, as the original Platoon had them
(`default_parser`, `default_arguments`; also `Controller.default_parser` and
`Controller.default_arguments`)."""

from .._controller.arguments import default_arguments, default_parser

__all__ = ["default_parser", "default_arguments"]
