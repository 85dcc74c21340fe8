"""Temp dirs owned by this server process: named `<prefix><pid>-…`, so a restarted server can remove what a
killed one left behind (a server killed with SIGKILL runs no cleanup)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

from swe_gym_env.core.settings import setting

SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1: a unix socket's path is at most this many bytes
OWNED_NAME_MAX = 7 + 1 + 8  # what owned_dir adds to its prefix: <pid>-<mkdtemp's 8 characters>


def socket_base(room: int) -> str:
    """The temp folder, or /tmp where `<temp folder>/<room bytes>` would be too long for a unix socket's path (a
    deep TMPDIR: bind() fails with "AF_UNIX path too long")."""
    base = tempfile.gettempdir()
    return base if len(os.fsencode(base)) + 1 + room <= SUN_PATH_MAX else "/tmp"


def owned_dir(prefix: str, socket: str | None = None) -> Path:
    """A new `<prefix><pid>-…` dir in the temp folder; in /tmp where it is to hold the unix socket ``socket`` (a file
    name) and the temp folder is too deep for that socket's path."""
    base = socket_base(len(prefix) + OWNED_NAME_MAX + 1 + len(socket)) if socket else None
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))


def reap_orphans(prefix: str) -> list[str]:
    """Remove `<prefix><pid>-…` dirs whose owning process no longer exists (in the temp folder, and in /tmp, where
    `socket_base` puts them under a deep one)."""
    removed = []
    bases = dict.fromkeys([tempfile.gettempdir(), "/tmp"])
    for path in [p for base in bases for p in Path(base).glob(f"{prefix}*-*")]:
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


INCARNATION = uuid.uuid4().hex[:12]  # this server process; sandboxes of other incarnations of our id are orphans


def server_id() -> str:
    """This server's id, persisted in the cache dir (or SWE_GYM_SERVER_ID), so it survives a restart: every
    sandbox carries it as a label and a restarted server finds and reaps what the killed one left."""
    env = setting("server_id")
    if env:
        return env
    from swe_gym_env.core.assets import cache_dir

    path = cache_dir() / "server-id"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(uuid.uuid4().hex[:16] + "\n")
        except FileExistsError:  # another process wrote it first
            pass
    return path.read_text().strip()


HOST = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())[:64] or "host"


def owner_dead(labels: dict[str, str]) -> bool:
    """Whether the server process that labelled a sandbox (`host`, `pid`) is gone. Sandboxes of servers on other
    hosts are theirs to reap; several servers may share one server id (one cache dir) on a host, so a different
    incarnation alone does not make an orphan — unless the pid is this process's own (`incarnation` may be a prefix
    of the labeller's INCARNATION)."""
    if labels.get("host") != HOST:
        return False
    pid = labels.get("pid", "")
    if pid == str(os.getpid()) and (inc := labels.get("incarnation")) and not INCARNATION.startswith(inc):
        return True  # our own pid, another process: a restarted container's server gets the dead one's pid (1, 7…)
    return not pid.isdigit() or not Path(f"/proc/{pid}").exists()
