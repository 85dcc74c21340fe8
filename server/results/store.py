"""Results store: every rollout is on disk from start to finish, so none is silently lost.

`<id>.running` is written when a rollout starts and replaced by `<id>.json` (written atomically) when it ends.
After a crash, `recover()` turns every `.running` left behind into a failed result. Several servers may share one
results dir: a `.running` and a temporary file name their store's owner (`server.owners`, a lock it holds while open),
and `recover()` touches only those of owners that are gone, never a live server's rollout in flight.

Listings come from an index (`.index.sqlite` beside the results: one row per stored result with its summary, when it
finished and its size), kept on every put and delete, never from a scan of the files. It is a cache of the files: a
missing, corrupt or older-format index is rebuilt from them, and `reconcile` (at startup and on each retention pass:
one directory listing, no stat or parse of known files) adds files the index lacks and drops rows whose file is gone.

Finished results are not kept in memory: `get` reads from disk, through a small LRU cache bounded in count and bytes.

A write that fails (a full disk above all) changes nothing: the result file is written to a temporary file and renamed,
and a result whose index row cannot be written is removed again, so the files and the index stay consistent.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from swe_gym_env.core.owners import Owner
from swe_gym_env.server.results.pages import base_summary
from swe_gym_env.wire import Phase, ResultSummary, RolloutRequest, RolloutResult, RolloutSummary, failed_result

ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # ids become file names: nothing that could leave the dir
INDEX_NAME = ".index.sqlite"
OWNERS_DIR = ".owners"  # lock files of the stores (servers) using this dir: core/owners.py
TMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<owner>[^.]+)\.tmp$")  # .<file>.<owner id, or a pid before owners>.tmp
INDEX_VERSION = 1  # PRAGMA user_version of the index; another value: rebuilt from the files
CACHE_ITEMS = 16  # finished results kept in memory as their JSON (most recently used), parsed again on each read
CACHE_BYTES = 8 * 1024 * 1024  # ... and at most this much of it (about 3 results of 80 calls): the memory held

INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id TEXT PRIMARY KEY,
    finished REAL NOT NULL,   -- when it was stored (unix time)
    bytes INTEGER NOT NULL,   -- size of its file
    summary TEXT NOT NULL     -- RolloutSummary JSON
);
CREATE INDEX IF NOT EXISTS results_finished ON results (finished);
"""


def disk_full(e: BaseException) -> bool:
    """Whether an error means the disk (or a quota, or a file size limit) has no room left."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    if isinstance(e, sqlite3.Error):
        return "full" in str(e).lower()  # SQLITE_FULL: "database or disk is full"
    return False


class ResultsStore:
    def __init__(self, root: Path, cache_items: int = CACHE_ITEMS, cache_bytes: int = CACHE_BYTES) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cache_items, self.cache_bytes = cache_items, cache_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.RLock()  # the event loop writes, a retention pass (a thread) deletes
        self._unindexed: set[str] = set()  # deleted files whose row could not go yet (a full disk): never listed
        self.owner = Owner(root / OWNERS_DIR)  # held while this store is open
        self.db = self._open_index()
        self.reconcile()

    # -- the index ------------------------------------------------------------------------------------------------
    def _open_index(self) -> sqlite3.Connection:
        path = self.root / INDEX_NAME
        try:
            db = self._connect(path)
            ok = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            if ok and db.execute("PRAGMA user_version").fetchone()[0] == INDEX_VERSION:
                return db
            db.close()
        except sqlite3.DatabaseError:
            pass
        for suffix in ("", "-wal", "-shm"):  # corrupt or another format: rebuilt from the files by reconcile
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        db = self._connect(path)
        db.execute(f"PRAGMA user_version = {INDEX_VERSION}")
        return db

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(INDEX_SCHEMA)
        return db

    def _file_ids(self) -> set[str]:
        with os.scandir(self.root) as it:
            return {e.name[:-5] for e in it if e.name.endswith(".json") and not e.name.startswith(".")}

    def reconcile(self) -> dict[str, int]:
        """Make the index match the files: one directory listing; only files the index lacks are parsed."""
        with self._lock:
            self._flush_deletes()
            files = self._file_ids()
            indexed = {r[0] for r in self.db.execute("SELECT id FROM results")}
            gone = [i for i in indexed - files if not (self.root / f"{i}.json").exists()]
            for rid in gone:
                self.db.execute("DELETE FROM results WHERE id = ?", (rid,))
        added = 0
        for rid in sorted(files - indexed):
            path = self.root / f"{rid}.json"
            try:
                st = path.stat()
                summary = base_summary(RolloutResult.model_validate_json(path.read_bytes()))
            except (OSError, ValueError):
                continue  # vanished, or not a result: never listed (as before the index)
            with self._lock:
                self.db.execute(
                    "INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?)",
                    (rid, st.st_mtime, st.st_size, summary.model_dump_json()),
                )
            added += 1
        return {"added": added, "dropped": len(gone)}

    # -- writing --------------------------------------------------------------------------------------------------
    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{self.owner.id}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a partial write never stays behind, nor takes the disk
            raise

    def mark_running(self, rollout_id: str, req: RolloutRequest, phase: Phase = "validate") -> None:
        """Written at the start and again at each phase, so a restart can say where a rollout was cut short."""
        body = {
            "rollout_id": rollout_id,
            "request": req.model_dump(mode="json"),
            "phase": phase,
            "at": time.time(),
            "owner": self.owner.id,  # a restart fails it only when this store's owner is gone
        }
        self._write(self.root / f"{rollout_id}.running", json.dumps(body).encode())

    def put(self, result: RolloutResult) -> int:
        """Store a finished result (file and index row, or neither: raises). Returns its size in bytes."""
        data = result.model_dump_json().encode()
        summary = base_summary(result).model_dump_json()  # a RolloutSummary for listings, the summary form whole
        rid = result.rollout_id
        path = self.root / f"{rid}.json"
        with self._lock:
            self._flush_deletes()
            self._write(path, data)
            self._unindexed.discard(rid)
            try:
                self.db.execute(
                    "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", (rid, time.time(), len(data), summary)
                )
            except sqlite3.Error:
                path.unlink(missing_ok=True)  # no row, no file: the index stays the truth of what is listed
                raise
            (self.root / f"{rid}.running").unlink(missing_ok=True)
            self._remember(rid, data)
        return len(data)

    def delete(self, rollout_id: str) -> int:
        """Remove a stored result (the file first: on a full disk that is what frees room). Returns bytes freed."""
        with self._lock:
            path = self.root / f"{rollout_id}.json"
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                size = 0
            self._forget(rollout_id)
            self._unindexed.add(rollout_id)
            self._flush_deletes()
            return size

    def _flush_deletes(self) -> None:
        """Drop the rows of deleted results (on a full disk the index may not take even a delete: retried later)."""
        for rid in list(self._unindexed):
            try:
                self.db.execute("DELETE FROM results WHERE id = ?", (rid,))
            except sqlite3.Error:
                return
            self._unindexed.discard(rid)

    # -- the cache ------------------------------------------------------------------------------------------------
    def _remember(self, rid: str, data: bytes) -> None:
        """Keep a result's JSON, not the parsed model: a parsed result holds every id as a Python int (about 9x its
        JSON), and the caller may keep it alive anyway."""
        self._forget(rid)
        if len(data) > self.cache_bytes or self.cache_items <= 0:
            return
        self._cache[rid] = data
        self._cached_bytes += len(data)
        while len(self._cache) > self.cache_items or self._cached_bytes > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)

    def _forget(self, rid: str) -> None:
        if (old := self._cache.pop(rid, None)) is not None:
            self._cached_bytes -= len(old)

    def cache_usage(self) -> tuple[int, int]:
        """(results, bytes of their JSON) held in the cache."""
        return len(self._cache), self._cached_bytes

    # -- reading --------------------------------------------------------------------------------------------------
    def path_of(self, rollout_id: str) -> Path | None:
        """The stored result file of a finished rollout (read it in pieces: `server.results.pages`), or None."""
        if not ROLLOUT_ID.fullmatch(rollout_id):
            return None
        path = self.root / f"{rollout_id}.json"
        return path if path.is_file() else None

    def get(self, rollout_id: str) -> RolloutResult | None:
        if not ROLLOUT_ID.fullmatch(rollout_id):
            return None
        with self._lock:
            if (hit := self._cache.get(rollout_id)) is not None:
                self._cache.move_to_end(rollout_id)
        if hit is not None:
            return RolloutResult.model_validate_json(hit)
        path = self.root / f"{rollout_id}.json"
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None
        result = RolloutResult.model_validate_json(data)
        with self._lock:
            if path.exists():  # not deleted meanwhile
                self._remember(rollout_id, data)
        return result

    def result_summary(self, rollout_id: str) -> ResultSummary | None:
        """A stored result's summary form (without its pages) from the index, without reading the result; None when
        the index row is older than the summary form (or there is none)."""
        with self._lock:
            if rollout_id in self._unindexed:
                return None
            row = self.db.execute("SELECT summary FROM results WHERE id = ?", (rollout_id,)).fetchone()
        if row is None or '"result_form"' not in row[0]:
            return None
        try:
            return ResultSummary.model_validate_json(row[0])
        except ValueError:
            return None

    def summaries(self, limit: int = 100) -> list[RolloutSummary]:
        with self._lock:
            self._flush_deletes()
            skip = set(self._unindexed)
            rows = self.db.execute(
                "SELECT id, summary FROM results ORDER BY finished DESC LIMIT ?", (limit + len(skip),)
            ).fetchall()
        out = []
        for rid, summary in rows:
            if rid in skip or len(out) >= limit:
                continue
            with contextlib.suppress(ValueError):
                out.append(RolloutSummary.model_validate_json(summary))  # a summary form's other fields: dropped
        return out

    def usage(self) -> tuple[int, int]:
        """(results stored, their bytes), from the index."""
        with self._lock:
            n, total = self.db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM results").fetchone()
        return int(n), int(total)

    def oldest(self, batch: int = 256) -> Iterator[tuple[str, float, int]]:
        """(id, finished, bytes) of stored results, oldest first (read in batches: deleting while iterating is fine)."""
        after: tuple[float, str] = (float("-inf"), "")
        while True:
            with self._lock:
                rows = self.db.execute(
                    "SELECT id, finished, bytes FROM results WHERE (finished, id) > (?, ?) "
                    "ORDER BY finished, id LIMIT ?",
                    (after[0], after[1], batch),
                ).fetchall()
            if not rows:
                return
            yield from rows
            after = (rows[-1][1], rows[-1][0])

    def close(self) -> None:
        with self._lock:
            self.db.close()
        self.owner.release()

    # -- after a crash --------------------------------------------------------------------------------------------
    def _owner_alive(self, owner: object, verdict: dict[str, bool]) -> bool:
        if not isinstance(owner, str):
            return False
        if owner not in verdict:
            if owner.isdigit():  # a temporary file named before owners: by its process id
                verdict[owner] = owner == str(os.getpid()) or Path(f"/proc/{owner}").exists()
            else:
                verdict[owner] = self.owner.alive_check(owner)
        return verdict[owner]

    def recover(self) -> list[str]:
        """Mark rollouts that servers which are gone left running as failed; returns their ids. Also removes
        temporary files such a server left half-written. A live server's (another one on this results dir) are
        left alone: its rollouts are in flight, its temporary files are being written."""
        verdict: dict[str, bool] = {}
        for path in self.root.glob(".*.tmp"):
            m = TMP_NAME.fullmatch(path.name)
            if m is None or not self._owner_alive(m["owner"], verdict):
                path.unlink(missing_ok=True)
        recovered = []
        for path in self.root.glob("*.running"):
            try:
                body = json.loads(path.read_text())
                if self._owner_alive(body.get("owner"), verdict):
                    continue  # in flight on a live server
                req = RolloutRequest.model_validate(body["request"])
                rid = body["rollout_id"]
                phase = body.get("phase", "validate")
                if phase not in get_args(Phase):
                    raise ValueError(f"bad phase {phase!r}")
            except (ValueError, KeyError, AttributeError):
                path.unlink(missing_ok=True)
                continue
            except FileNotFoundError:
                continue  # finished meanwhile (its server is alive after all)
            if self.get(rid) is None:
                error = f"server_restarted: the server stopped in phase {phase!r} before this rollout finished"
                self.put(failed_result(req, error, phase=phase, rollout_id=rid))
                recovered.append(rid)
            path.unlink(missing_ok=True)
        return recovered
