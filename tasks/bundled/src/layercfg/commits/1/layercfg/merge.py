"""Merge configuration layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with the keys of ``override`` replacing those of ``base``."""
    out = dict(base)
    out.update(override)
    return out


def resolve(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``layers`` from left to right: later layers take precedence."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = merge(out, layer)
    return out
