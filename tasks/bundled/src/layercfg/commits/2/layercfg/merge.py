"""Merge configuration layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with ``override`` merged into ``base``.

    Nested mappings are merged key by key, so a layer only has to name the keys it changes; for any other
    value, the one in ``override`` wins.
    """
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = merge(value, current)
        else:
            out[key] = value
    return out


def resolve(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``layers`` from left to right: later layers take precedence."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = merge(out, layer)
    return out
