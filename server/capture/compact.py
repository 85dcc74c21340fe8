"""Compact turns: each call's request as what the call it continues did not have (see `wire.Turn`).

A session keeps, per call, only the digests of its request's messages and of its other fields (16 bytes each), never
the request itself: a new request is cut into the leading messages it shares with its base call (the rollout graph's
``Node.base``, so a chain stores each message once) and the rest.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
DIGEST = 16


def digest(obj: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(obj, option=_SORTED), digest_size=DIGEST).digest()


class RequestDigests:
    """Per call of a session (in call order): its messages' digests (one bytes string) and its params' digest."""

    def __init__(self) -> None:
        self._messages: list[bytes] = []
        self._params: list[bytes] = []

    def add(self, base: int | None, messages: list, params: dict) -> dict:
        """Record the next call's request; its compact fields against ``base`` (an earlier call, or None)."""
        mine = b"".join(digest(m) for m in messages)
        p = digest(params)
        kept, same = 0, False
        if base is not None:
            theirs = self._messages[base]
            n = min(len(theirs), len(mine)) // DIGEST
            while kept < n and theirs[kept * DIGEST : (kept + 1) * DIGEST] == mine[kept * DIGEST : (kept + 1) * DIGEST]:
                kept += 1
            same = self._params[base] == p
        self._messages.append(mine)
        self._params.append(p)
        return {
            "messages_base": base,
            "messages_kept": kept,
            "new_messages": list(messages[kept:]),
            "params": None if same else params,
        }
