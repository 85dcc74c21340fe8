"""Temp dirs owned by this server process: named `<prefix><pid>-…`, so a restarted server can remove what a
killed one left behind (a server killed with SIGKILL runs no cleanup)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def owned_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def reap_orphans(prefix: str) -> list[str]:
    """Remove `<prefix><pid>-…` dirs whose owning process no longer exists."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed
