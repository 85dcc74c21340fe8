"""Read ``.env`` files."""

from dotenvlite.parser import ParseError, load, parse

__all__ = ["ParseError", "load", "parse"]
