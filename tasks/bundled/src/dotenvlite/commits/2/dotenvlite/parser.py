"""Parse ``.env`` files: ``KEY=value`` lines, comments and blank lines."""

from __future__ import annotations

import os
import re

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ParseError(ValueError):
    """A line that is not ``KEY=value``."""

    def __init__(self, lineno: int, line: str) -> None:
        super().__init__(f"line {lineno}: expected KEY=value, got {line!r}")
        self.lineno = lineno


def _parse_value(raw: str) -> str:
    value = raw.split("#", 1)[0].strip()  # drop an inline comment: KEY=value  # note
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value


def parse(text: str) -> dict[str, str]:
    """The assignments in ``text``, in order; a later assignment to the same key wins."""
    values: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        key, sep, raw = stripped.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ParseError(lineno, line)
        values[key] = _parse_value(raw)
    return values


def load(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse the ``.env`` file at ``path`` (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return parse(f.read())
