"""The websocket endpoints: WS /ws (OpenEnv's messages: reset, step, state, mcp, close) and WS /mcp (JSON-RPC
frames, one session per connection).

On /ws a message may carry a `request_id` (our extension): every reply to it echoes it, and such messages run
concurrently; messages without one are answered one at a time, in order, as OpenEnv's clients expect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from swe_gym_env.server.openenv.models import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    SERVER_ERROR,
    WS_MESSAGES,
    WSCloseMessage,
    WSMCPMessage,
    WSMessage,
    WSResetMessage,
    WSStateMessage,
    WSStepMessage,
    rpc_error,
    validation_errors,
    ws_error,
)
from swe_gym_env.server.openenv.protocol import OpenEnvCompat, SessionRefused
from swe_gym_env.server.openenv.sessions import Session, SessionCapacityError
from swe_gym_env.server.security import BodyError, parse_json, presented_token, set_caller

log = logging.getLogger(__name__)
POLICY_VIOLATION = 1008  # the websocket close code of a refused session
INTERNAL = "internal error (see the server log)"

MAX_WS_MESSAGE = 8 * 1024 * 1024  # an incoming websocket message larger than this is refused (and skipped)
MAX_WS_REPLY = 96 * 1024 * 1024  # below OpenEnv's client default (100 MB), which closes the socket on a larger frame
MAX_IN_FLIGHT_PER_SOCKET = 256


class _Socket:
    """One websocket: replies go out under one lock; a reply too large for OpenEnv's client becomes an error."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.lock = asyncio.Lock()  # created per connection, inside the serving loop
        self.tasks: set[asyncio.Task] = set()

    async def send(self, reply: dict, request_id: Any = None) -> None:
        if request_id is not None:
            reply = {**reply, "request_id": request_id}
        text = json.dumps(reply, separators=(",", ":"))
        if len(text) > MAX_WS_REPLY:
            msg = (
                f"reply of {len(text)} bytes exceeds the {MAX_WS_REPLY}-byte websocket frame limit; "
                "fetch it over HTTP /mcp (e.g. get_rollout with its rollout_id)"
            )
            error = ws_error(msg, "EXECUTION_ERROR")
            text = json.dumps(error if request_id is None else {**error, "request_id": request_id})
        async with self.lock:
            if self.ws.client_state == WebSocketState.CONNECTED:
                await self.ws.send_text(text)

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel_all(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


class _Unused(Exception):
    """A session that never did anything sat idle past its short timeout."""


async def _receive_text(ws: WebSocket, unused_s: float | None = None) -> str | None:
    """The next message's text; None when the client went away. ``unused_s``: the session has not done anything
    yet, and this is how long it may wait for a message (else ``_Unused``)."""
    if unused_s is None:
        msg = await ws.receive()
    else:
        try:
            msg = await asyncio.wait_for(ws.receive(), unused_s)
        except TimeoutError:
            raise _Unused from None
    if msg["type"] == "websocket.disconnect":
        return None
    if msg.get("text") is not None:
        return msg["text"]
    data = msg.get("bytes") or b""
    return data.decode("utf-8", "replace")


async def _next_text(compat: OpenEnvCompat, session: Session, ws: WebSocket) -> str | None:
    """The next message's text on a session's socket (a session that has done nothing yet waits only so long)."""
    return await _receive_text(ws, None if session.used else compat.sessions.unused_idle_s)


async def _until_closed(
    compat: OpenEnvCompat, sock: _Socket, serve: Callable[[], Awaitable[None]], error: Callable[[str], dict]
) -> None:
    """Run ``serve`` until the client goes; a session that did nothing for too long is told so (``error`` builds the
    reply in the endpoint's own form)."""
    try:
        await serve()
    except WebSocketDisconnect:
        pass
    except _Unused:
        with contextlib.suppress(Exception):
            await sock.send(
                error(f"session closed: nothing sent for {compat.sessions.unused_idle_s:g} s after it opened")
            )


def _attach(compat: OpenEnvCompat, requested: str) -> Session:
    """The existing session ``requested`` names, attached to this socket; LookupError when there is none or it has
    one already."""
    session = compat.sessions.get(requested)
    if session is None:
        raise LookupError(f"Unknown session_id: {requested}")
    if session.ws_attached:
        raise LookupError(f"Session {requested} already has an attached WebSocket")
    session.ws_attached = True
    session.last_activity_at = time.monotonic()
    return session


async def _ws_session(compat: OpenEnvCompat, websocket: WebSocket, sock: _Socket) -> tuple[Session | None, bool]:
    """The session a /ws connection works in: the one ``?session_id=`` names, else a new one it owns (True); None
    when refused, the client told why."""
    try:
        if requested := websocket.query_params.get("session_id"):
            return _attach(compat, requested), False
        session = compat.open_session(presented_token(), "WS /ws", websocket.client)
        session.ws_attached = True
        return session, True
    except SessionRefused as e:
        await sock.send(ws_error(str(e), "ACCESS_DENIED"))
        await websocket.close(POLICY_VIOLATION)
    except SessionCapacityError as e:
        data = {"active_sessions": e.active_sessions, "max_sessions": e.max_sessions}
        await sock.send(ws_error(str(e), "CAPACITY_REACHED", **data))
    except LookupError as e:
        await sock.send(ws_error(str(e), "SESSION_ERROR"))
    return None, False


class _WsMessages:
    """One /ws connection's messages: those with a request_id run at once, the others one at a time, in order."""

    def __init__(self, compat: OpenEnvCompat, sock: _Socket, session: Session) -> None:
        self.compat, self.sock, self.session = compat, sock, session
        self.ordered: asyncio.Queue = asyncio.Queue()

    async def run(self) -> None:
        self.sock.spawn(self._in_order())
        while (raw := await _next_text(self.compat, self.session, self.sock.ws)) is not None:
            msg = await self._parse(raw)
            if isinstance(msg, WSCloseMessage):
                return
            if msg is not None:
                self.session.used = True  # it asked for something: the long idle timeout from now on (no wait limit)
                await self._dispatch(msg)

    async def _parse(self, raw: str) -> WSMessage | None:
        """The message ``raw`` holds; None when it is none (the client is told why)."""
        if len(raw) > MAX_WS_MESSAGE:
            too_large = f"message of {len(raw)} bytes exceeds the {MAX_WS_MESSAGE}-byte limit"
            return await self._refuse(ws_error(too_large, "VALIDATION_ERROR"))
        try:
            body = parse_json(raw)
        except BodyError as e:
            return await self._refuse(ws_error(f"Invalid JSON: {e}", "INVALID_JSON"))
        if not isinstance(body, dict):
            return await self._refuse(ws_error("Invalid message: expected a JSON object", "VALIDATION_ERROR"))
        rid = body.get("request_id")
        rid = rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None
        msg_type = body.get("type", "")
        model = WS_MESSAGES.get(msg_type) if isinstance(msg_type, str) else None
        if model is None:
            return await self._refuse(ws_error(f"Unknown message type: {msg_type}", "UNKNOWN_TYPE"), rid)
        try:
            return model.model_validate(body)
        except ValidationError as e:
            return await self._refuse(ws_error("Invalid message", "VALIDATION_ERROR", errors=validation_errors(e)), rid)

    async def _refuse(self, reply: dict, request_id: Any = None) -> None:
        await self.sock.send(reply, request_id)

    async def _dispatch(self, msg: WSMessage) -> None:
        if len(self.sock.tasks) + self.ordered.qsize() > MAX_IN_FLIGHT_PER_SOCKET:
            busy = f"{MAX_IN_FLIGHT_PER_SOCKET} requests already in flight on this connection"
            await self.sock.send(ws_error(busy, "CAPACITY_REACHED"), msg.request_id)
        elif msg.request_id is None:
            self.ordered.put_nowait(msg)
        else:
            self.sock.spawn(self._handle(msg))

    async def _in_order(self) -> None:
        while True:
            await self._handle(await self.ordered.get())

    async def _handle(self, msg: WSMessage) -> None:
        try:
            reply = await self._reply(msg)
        except ValidationError as e:
            reply = ws_error("Invalid message", "VALIDATION_ERROR", errors=validation_errors(e))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("WS /ws: a %s message failed", type(msg).__name__)
            reply = ws_error(INTERNAL, "EXECUTION_ERROR")
        with contextlib.suppress(Exception):
            await self.sock.send(reply, msg.request_id)

    async def _reply(self, msg: WSMessage) -> dict:
        compat, session = self.compat, self.session
        if isinstance(msg, WSResetMessage):
            return {"type": "observation", "data": compat.reset(session, msg.data)}
        if isinstance(msg, WSStepMessage):
            return {"type": "observation", "data": await compat.step(session, msg.data)}
        if isinstance(msg, WSStateMessage):
            return {"type": "state", "data": compat.state(session)}
        assert isinstance(msg, WSMCPMessage)
        return {"type": "mcp", "data": await compat.handle_rpc_obj(msg.data, session)}


async def serve_ws(compat: OpenEnvCompat, websocket: WebSocket) -> None:
    """WS /ws: OpenEnv's messages in one session (its own, or an HTTP-made one named by ``?session_id=``)."""
    set_caller(websocket.headers, websocket.url.scheme)  # tools run in process: see server/security
    await websocket.accept()
    sock = _Socket(websocket)
    session: Session | None = None
    owns = False
    try:
        session, owns = await _ws_session(compat, websocket, sock)
        if session is not None:
            serve = _WsMessages(compat, sock, session).run
            await _until_closed(compat, sock, serve, lambda msg: ws_error(msg, "SESSION_ERROR"))
    except Exception:  # never let one socket's failure reach the server, nor its text the client
        log.exception("WS /ws failed")
        with contextlib.suppress(Exception):
            await sock.send(ws_error(INTERNAL, "SESSION_ERROR"))
    finally:
        await sock.cancel_all()  # rollouts themselves go on in the rollout service, retrievable by id
        if session is not None:
            session.ws_attached = False
            session.last_activity_at = time.monotonic()
            if owns or session.pending_close:
                compat.sessions.remove(session.session_id)
        with contextlib.suppress(Exception):
            await websocket.close()


async def serve_ws_mcp(compat: OpenEnvCompat, websocket: WebSocket) -> None:
    """WS /mcp: JSON-RPC frames, one session per connection; each request answered by its id as it completes."""
    set_caller(websocket.headers, websocket.url.scheme)
    await websocket.accept()
    sock = _Socket(websocket)
    session: Session | None = None
    try:
        try:
            session = compat.open_session(presented_token(), "WS /mcp", websocket.client)
            session.ws_attached = True
        except SessionRefused as e:
            await sock.send(rpc_error(None, SERVER_ERROR, str(e)))
            await websocket.close(POLICY_VIOLATION)
            return
        except SessionCapacityError as e:
            data = {"active_sessions": e.active_sessions, "max_sessions": e.max_sessions}
            await sock.send(rpc_error(None, SERVER_ERROR, str(e), data))
            return
        await _until_closed(
            compat, sock, _mcp_frames(compat, sock, session), lambda m: rpc_error(None, SERVER_ERROR, m)
        )
    finally:
        await sock.cancel_all()
        if session is not None:
            compat.sessions.remove(session.session_id)
        with contextlib.suppress(Exception):
            await websocket.close()


def _mcp_frames(compat: OpenEnvCompat, sock: _Socket, session: Session) -> Callable[[], Awaitable[None]]:
    """WS /mcp's loop: each frame handled in its own task, answered when done."""

    async def handle(raw: str) -> None:
        try:
            reply = await compat.handle_rpc_raw(raw, session)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("WS /mcp: a request failed")
            reply = rpc_error(None, INTERNAL_ERROR, INTERNAL)
        with contextlib.suppress(Exception):
            await sock.send(reply)

    async def serve() -> None:
        while (raw := await _next_text(compat, session, sock.ws)) is not None:
            if len(raw) > MAX_WS_MESSAGE:
                await sock.send(rpc_error(None, INVALID_REQUEST, f"message exceeds the {MAX_WS_MESSAGE}-byte limit"))
            elif len(sock.tasks) > MAX_IN_FLIGHT_PER_SOCKET:
                await sock.send(rpc_error(None, SERVER_ERROR, "too many requests in flight on this connection"))
            else:
                session.used = True  # it asked for something: the long idle timeout from now on (and no wait limit)
                sock.spawn(handle(raw))

    return serve
