"""Rebuild the bundled demo task(s): a small real repo with git history, a bug, its fix and its tests.

Run: python tasks/bundled/make_demo.py   (rewrites batchtools.bundle and tasks.jsonl beside this file)

The output is deterministic (fixed author and dates), so the committed bundle and base_commit are reproducible.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

GIT_ENV = {
    "GIT_AUTHOR_NAME": "swe-gym-env",
    "GIT_AUTHOR_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_COMMITTER_NAME": "swe-gym-env",
    "GIT_COMMITTER_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}

README = """# batchtools

Small helpers for splitting work into batches.
"""

PYPROJECT = """[project]
name = "batchtools"
version = "0.2.0"

[tool.pytest.ini_options]
pythonpath = ["."]
"""

INIT_V1 = '''"""Small helpers for splitting work into batches."""

from batchtools.chunks import chunked

__all__ = ["chunked"]
'''

CHUNKS_V1 = '''"""Split sequences into fixed-size chunks."""

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
'''

# Commit 2: a "performance" refactor that introduced the bug (drops the last, partial chunk).
CHUNKS_V2 = '''"""Split sequences into fixed-size chunks."""

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
'''

CHUNKS_FIXED = CHUNKS_V2.replace(
    "    count = len(items) // size\n",
    "    count = -(-len(items) // size)  # ceil: keep the last, partial chunk\n",
)

TESTS_V1 = """import pytest

from batchtools import chunked


def test_chunked_even():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunked_empty():
    assert chunked([], 3) == []


def test_chunked_rejects_bad_size():
    with pytest.raises(ValueError):
        chunked([1, 2], 0)
"""

TESTS_NEW = (
    TESTS_V1.replace(
        "from batchtools import chunked\n",
        "from batchtools import chunked\nfrom batchtools.chunks import chunk_count\n",
    )
    + """

def test_chunked_keeps_partial_tail():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_chunk_count_rounds_up():
    assert chunk_count(list(range(7)), 3) == 3
"""
)

PROBLEM = """chunked() silently drops the last items when the length is not a multiple of size

Since 0.2.0, `batchtools.chunked` loses data:

```python
>>> from batchtools import chunked
>>> chunked([1, 2, 3, 4, 5], 2)
[[1, 2], [3, 4]]
```

I expected `[[1, 2], [3, 4], [5]]` — the docstring even says the last chunk may be shorter than `size`.
`chunk_count` has the same problem (`chunk_count(range(7), 3)` gives 2 instead of 3). In our pipeline this
meant the last few records of every batch job were never processed.
"""


def git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def diff_of(repo: Path, files: dict[str, str]) -> str:
    write(repo, files)
    out = git(repo, "diff", "--no-color", "--no-ext-diff")
    git(repo, "checkout", "--", ".")
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "batchtools"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        write(
            repo,
            {
                "README.md": README,
                "pyproject.toml": PYPROJECT,
                "batchtools/__init__.py": INIT_V1,
                "batchtools/chunks.py": CHUNKS_V1,
                "tests/test_chunks.py": TESTS_V1,
            },
        )
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "Add chunked()", date="2026-01-05T10:00:00+00:00")
        write(repo, {"batchtools/chunks.py": CHUNKS_V2})
        git(repo, "commit", "-q", "-am", "Compute chunks by count; add chunk_count()", date="2026-02-11T15:30:00+00:00")
        base = git(repo, "rev-parse", "HEAD").strip()
        gold = diff_of(repo, {"batchtools/chunks.py": CHUNKS_FIXED})
        test_patch = diff_of(repo, {"tests/test_chunks.py": TESTS_NEW})
        bundle = HERE / "batchtools.bundle"
        bundle.unlink(missing_ok=True)
        git(repo, "bundle", "create", str(bundle), "main")
    row = {
        "instance_id": "swe-gym-env__batchtools-1",
        "repo": "swe-gym-env/batchtools",
        "base_commit": base,
        "problem_statement": PROBLEM,
        "hints_text": "",
        "created_at": "2026-02-12T09:00:00Z",
        "version": "0.2",
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": [
            "tests/test_chunks.py::test_chunked_keeps_partial_tail",
            "tests/test_chunks.py::test_chunk_count_rounds_up",
        ],
        "PASS_TO_PASS": [
            "tests/test_chunks.py::test_chunked_even",
            "tests/test_chunks.py::test_chunked_empty",
            "tests/test_chunks.py::test_chunked_rejects_bad_size",
        ],
        "repo_source": "batchtools.bundle",
    }
    (HERE / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    print(f"base_commit={base}")


if __name__ == "__main__":
    main()
