"""Who owns a capture session or a running rollout, and whether that owner is still alive.

Several servers may share one data dir (SWE_GYM_DATA_DIR). Each store a server opens takes an `Owner`: a lock file
``<folder>/<id>.lock`` that it holds with ``flock`` for as long as it lives. The kernel drops the lock when the
process dies (SIGKILL too), so a lock that can be taken belongs to a server that is gone. What a store opens (a
capture session, a ``.running`` rollout, a half-written temporary file) records the owner's id; at startup a server
abandons only what owners that are gone left open, never what a live server on the same data dir is working on.

Why not the pid: pids are reused (a restarted container's server often gets the dead one's pid), and two servers in
one process (tests, benchmarks, `local_service`) share one. A ``flock`` belongs to an open file description, so two
owners in one process exclude each other as two processes do.

A lock file whose owner cannot be checked (another user's, an odd error) counts as alive: keeping a dead server's
session open is harmless (it is marked at a later start), marking a live server's rollout failed is wrong data.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
import uuid
from pathlib import Path

OWNER_ID = re.compile(r"^o[0-9a-f]{32}$")  # ids come back from files and databases: nothing else is a path
SUFFIX = ".lock"


class Owner:
    """This store's owner id, alive while the lock is held: until `release`, or until the object is collected or the
    process ends (the descriptor closes, the kernel drops the lock)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        sweep(folder)  # lock files of owners that are gone and left nothing behind
        self.folder = folder
        self.id = "o" + uuid.uuid4().hex
        final = folder / f"{self.id}{SUFFIX}"
        staging = folder / f"{self.id}.new"  # locked before it has its name: a sweep never sees it unlocked
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with contextlib.suppress(OSError):  # for a person looking; a full disk must not stop the store
                os.write(fd, f"pid {os.getpid()} since {time.time():.3f}\n".encode())
            os.rename(staging, final)
        except BaseException:
            os.close(fd)
            staging.unlink(missing_ok=True)
            raise
        self.path = final
        self._file = os.fdopen(fd, "rb", buffering=0)  # closed (the lock dropped) with this object at the latest

    def release(self) -> None:
        """Give the lock up (the store is closed): what this owner left open counts as a dead server's from now."""
        if self._file.closed:
            return
        self.path.unlink(missing_ok=True)
        self._file.close()

    def alive_check(self, owner_id: str | None) -> bool:
        """Whether ``owner_id`` (as recorded) is alive: this owner, or another whose lock is held."""
        if owner_id == self.id:
            return not self._file.closed
        return alive(self.folder, owner_id)


def alive(folder: Path, owner_id: str | None) -> bool:
    """Whether the owner ``owner_id`` holds its lock in ``folder``. False for no id, a malformed one (records written
    before owners were kept), or a lock file that is gone; a lock found free is removed (its owner is gone)."""
    if owner_id is None or not OWNER_ID.fullmatch(owner_id):
        return False
    path = folder / f"{owner_id}{SUFFIX}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell (permissions): never take a live server's work for a dead one's
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return True
        path.unlink(missing_ok=True)  # held by us now: its owner is gone, and no one takes this id again
        return False
    finally:
        os.close(fd)


def sweep(folder: Path) -> list[str]:
    """Remove the lock files of owners that are gone (a crashed server's, once nothing refers to them or not: a
    missing lock file reads as a dead owner either way). Returns the ids removed."""
    try:
        with os.scandir(folder) as it:
            names = [e.name for e in it if e.name.endswith(SUFFIX)]
    except OSError:
        return []
    gone = []
    for name in names:
        owner_id = name[: -len(SUFFIX)]
        if OWNER_ID.fullmatch(owner_id) and not alive(folder, owner_id):
            gone.append(owner_id)
    return gone
