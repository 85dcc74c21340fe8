"""Split sequences into fixed-size chunks."""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """Split ``items`` into consecutive lists of ``size`` elements.

    >>> chunked([1, 2, 3, 4], 2)
    [[1, 2], [3, 4]]
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
