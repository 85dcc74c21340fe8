"""OpenEnv sessions (HTTP /mcp and websockets): a record each, idle timeouts and caps on how many are open.

Strangers' sessions and token holders' sessions (``server.security.holds_token``) are counted apart, each up to
``max_sessions``: however many sessions strangers open (where they may open any: an open server, or public reads),
a token holder is never refused for it. A session that never did anything (no call, no reset) expires after
``unused_idle_s`` (minutes), one that did after ``idle_s``."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


class SessionCapacityError(RuntimeError):
    def __init__(self, active: int, maximum: int) -> None:
        super().__init__(f"Server at capacity: {active}/{maximum} sessions active; close one or retry later")
        self.active_sessions = active
        self.max_sessions = maximum


@dataclass
class Session:
    session_id: str
    created_at: float
    last_activity_at: float
    episode_id: str | None = None
    step_count: int = 0
    in_flight: int = 0
    ws_attached: bool = False
    pending_close: bool = False
    privileged: bool = False  # opened by a token holder: counted apart from strangers' sessions
    used: bool = False  # did something (a call or a reset): only then does the long idle timeout apply


class Sessions:
    """OpenEnv sessions (HTTP /mcp and websockets). They hold no resources but a record: rollouts run in the
    rollout service, which keeps them past a caller that goes away. An idle session (no call in flight, no
    websocket attached) expires after ``idle_s``, or ``unused_idle_s`` if it never did anything, so a client that
    never closes cannot leak them."""

    def __init__(self, idle_s: float, max_sessions: int, unused_idle_s: float | None = None) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.unused_idle_s = idle_s if unused_idle_s is None else min(unused_idle_s, idle_s)
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        self.reap()
        return len(self._sessions)

    def reap(self) -> None:
        now = time.monotonic()
        for sid, s in list(self._sessions.items()):
            limit = self.idle_s if s.used else self.unused_idle_s
            if not s.in_flight and not s.ws_attached and now - s.last_activity_at > limit:
                del self._sessions[sid]

    def count(self, privileged: bool) -> int:
        return sum(1 for s in self._sessions.values() if s.privileged == privileged)

    def create(self, privileged: bool = False) -> Session:
        """A new session; ``privileged`` (a token holder's) is counted only against other token holders'."""
        self.reap()
        held = self.count(privileged)
        if held >= self.max_sessions:
            raise SessionCapacityError(held, self.max_sessions)
        now = time.monotonic()
        s = Session(session_id=str(uuid.uuid4()), created_at=now, last_activity_at=now, privileged=privileged)
        self._sessions[s.session_id] = s
        return s

    def get(self, session_id: str) -> Session | None:
        self.reap()
        return self._sessions.get(session_id)

    def remove(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    @contextlib.contextmanager
    def busy(self, s: Session | None, *, step: bool = False) -> Iterator[None]:
        if s is None:
            yield
            return
        s.in_flight += 1
        s.used = True
        s.last_activity_at = time.monotonic()
        try:
            yield
        finally:
            s.in_flight -= 1
            s.last_activity_at = time.monotonic()
            if step:
                s.step_count += 1
