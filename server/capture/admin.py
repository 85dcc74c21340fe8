"""The session API (server app only, never served to sandboxes; the admin key when one is configured):
``/sessions`` list / mint, ``/sessions/{id}`` detail, ``…/export``, ``…/events`` (SSE push of calls as they land),
``DELETE`` to close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from swe_gym_env.server.capture.session import CaptureSession, EngineTarget
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.security import admin_ok, bearer, lock_reason, log_refusal
from swe_gym_env.wire import CaptureSessionCreate


class Sessions(Protocol):
    """What the session API needs of the proxy (`CaptureProxy`)."""

    sessions: dict[str, CaptureSession]
    store: CaptureStore | None

    def open_session(
        self,
        engine: EngineTarget,
        *,
        max_calls: int,
        max_tokens: int,
        call_timeout_s: float = ...,
        sampling: dict[str, float | int] | None = ...,
        passthrough: bool = ...,
        session_id: str | None = ...,
        labels: dict[str, str] | None = ...,
        stall_timeout_s: float = ...,
        max_consecutive_failures: int = ...,
    ) -> tuple[CaptureSession, str]: ...

    def close_session(self, session: CaptureSession) -> None: ...

    def session_detail(self, session_id: str) -> dict | None: ...

    def export(self, session_id: str) -> dict | None: ...


class AdminApi:
    def __init__(self, proxy: Sessions) -> None:
        self.proxy = proxy

    def routes(self) -> list[Route]:
        return [
            Route("/sessions", self.list_route, methods=["GET"]),
            Route("/sessions", self.create_route, methods=["POST"]),
            Route("/sessions/{sid}", self.detail_route, methods=["GET"]),
            Route("/sessions/{sid}", self.close_route, methods=["DELETE"]),
            Route("/sessions/{sid}/export", self.export_route, methods=["GET"]),
            Route("/sessions/{sid}/events", self.events_route, methods=["GET"]),
        ]

    @staticmethod
    def _denied(request: Request) -> JSONResponse | None:
        presented = bearer(request.headers.get("authorization")) or request.headers.get("x-admin-key")
        if not admin_ok(presented):  # a locked server (exposed, no secret) says which secret to set
            why = lock_reason() or "admin key required"
            log_refusal(f"{request.method} /capture{request.url.path.split('/capture', 1)[-1]}", why, request.client)
            return JSONResponse({"error": why}, 401)
        return None

    async def list_route(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        live = [s.summary() for s in self.proxy.sessions.values()]
        known = {s["id"] for s in live}
        store = self.proxy.store
        stored = [sid for sid in store.session_ids(200) if sid not in known] if store is not None else []
        return JSONResponse({"sessions": live, "stored": stored})

    async def create_route(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        raw = await request.body()
        if len(raw) > 64 * 1024:
            return JSONResponse({"error": "request body too large"}, 413)
        try:
            spec = CaptureSessionCreate.model_validate_json(raw)
        except ValueError as e:
            return JSONResponse({"error": f"invalid session spec: {e}"}, 422)
        engine = EngineTarget(
            spec.engine_url.rstrip("/"),
            spec.served_model,
            spec.engine_api_key,
            tuple(spec.engine_headers.items()),
        )
        session, key = self.proxy.open_session(
            engine,
            max_calls=spec.max_calls,
            max_tokens=spec.max_tokens,
            call_timeout_s=spec.call_timeout_s,
            sampling=spec.sampling,
            passthrough=spec.passthrough,
            labels=spec.labels,
        )
        return JSONResponse({"id": session.id, "key": key, "base_url": "/capture/v1"}, 201)

    async def detail_route(self, request: Request) -> Response:
        return self._document(request, self.proxy.session_detail)

    async def export_route(self, request: Request) -> Response:
        return self._document(request, self.proxy.export)

    def _document(self, request: Request, read: Callable[[str], dict | None]) -> Response:
        """The session's document as ``read`` gives it (404 where it knows no such session)."""
        if (denied := self._denied(request)) is not None:
            return denied
        doc = read(request.path_params["sid"])
        return JSONResponse(doc) if doc is not None else JSONResponse({"error": "no such session"}, 404)

    def _in_memory(self, request: Request, missing: str) -> CaptureSession | Response:
        """The session the path names, as the proxy holds it; else the response to answer (denied, or 404 with
        ``missing``)."""
        if (denied := self._denied(request)) is not None:
            return denied
        s = self.proxy.sessions.get(request.path_params["sid"])
        return s if s is not None else JSONResponse({"error": missing}, 404)

    async def close_route(self, request: Request) -> Response:
        s = self._in_memory(request, "no such open session")
        if isinstance(s, Response):
            return s
        self.proxy.close_session(s)
        return JSONResponse(s.summary())

    async def events_route(self, request: Request) -> Response:
        s = self._in_memory(request, "no such live session")
        if isinstance(s, Response):
            return s
        queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)
        s.subscribers.append(queue)

        async def events() -> AsyncIterator[dict]:
            try:
                yield {"event": "session", "data": json.dumps(s.summary())}
                if s.closed:
                    return
                while True:
                    event = await queue.get()
                    yield {"event": event["type"], "data": json.dumps(event)}
                    if event["type"] == "closed":
                        return
            finally:
                s.subscribers.remove(queue)

        return EventSourceResponse(events(), ping=15)
