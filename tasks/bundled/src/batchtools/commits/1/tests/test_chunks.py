import pytest

from batchtools import chunked


def test_chunked_even():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunked_empty():
    assert chunked([], 3) == []


def test_chunked_rejects_bad_size():
    with pytest.raises(ValueError):
        chunked([1, 2], 0)
