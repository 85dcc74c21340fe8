"""Small helpers for splitting work into batches."""

from batchtools.chunks import chunked

__all__ = ["chunked"]
