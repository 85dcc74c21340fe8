"""Split sequences into fixed-size chunks."""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """Split ``items`` into consecutive lists of ``size`` elements.

    The last chunk may be shorter than ``size``.

    >>> chunked([1, 2, 3, 4], 2)
    [[1, 2], [3, 4]]
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    count = len(items) // size
    return [list(items[i * size : (i + 1) * size]) for i in range(count)]


def chunk_count(items: Sequence[T], size: int) -> int:
    """How many chunks ``chunked(items, size)`` returns."""
    return len(chunked(items, size))
