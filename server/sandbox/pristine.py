"""Pristine work trees: one per (repository, base commit), cloned and stripped of history once, copied per sandbox.

A `local` (or `landlock`) sandbox's work tree used to be a fresh clone plus the history strip (a `git gc`) each time:
~35 git processes and most of the boot. Now the clone and strip run once per task into
`cache_dir()/pristine/<key>/testbed` (key: the source's real path, its size and mtime when it is a file, the base
commit, the schema) and every sandbox gets its own copy with `cp -a --reflink=auto`: copy-on-write where the
filesystem has it (btrfs, XFS), a full copy elsewhere. Copies, never hard links: an agent may write a file in place,
and a hard link would carry that write into the pristine tree and into every later rollout. The pristine tree is
never mounted into a sandbox.

Only a base commit given as a full object id is cached (a branch name may move); anything else is prepared per
sandbox as before. Concurrency: a tree is made under an exclusive `flock` on `<key>.lock` in a staging dir renamed
into place, copied under a shared one; past `SWE_GYM_PRISTINE_MAX` trees (default 64; 0 turns the cache off) the
least recently used ones are evicted when a new one is made, skipping any being copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from swe_gym_env.core.assets import cache_dir
from swe_gym_env.core.settings import setting
from swe_gym_env.core.tempdirs import HOST, owner_dead
from swe_gym_env.server.sandbox.errors import SandboxError

SCHEMA = 1  # bump when the way a pristine tree is prepared changes
READY = ".swe-gym-pristine"  # marker in <key>/, next to testbed/
OBJECT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
COPY_TIMEOUT_S = 600
_locks: dict[str, asyncio.Lock] = {}  # per key, in this process: one coroutine prepares, the others wait


def root() -> Path:
    return cache_dir() / "pristine"


def max_trees() -> int:
    """How many pristine trees to keep (`SWE_GYM_PRISTINE_MAX`, default 64; 0: none, a clone per sandbox)."""
    return setting("pristine_max")


def cacheable(source: str, base_commit: str, strip_history: bool) -> bool:
    if not (source and strip_history and OBJECT_ID.match(base_commit) and max_trees() > 0):
        return False
    return os.path.exists(source)


def key(source: str, base_commit: str) -> str:
    path = os.path.realpath(source)
    st = os.stat(path)
    ident = f"{st.st_size}:{st.st_mtime_ns}" if not os.path.isdir(path) else "dir"
    return hashlib.sha256(f"{SCHEMA}\0{path}\0{ident}\0{base_commit}".encode()).hexdigest()[:32]


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[bool]:
    """``flock`` on ``path`` (created); yields False where a non-blocking request found it taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _evict(keep: str) -> None:
    """Remove the least recently used trees past the cap (never ``keep``, never one being copied) and staging dirs
    whose process is gone."""
    base = root()
    for stage in base.glob(".stage-*"):
        pid = stage.name.split("-")[1] if stage.name.count("-") >= 2 else ""  # .stage-<pid>-<random>
        if pid.isdigit() and owner_dead({"host": HOST, "pid": pid}):
            shutil.rmtree(stage, ignore_errors=True)
    trees = [p for p in base.iterdir() if p.is_dir() and (p / READY).is_file() and p.name != keep]
    trees.sort(key=lambda p: (p / READY).stat().st_mtime)  # touched at every copy: least recently used first
    for old in trees[: max(0, len(trees) + 1 - max_trees())]:
        with _flock(base / f"{old.name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB) as got:
            if got:
                (old / READY).unlink(missing_ok=True)
                shutil.rmtree(old, ignore_errors=True)


async def _ensure(k: str, prepare: Callable[[Path], Awaitable[None]]) -> Path:
    """The pristine tree of key ``k``, made with ``prepare(testbed)`` when missing (once across processes)."""
    tree = root() / k
    if (tree / READY).is_file():
        return tree
    async with _locks.setdefault(k, asyncio.Lock()):
        if (tree / READY).is_file():
            return tree
        root().mkdir(parents=True, exist_ok=True)
        lock = root() / f"{k}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)  # another server may be making it
            if (tree / READY).is_file():
                return tree
            stage = root() / f".stage-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                (stage / "testbed").mkdir(parents=True)
                await prepare(stage / "testbed")
                (stage / READY).write_text(k)
                shutil.rmtree(tree, ignore_errors=True)  # a half-evicted leftover
                stage.rename(tree)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
        finally:
            os.close(fd)
    await asyncio.to_thread(_evict, k)
    return tree


async def copy_into(testbed: Path, source: str, base_commit: str, prepare: Callable[[Path], Awaitable[None]]) -> None:
    """Fill the empty dir ``testbed`` with a copy of the pristine tree of (source, base_commit), preparing that tree
    with ``prepare`` first when it is not there yet."""
    k = key(source, base_commit)
    for _ in range(3):  # evicted between the check and the shared lock: make it again
        tree = await _ensure(k, prepare)
        with _flock(root() / f"{k}.lock", fcntl.LOCK_SH | fcntl.LOCK_NB) as got:
            if not got or not (tree / READY).is_file():  # being made or evicted right now
                await asyncio.sleep(0.05)
                continue
            os.utime(tree / READY)  # recently used
            await _cp(tree / "testbed", testbed)
            return
    raise SandboxError(f"could not copy the pristine work tree of {base_commit[:12]} (it kept being replaced)")


async def _cp(src: Path, dest: Path) -> None:
    argv = ["cp", "-a", "--reflink=auto", "-T", "--", str(src), str(dest)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with asyncio.timeout(COPY_TIMEOUT_S):
            _, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise SandboxError(f"copying the pristine work tree failed: {err.decode('utf-8', 'replace').strip()[:300]}")
