"""Read a configuration layer from environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def from_env(environ: Mapping[str, str], prefix: str = "APP_") -> dict[str, Any]:
    """The variables that start with ``prefix``, as a nested dict.

    A double underscore separates sections: ``APP_DB__PORT=5433`` becomes ``{"db": {"port": "5433"}}``.
    """
    out: dict[str, Any] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix:
            continue
        *sections, key = name[len(prefix) :].lower().split("__")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return out
