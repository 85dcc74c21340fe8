"""HTTP POST /mcp: OpenEnv's bare JSON-RPC flavour beside real MCP.

OpenEnv's client posts `openenv/session/create|close`, then `tools/list` / `tools/call` with `params.session_id`,
with no `initialize`, and reads a plain JSON reply. It shares the path with the real MCP endpoint (Streamable
HTTP): `OpenEnvMCPBridge` wraps the fastmcp app, answers OpenEnv's requests itself and passes everything else
(`initialize`, then requests carrying `Mcp-Session-Id`) through untouched.

Every POST /mcp body is parsed here first (`security.parse_json`): one that is not JSON, nested too deep or not
UTF-8 gets 400 with a JSON-RPC parse error naming why, in one line, whichever client sent it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swe_gym_env.server.openenv.models import PARSE_ERROR, rpc_error
from swe_gym_env.server.openenv.protocol import OpenEnvCompat
from swe_gym_env.server.security import BodyError, log_refusal, parse_json, set_caller

MAX_HTTP_BODY = 8 * 1024 * 1024  # bodies we buffer to look at; a larger one goes to the MCP app as it came


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers") or []:
        if k.lower() == name:
            return v
    return None


def _is_openenv_request(scope: Scope, body: Any) -> bool:
    """Whether a POST /mcp without Mcp-Session-Id is OpenEnv's, not a standard MCP client's.

    A standard client's first request is `initialize`; after it, it carries Mcp-Session-Id (stateful servers) or
    MCP-Protocol-Version. OpenEnv's client never initializes: `openenv/session/*`, and `tools/list` / `tools/call`
    with `params.session_id` (or, for a one-off call, with neither header). Malformed JSON-RPC from a caller that
    is not speaking MCP gets OpenEnv's error reply (`openenv validate` posts `{}` and expects JSON-RPC back).
    """
    speaks_mcp = _header(scope, b"mcp-protocol-version") is not None
    if body is _UNPARSEABLE:
        return not speaks_mcp
    if isinstance(body, list):  # a JSON-RPC batch: MCP's business
        return False
    if not isinstance(body, dict) or not isinstance(body.get("method"), str) or body.get("jsonrpc") != "2.0":
        return not speaks_mcp
    method = body["method"]
    if method.startswith("openenv/"):
        return True
    params = body.get("params")
    if isinstance(params, dict) and "session_id" in params:  # OpenEnv's session, never an MCP parameter
        return True
    return method in ("tools/list", "tools/call") and not speaks_mcp


_UNPARSEABLE = object()


class OpenEnvMCPBridge:
    """ASGI wrapper around the fastmcp app at /mcp: answers OpenEnv's bare JSON-RPC POSTs with plain JSON, and
    passes everything else through untouched (the buffered body replayed)."""

    def __init__(self, app: ASGIApp, compat: OpenEnvCompat, path: str = "/mcp") -> None:
        self.app = app
        self.compat = compat
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or _route_path(scope).rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        chunks: list[bytes] = []
        size, complete = 0, False
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_HTTP_BODY:
                break
            if not message.get("more_body", False):
                complete = True
                break
        body: Any = _UNPARSEABLE
        if complete:
            try:
                body = parse_json(b"".join(chunks))
            except BodyError as e:  # nobody, MCP or OpenEnv, can take it: say why, in one line
                log_refusal("POST /mcp", f"unparseable body: {e}", scope.get("client"))
                await _send_json(send, rpc_error(None, PARSE_ERROR, f"Parse error: {e}"), 400)
                return
        if not complete or _header(scope, b"mcp-session-id") is not None or not _is_openenv_request(scope, body):
            await self.app(scope, _replay(messages, receive), send)
            return
        set_caller(Headers(scope=scope), scope.get("scheme", "http"))  # tools run in process: see server/security
        handler = asyncio.ensure_future(self.compat.handle_rpc_obj(body))
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({handler, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            gone.cancel()
            handler.cancel()
            raise
        gone.cancel()
        if not handler.done():  # the caller went away: stop waiting (a rollout itself goes on)
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
            return
        await _send_json(send, handler.result())


async def _send_json(send: Send, reply: dict, status: int = 200) -> None:
    payload = json.dumps(reply, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _route_path(scope: Scope) -> str:
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
