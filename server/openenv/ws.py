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
from collections.abc import Awaitable
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


async def serve_ws(compat: OpenEnvCompat, websocket: WebSocket) -> None:
    set_caller(websocket.headers, websocket.url.scheme)  # tools run in process: see server/security
    await websocket.accept()
    sock = _Socket(websocket)
    session: Session | None = None
    owns = False
    try:
        try:
            requested = websocket.query_params.get("session_id")
            if requested:
                session = compat.sessions.get(requested)
                if session is None:
                    raise LookupError(f"Unknown session_id: {requested}")
                if session.ws_attached:
                    session = None
                    raise LookupError(f"Session {requested} already has an attached WebSocket")
                session.ws_attached = True
                session.last_activity_at = time.monotonic()
            else:
                session = compat.open_session(presented_token(), "WS /ws", websocket.client)
                session.ws_attached = owns = True
        except SessionRefused as e:
            await sock.send(ws_error(str(e), "ACCESS_DENIED"))
            await websocket.close(POLICY_VIOLATION)
            return
        except SessionCapacityError as e:
            await sock.send(
                ws_error(str(e), "CAPACITY_REACHED", active_sessions=e.active_sessions, max_sessions=e.max_sessions)
            )
            return
        except LookupError as e:
            await sock.send(ws_error(str(e), "SESSION_ERROR"))
            return

        ordered: asyncio.Queue = asyncio.Queue()

        async def handle(msg: WSMessage) -> None:
            rid = msg.request_id
            try:
                if isinstance(msg, WSResetMessage):
                    reply = {"type": "observation", "data": compat.reset(session, msg.data)}
                elif isinstance(msg, WSStepMessage):
                    reply = {"type": "observation", "data": await compat.step(session, msg.data)}
                elif isinstance(msg, WSStateMessage):
                    reply = {"type": "state", "data": compat.state(session)}
                else:
                    assert isinstance(msg, WSMCPMessage)
                    reply = {"type": "mcp", "data": await compat.handle_rpc_obj(msg.data, session)}
            except ValidationError as e:
                reply = ws_error("Invalid message", "VALIDATION_ERROR", errors=validation_errors(e))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("WS /ws: a %s message failed", type(msg).__name__)
                reply = ws_error(INTERNAL, "EXECUTION_ERROR")
            with contextlib.suppress(Exception):
                await sock.send(reply, rid)

        async def in_order() -> None:
            while True:
                await handle(await ordered.get())

        sock.spawn(in_order())
        while True:
            raw = await _receive_text(websocket, None if session.used else compat.sessions.unused_idle_s)
            if raw is None:
                break
            if len(raw) > MAX_WS_MESSAGE:
                await sock.send(
                    ws_error(f"message of {len(raw)} bytes exceeds the {MAX_WS_MESSAGE}-byte limit", "VALIDATION_ERROR")
                )
                continue
            try:
                body = parse_json(raw)
            except BodyError as e:
                await sock.send(ws_error(f"Invalid JSON: {e}", "INVALID_JSON"))
                continue
            if not isinstance(body, dict):
                await sock.send(ws_error("Invalid message: expected a JSON object", "VALIDATION_ERROR"))
                continue
            rid = body.get("request_id")
            rid = rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None
            msg_type = body.get("type", "")
            model = WS_MESSAGES.get(msg_type) if isinstance(msg_type, str) else None
            if model is None:
                await sock.send(ws_error(f"Unknown message type: {msg_type}", "UNKNOWN_TYPE"), rid)
                continue
            try:
                msg = model.model_validate(body)
            except ValidationError as e:
                await sock.send(ws_error("Invalid message", "VALIDATION_ERROR", errors=validation_errors(e)), rid)
                continue
            if isinstance(msg, WSCloseMessage):
                break
            session.used = True  # it asked for something: the long idle timeout from now on (and no wait limit)
            if len(sock.tasks) + ordered.qsize() > MAX_IN_FLIGHT_PER_SOCKET:
                await sock.send(
                    ws_error(
                        f"{MAX_IN_FLIGHT_PER_SOCKET} requests already in flight on this connection",
                        "CAPACITY_REACHED",
                    ),
                    msg.request_id,
                )
            elif msg.request_id is None:
                ordered.put_nowait(msg)
            else:
                sock.spawn(handle(msg))
    except WebSocketDisconnect:
        pass
    except _Unused:
        with contextlib.suppress(Exception):
            msg = f"session closed: nothing sent for {compat.sessions.unused_idle_s:g} s after it opened"
            await sock.send(ws_error(msg, "SESSION_ERROR"))
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

        while True:
            raw = await _receive_text(websocket, None if session.used else compat.sessions.unused_idle_s)
            if raw is None:
                break
            if len(raw) > MAX_WS_MESSAGE:
                await sock.send(rpc_error(None, INVALID_REQUEST, f"message exceeds the {MAX_WS_MESSAGE}-byte limit"))
            elif len(sock.tasks) > MAX_IN_FLIGHT_PER_SOCKET:
                await sock.send(rpc_error(None, SERVER_ERROR, "too many requests in flight on this connection"))
            else:
                session.used = True  # it asked for something: the long idle timeout from now on (and no wait limit)
                sock.spawn(handle(raw))
    except WebSocketDisconnect:
        pass
    except _Unused:
        with contextlib.suppress(Exception):
            msg = f"session closed: nothing sent for {compat.sessions.unused_idle_s:g} s after it opened"
            await sock.send(rpc_error(None, SERVER_ERROR, msg))
    finally:
        await sock.cancel_all()
        if session is not None:
            compat.sessions.remove(session.session_id)
        with contextlib.suppress(Exception):
            await websocket.close()
