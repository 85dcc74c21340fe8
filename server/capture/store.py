"""Durable capture: every call is written to SQLite before its reply goes back to the agent.

One database per server data dir. Token ids are stored as int32 and logprobs as float64 blobs; a prompt is stored as
(base call, shared prefix length, the rest), so a long conversation costs its new tokens, not its whole history on
every call. Messages likewise: only those past the previous call's are stored. A session can be read back after a
server restart (`load_session`), with its calls (in that stored form: `capture.export` rebuilds them), findings and
state.

Each session records its owner (`server.owners`: a lock this store holds while it is open). Several servers may share
one data dir: at startup `abandon_open` marks abandoned only the open sessions of owners that are gone (a crash,
SIGKILL included), never those of another live server.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from swe_gym_env.core.owners import Owner
from swe_gym_env.server.capture.graph import Node

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    state TEXT NOT NULL,          -- open | closed | abandoned (the server died while it was open)
    meta TEXT NOT NULL,           -- engine (no key), sampling, budgets, labels, provenance
    closed REAL,
    stop_reason TEXT,
    findings TEXT NOT NULL DEFAULT '[]',
    errors TEXT NOT NULL DEFAULT '[]',
    budget_replies INTEGER NOT NULL DEFAULT 0,
    demoted TEXT NOT NULL DEFAULT '[]',  -- calls the agent's own record shows it never used (graph discards)
    owner TEXT                    -- the store (server) that opened it: core/owners.py; NULL: before owners
);
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    at REAL NOT NULL,
    base INTEGER,                 -- earlier call whose ids this prompt shares a prefix with
    shared INTEGER NOT NULL,      -- length of that prefix
    prompt_rest BLOB NOT NULL,    -- int32, the prompt after the shared prefix
    completion BLOB NOT NULL,     -- int32
    logprobs BLOB NOT NULL,       -- float64 (float32 in stores written before; told apart by length)
    finish_reason TEXT,
    streamed INTEGER NOT NULL,
    wall_s REAL NOT NULL,
    keep_messages INTEGER NOT NULL,  -- leading messages equal to the previous call's
    new_messages TEXT NOT NULL,      -- JSON list: the rest
    request TEXT NOT NULL,           -- JSON: the upstream request without messages
    response TEXT NOT NULL,          -- JSON: the assistant message returned to the agent
    dialect TEXT NOT NULL DEFAULT 'openai-chat',  -- the API dialect the agent spoke
    PRIMARY KEY (session_id, idx)
);
"""


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _digest(message: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(message, option=_SORTED), digest_size=16).digest()


def _text(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()


class CaptureStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash; fsync at checkpoints
        self.db.executescript(SCHEMA)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(sessions)")}
        if "demoted" not in columns:  # a store written before demotions were kept
            self.db.execute("ALTER TABLE sessions ADD COLUMN demoted TEXT NOT NULL DEFAULT '[]'")
        if "dialect" not in {r[1] for r in self.db.execute("PRAGMA table_info(calls)")}:  # before dialects were kept
            self.db.execute("ALTER TABLE calls ADD COLUMN dialect TEXT NOT NULL DEFAULT 'openai-chat'")
        if "owner" not in columns:  # a store written before owners were kept: its open sessions count as dead ones'
            self.db.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
        self._last_messages: dict[str, list[bytes]] = {}
        self.owner = Owner(path.with_name(path.name + ".owners"))  # held while this store is open

    def close(self) -> None:
        self.db.close()
        self.owner.release()

    # -- writing -----------------------------------------------------------------------------------------------
    def open_session(self, session_id: str, meta: dict) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO sessions (id, created, state, meta, owner) VALUES (?, ?, 'open', ?, ?)",
            (session_id, time.time(), json.dumps(meta), self.owner.id),
        )

    def add_call(
        self,
        session_id: str,
        node: Node,
        *,
        finish_reason: str | None,
        streamed: bool,
        wall_s: float,
        request: dict,
        response: dict,
        dialect: str = "openai-chat",
    ) -> None:
        """One call, as the rollout graph linked it (its prompt is stored after the prefix it shares)."""
        messages = request.get("messages") or []
        digests = [_digest(m) for m in messages]
        prev = self._last_messages.get(session_id, [])
        keep = 0
        while keep < min(len(prev), len(digests)) and prev[keep] == digests[keep]:
            keep += 1
        self._last_messages[session_id] = digests
        self.db.execute(
            "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                node.index,
                time.time(),
                node.base,
                node.shared,
                node.prompt[node.shared :].astype(np.int32).tobytes(),
                node.completion.astype(np.int32).tobytes(),
                node.logprobs.astype(np.float64).tobytes(),
                finish_reason,
                int(streamed),
                wall_s,
                keep,
                _text(messages[keep:]),
                _text({k: v for k, v in request.items() if k != "messages"}),
                _text(response),
                dialect,
            ),
        )

    def update_session(self, session_id: str, **fields: Any) -> None:
        cols = {k: json.dumps(v) if k in ("findings", "errors", "meta", "demoted") else v for k, v in fields.items()}
        sets = ", ".join(f"{k} = ?" for k in cols)
        self.db.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*cols.values(), session_id))

    def close_session(self, session_id: str, **fields: Any) -> None:
        self.update_session(session_id, state="closed", closed=time.time(), **fields)
        self._last_messages.pop(session_id, None)

    def abandon_open(self) -> list[str]:
        """At startup: sessions that servers which are gone left open (their owner's lock is free: a crash, SIGKILL
        included; or no owner recorded, a store from before owners). They stay readable, marked abandoned; returns
        their ids. Sessions of a live server (another one on this data dir, or this store) stay open."""
        rows = self.db.execute("SELECT id, owner FROM sessions WHERE state = 'open' ORDER BY rowid").fetchall()
        verdict: dict[str | None, bool] = {}
        dead = []
        for session_id, owner in rows:
            if owner not in verdict:
                verdict[owner] = self.owner.alive_check(owner)
            if not verdict[owner]:
                dead.append(session_id)
        now = time.time()
        self.db.execute("BEGIN")
        try:
            self.db.executemany(
                "UPDATE sessions SET state = 'abandoned', closed = ? WHERE id = ? AND state = 'open'",
                [(now, session_id) for session_id in dead],
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return dead

    # -- reading -----------------------------------------------------------------------------------------------
    def session_ids(self, limit: int = 100) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT id FROM sessions ORDER BY created DESC LIMIT ?", (limit,))]

    def load_session(self, session_id: str) -> dict | None:
        row = self.db.execute(
            "SELECT created, state, meta, closed, stop_reason, findings, errors, budget_replies, demoted FROM sessions "
            "WHERE id = ?",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        created, state, meta, closed, stop_reason, findings, errors, budget_replies, demoted = row
        calls = []
        for r in self.db.execute(
            "SELECT idx, at, base, shared, prompt_rest, completion, logprobs, finish_reason, streamed, wall_s, "
            "keep_messages, new_messages, request, response, dialect FROM calls WHERE session_id = ? ORDER BY idx",
            (session_id,),
        ):
            idx, at, base, shared, rest, comp, lps, finish, streamed, wall, keep, new, request, response, dialect = r
            completion = np.frombuffer(comp, np.int32)
            calls.append(
                {  # as stored: the prompt after `shared` tokens of call `base`, messages after the previous call's
                    "index": idx,
                    "at": at,
                    "base": base,
                    "shared": shared,
                    "prompt_rest": np.frombuffer(rest, np.int32),
                    "completion_token_ids": completion.tolist(),
                    "logprobs": np.frombuffer(lps, np.float64 if len(lps) == 8 * len(completion) else np.float32)
                    .astype(float)
                    .tolist(),
                    "finish_reason": finish,
                    "streamed": bool(streamed),
                    "wall_s": wall,
                    "keep_messages": keep,
                    "new_messages": json.loads(new),
                    "params": json.loads(request),
                    "response_message": json.loads(response),
                    "dialect": dialect,
                }
            )
        return {
            "id": session_id,
            "created": created,
            "state": state,
            "meta": json.loads(meta),
            "closed": closed,
            "stop_reason": stop_reason,
            "findings": json.loads(findings),
            "errors": json.loads(errors),
            "budget_replies": budget_replies,
            "demoted": json.loads(demoted),
            "calls": calls,
        }

    def stored_bytes(self, session_id: str) -> int:
        row = self.db.execute(
            "SELECT SUM(LENGTH(prompt_rest) + LENGTH(completion) + LENGTH(logprobs)) FROM calls WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        return int(row[0] or 0)

    # -- retention (server/results/retention.py): on a connection of their own, so a pass in a thread never shares the
    # proxy's; each statement is its own transaction, so the proxy's writes wait milliseconds at most -------------
    def _side_db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        db.execute("PRAGMA busy_timeout = 10000")
        return db

    def ensure_incremental_vacuum(self, max_convert_bytes: int = 256 * 1024 * 1024) -> bool:
        """Make deleted sessions give their pages back to the file system (`PRAGMA incremental_vacuum`). A store
        created before needs one VACUUM to switch; done here when it is at most ``max_convert_bytes`` (else its free
        pages are still reused by new calls, the file just does not shrink). True when the store is incremental."""
        db = self._side_db()
        try:
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
                return True
            if self.path.stat().st_size > max_convert_bytes:
                return False
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            db.execute("VACUUM")
            return db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        finally:
            db.close()

    def disk_bytes(self) -> int:
        """What the store takes on disk: the database file and its write-ahead log."""
        total = 0
        for p in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def live_bytes(self) -> int:
        """The pages in use (the file less its free pages)."""
        db = self._side_db()
        try:
            size = db.execute("PRAGMA page_size").fetchone()[0]
            return (
                db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
            ) * size
        finally:
            db.close()

    def ended_sessions(
        self, after: tuple[float, str] = (float("-inf"), ""), limit: int = 256
    ) -> list[tuple[str, float]]:
        """(id, when it ended) of sessions no longer open, oldest first, after ``after`` (a previous page's last
        (ended, id)): closed or abandoned; an open one is a rollout in flight (a dead server's are marked abandoned
        at startup)."""
        db = self._side_db()
        try:
            return db.execute(
                "SELECT id, COALESCE(closed, created) AS ended FROM sessions WHERE state != 'open' "
                "AND (COALESCE(closed, created), id) > (?, ?) ORDER BY ended, id LIMIT ?",
                (after[0], after[1], limit),
            ).fetchall()
        finally:
            db.close()

    def delete_session(self, session_id: str) -> int:
        """Delete an ended session and its calls (never an open one). Returns roughly the bytes it held."""
        db = self._side_db()
        try:
            if (row := db.execute("SELECT state FROM sessions WHERE id = ?", (session_id,)).fetchone()) is None:
                return 0
            if row[0] == "open":
                return 0
            size = db.execute(
                "SELECT COALESCE(SUM(LENGTH(prompt_rest) + LENGTH(completion) + LENGTH(logprobs) + "
                "LENGTH(new_messages) + LENGTH(request) + LENGTH(response) + 64), 0) FROM calls WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM calls WHERE session_id = ?", (session_id,))
                db.execute("DELETE FROM sessions WHERE id = ? AND state != 'open'", (session_id,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return int(size) + 256
        finally:
            db.close()

    def reclaim(self) -> int:
        """Give free pages back to the file system and empty the write-ahead log; returns the bytes the store's
        files shrank by."""
        before = self.disk_bytes()
        db = self._side_db()
        try:
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
                db.executescript("PRAGMA incremental_vacuum;")  # stepped to the end (execute frees one page)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            db.close()
        return max(0, before - self.disk_bytes())
