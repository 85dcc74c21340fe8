"""OpenEnv's wire protocol on this server, so OpenEnv's own clients and trainers built on them work unchanged.

Matched against openenv 0.10.0 (`openenv/core/env_server/http_server.py`, `mcp_types.py`, `types.py`,
`mcp_client.py`, `env_client.py`):

- Task API: `GET /list_environments`, `GET /{env}/splits`, `POST /{env}/tasks|num_tasks|task|task_range`
  (unknown env 404, bad index 400, unknown split 400; every method exists, so OpenEnv's 501 never occurs),
  backed by the task catalog; task payloads are `TaskView`s, never patches.
- `GET /metadata` (EnvironmentMetadata) and `GET /schema` (SchemaResponse, from wire.py's models).
- `POST /mcp`, OpenEnv's bare JSON-RPC flavour: `openenv/session/create|close`, then `tools/list` / `tools/call`
  with `params.session_id`, no `initialize`, a plain JSON reply. It shares the path with the real MCP endpoint
  (Streamable HTTP): `OpenEnvMCPBridge` wraps the fastmcp app, answers OpenEnv's requests itself and passes
  everything else (`initialize`, then requests carrying `Mcp-Session-Id`) through untouched.
- `WS /ws`: OpenEnv's messages (reset, step, state, mcp, close); step actions `call_tool` / `list_tools`. A
  message may carry a `request_id` (our extension): every reply to it echoes it, and such messages run
  concurrently; messages without one are answered one at a time, in order, as OpenEnv's clients expect.
- `WS /mcp`: JSON-RPC frames over a websocket, one session per connection.

Tools are called in process on the same FastMCP server (`mcp.call_tool`), so a tool behaves the same on every
path. Tool names OpenEnv reserves (reset, step, state, close) are never listed or called.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, WebSocket
from fastmcp import FastMCP
from fastmcp.exceptions import NotFoundError
from fastmcp.exceptions import ValidationError as ToolArgumentsError
from fastmcp.tools.base import ToolResult
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect, WebSocketState

from swe_gym_env.server.mcp_tools import RESERVED_TOOL_NAMES
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.security import bearer, caller_token
from swe_gym_env.tasks.catalog import TaskNotFound, extra_sources, split_names, tasks_in
from swe_gym_env.wire import (
    Capabilities,
    RolloutRequest,
    RolloutResult,
    RolloutSummary,
    TaskPage,
    TaskView,
)

log = logging.getLogger(__name__)

ENV_NAME = "swe_gym_env"
MAX_HTTP_BODY = 8 * 1024 * 1024  # bodies we buffer to look at; a larger one goes to the MCP app as it came
MAX_WS_MESSAGE = 8 * 1024 * 1024  # an incoming websocket message larger than this is refused (and skipped)
MAX_WS_REPLY = 96 * 1024 * 1024  # below OpenEnv's client default (100 MB), which closes the socket on a larger frame
MAX_IN_FLIGHT_PER_SOCKET = 256


# -- JSON-RPC (openenv/core/env_server/mcp_types.py: JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse) ----------
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000


class JsonRpcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


def rpc_result(request_id: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


# -- sessions ---------------------------------------------------------------------------------------------------
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


class Sessions:
    """OpenEnv sessions (HTTP /mcp and websockets). They hold no resources but a record: rollouts run in the
    rollout service, which keeps them past a caller that goes away. An idle session (no call in flight, no
    websocket attached) expires after ``idle_s``, so a client that never closes cannot leak them."""

    def __init__(self, idle_s: float, max_sessions: int) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        self.reap()
        return len(self._sessions)

    def reap(self) -> None:
        now = time.monotonic()
        for sid, s in list(self._sessions.items()):
            if not s.in_flight and not s.ws_attached and now - s.last_activity_at > self.idle_s:
                del self._sessions[sid]

    def create(self) -> Session:
        self.reap()
        if len(self._sessions) >= self.max_sessions:
            raise SessionCapacityError(len(self._sessions), self.max_sessions)
        now = time.monotonic()
        s = Session(session_id=str(uuid.uuid4()), created_at=now, last_activity_at=now)
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
        s.last_activity_at = time.monotonic()
        try:
            yield
        finally:
            s.in_flight -= 1
            s.last_activity_at = time.monotonic()
            if step:
                s.step_count += 1


# -- MCP step actions and observations (openenv/core/env_server/mcp_types.py, types.py) ----------------------------
class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the action")


class CallToolAction(_Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str = Field(description="Name of the tool to call, e.g. run_rollout")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Tool arguments; run_rollout takes RolloutRequest's fields"
    )


class ListToolsAction(_Action):
    type: Literal["list_tools"] = "list_tools"


StepAction = Annotated[CallToolAction | ListToolsAction, Field(discriminator="type")]
STEP_ACTION = TypeAdapter(StepAction)


class ToolErrorInfo(BaseModel):
    error_type: Literal["execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"]
    message: str


class ToolCallResult(BaseModel):
    """What a tool call returns on every OpenEnv path (fastmcp's CallToolResult, as OpenEnv serialises it)."""

    content: list[dict[str, Any]]
    structured_content: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    data: RolloutResult | RolloutSummary | list[RolloutSummary] | TaskPage | TaskView | Capabilities | bool | None
    is_error: bool = False


class Observation(BaseModel):
    done: bool = False
    reward: float | None = Field(None, description="run_rollout's reward once the rollout is graded")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any]


class CallToolObservation(Observation):
    tool_name: str
    result: ToolCallResult | None = None
    error: ToolErrorInfo | None = None


class ListToolsObservation(Observation):
    tools: list[ToolSpec]


class EnvState(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = Field(0, ge=0)
    session_id: str | None = None
    rollouts_in_flight: int = Field(0, ge=0, description="Rollouts running on this server, all sessions together")


class EnvironmentMetadata(BaseModel):
    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


# -- websocket messages (openenv/core/env_server/types.py WS*Message; plus our optional request_id) ---------------
RequestId = Annotated[str, Field(max_length=255)] | int


class _WSMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: RequestId | None = Field(None, description="Echoed in every reply to this message")


class WSResetMessage(_WSMessage):
    type: Literal["reset"] = "reset"
    data: dict[str, Any] = Field(default_factory=dict)


class WSStepMessage(_WSMessage):
    type: Literal["step"] = "step"
    data: dict[str, Any]


class WSStateMessage(_WSMessage):
    type: Literal["state"] = "state"


class WSCloseMessage(_WSMessage):
    type: Literal["close"] = "close"


class WSMCPMessage(_WSMessage):
    type: Literal["mcp"] = "mcp"
    data: dict[str, Any]


WS_MESSAGES: dict[str, type[_WSMessage]] = {
    "reset": WSResetMessage,
    "step": WSStepMessage,
    "state": WSStateMessage,
    "close": WSCloseMessage,
    "mcp": WSMCPMessage,
}


def ws_error(message: str, code: str, **extra: Any) -> dict:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _validation_errors(e: ValidationError) -> list[dict]:
    return json.loads(e.json())


# -- tools --------------------------------------------------------------------------------------------------------
class ToolCallError(Exception):
    def __init__(self, error_type: str, message: str, rpc_code: int = INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.rpc_code = rpc_code


def _content_block(block: Any) -> dict:
    d = block.model_dump(mode="json") if hasattr(block, "model_dump") else dict(block)
    if "_meta" in d:
        d["meta"] = d.pop("_meta")
    d.setdefault("annotations", None)
    d.setdefault("meta", None)
    return d


def tool_result_payload(res: ToolResult) -> dict:
    """fastmcp's client-side CallToolResult as OpenEnv serialises it: content, structured_content, meta, data
    (the structured result, unwrapped when fastmcp wrapped a non-object return), is_error."""
    sc = res.structured_content
    meta = res.meta
    data = None
    if sc is not None:
        wrapped = isinstance(meta, dict) and bool((meta.get("fastmcp") or {}).get("wrap_result"))
        data = sc.get("result") if wrapped else sc
    return {
        "content": [_content_block(b) for b in res.content],
        "structured_content": sc,
        "meta": meta,
        "data": data,
        "is_error": bool(res.is_error),
    }


class ToolBridge:
    def __init__(self, mcp: FastMCP) -> None:
        self.mcp = mcp

    async def tools(self) -> list:
        tools = []
        for t in await self.mcp.list_tools():
            if t.name in RESERVED_TOOL_NAMES:
                log.warning("tool %r uses a name OpenEnv reserves; not offered", t.name)
                continue
            tools.append(t)
        return tools

    async def list_wire(self) -> list[dict]:
        """tools/list entries as OpenEnv's HTTP /mcp returns them (mcp's Tool, field names as on the wire)."""
        out = []
        for t in await self.tools():
            d = t.to_mcp_tool().model_dump(mode="json", by_alias=True)
            d["meta"] = d.pop("_meta", None)
            out.append(
                {
                    "name": d.get("name"),
                    "title": d.get("title"),
                    "description": d.get("description"),
                    "inputSchema": d.get("inputSchema") or {},
                    "outputSchema": d.get("outputSchema"),
                    "icons": d.get("icons"),
                    "annotations": d.get("annotations"),
                    "meta": d.get("meta"),
                    "execution": d.get("execution"),
                }
            )
        return out

    async def list_specs(self) -> list[dict]:
        """list_tools step observation entries (OpenEnv's Tool: name, description, input_schema)."""
        return [
            {"name": t.name, "description": t.description or "", "input_schema": t.parameters or {}}
            for t in await self.tools()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> dict:
        """Call a tool; its result in OpenEnv's shape, or ToolCallError."""
        if name in RESERVED_TOOL_NAMES:
            raise ToolCallError(
                "tool_not_found",
                f"Tool name {name!r} is reserved by OpenEnv ({', '.join(sorted(RESERVED_TOOL_NAMES))})",
                INVALID_PARAMS,
            )
        try:
            res = await self.mcp.call_tool(name, arguments)
        except NotFoundError as e:
            raise ToolCallError("tool_not_found", str(e)) from e
        except ToolArgumentsError as e:
            raise ToolCallError("invalid_args", str(e)) from e
        except Exception as e:  # the tool's own failure, as fastmcp reports it
            raise ToolCallError("execution_error", str(e) or type(e).__name__) from e
        if res.is_error:
            text = "\n".join(getattr(b, "text", "") for b in res.content) or "tool reported an error"
            raise ToolCallError("execution_error", text)
        return tool_result_payload(res)


# -- the protocol ---------------------------------------------------------------------------------------------------
class OpenEnvCompat:
    def __init__(self, mcp: FastMCP, service: RolloutService, idle_s: float, max_sessions: int) -> None:
        self.tools = ToolBridge(mcp)
        self.service = service
        self.sessions = Sessions(idle_s, max_sessions)

    # JSON-RPC: HTTP /mcp, WS /mcp, and `mcp` messages on WS /ws (OpenEnv's mcp_handler) -------------------------
    async def handle_rpc(self, req: JsonRpcRequest, ws_session: Session | None = None) -> dict:
        method, rid, params = req.method, req.id, req.params
        if method == "openenv/session/create":
            if ws_session is not None:
                return rpc_result(rid, {"session_id": ws_session.session_id})
            try:
                s = self.sessions.create()
            except SessionCapacityError as e:
                data = {"active_sessions": e.active_sessions, "max_sessions": e.max_sessions}
                return rpc_error(rid, SERVER_ERROR, str(e), data)
            return rpc_result(rid, {"session_id": s.session_id})
        if method == "openenv/session/close":
            target = params.get("session_id")
            if not target or not isinstance(target, str):
                return rpc_error(rid, INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if ws_session is not None and target == ws_session.session_id:
                return rpc_error(rid, INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
            s = self.sessions.get(target)
            if s is None:
                return rpc_error(rid, INVALID_PARAMS, f"Unknown session_id: {target}")
            if s.ws_attached:  # closes when its websocket detaches
                s.pending_close = True
                return rpc_result(rid, {"session_id": target, "closed": False, "closing": True})
            self.sessions.remove(target)
            return rpc_result(rid, {"session_id": target, "closed": True})

        session = ws_session
        requested = params.get("session_id")
        if session is None and requested:
            session = self.sessions.get(str(requested))
            if session is None:
                return rpc_error(rid, INVALID_PARAMS, f"Unknown session_id: {requested}")

        if method == "tools/list":
            with self.sessions.busy(session):
                try:
                    return rpc_result(rid, {"tools": await self.tools.list_wire()})
                except Exception as e:
                    return rpc_error(rid, INTERNAL_ERROR, str(e))
        if method == "tools/call":
            name = params.get("name")
            if not name or not isinstance(name, str):
                return rpc_error(rid, INVALID_PARAMS, "Missing 'name' in params")
            arguments = params.get("arguments") or {}
            if not isinstance(arguments, dict):
                return rpc_error(rid, INVALID_PARAMS, "Invalid params - 'arguments' must be an object")
            with self.sessions.busy(session, step=True):
                try:
                    return rpc_result(rid, await self.tools.call(name, arguments))
                except ToolCallError as e:
                    return rpc_error(rid, e.rpc_code, e.message)
        return rpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {method}")

    async def handle_rpc_raw(self, raw: str | bytes, ws_session: Session | None = None) -> dict:
        """One JSON-RPC request from its text, with OpenEnv's parse / invalid-request errors."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return rpc_error(None, PARSE_ERROR, "Parse error")
        return await self.handle_rpc_obj(body, ws_session)

    async def handle_rpc_obj(self, body: Any, ws_session: Session | None = None) -> dict:
        try:
            req = JsonRpcRequest.model_validate(body)
        except ValidationError as e:
            return rpc_error(None, INVALID_REQUEST, f"Invalid request: {e}")
        return await self.handle_rpc(req, ws_session)

    # WS /ws step actions -------------------------------------------------------------------------------------------
    async def step(self, session: Session, data: dict[str, Any]) -> dict:
        action = STEP_ACTION.validate_python(data)  # ValidationError -> VALIDATION_ERROR
        with self.sessions.busy(session, step=True):
            if isinstance(action, ListToolsAction):
                try:
                    obs = ListToolsObservation(tools=await self.tools.list_specs())
                except Exception as e:
                    obs = ListToolsObservation(tools=[], metadata={"error": str(e), "error_type": "list_tools_failed"})
                return _serialize_observation(obs.model_dump())
            try:
                result = await self.tools.call(action.tool_name, action.arguments)
            except ToolCallError as e:
                obs = {
                    "done": False,
                    "reward": None,
                    "metadata": {},
                    "tool_name": action.tool_name,
                    "result": None,
                    "error": {"error_type": e.error_type, "message": e.message},
                }
                return _serialize_observation(obs)
            done, reward = False, None
            if action.tool_name == "run_rollout" and isinstance(result.get("data"), dict):
                # one rollout is one episode: its graded reward is the step's reward
                done, reward = True, result["data"].get("reward")
            obs = {
                "done": done,
                "reward": reward,
                "metadata": {},
                "tool_name": action.tool_name,
                "result": result,
                "error": None,
            }
            return _serialize_observation(obs)

    def reset(self, session: Session, data: dict[str, Any]) -> dict:
        episode_id = data.get("episode_id")
        session.episode_id = episode_id if isinstance(episode_id, str) and episode_id else uuid.uuid4().hex
        session.step_count = 0
        session.last_activity_at = time.monotonic()
        meta = {"status": "ready", "episode_id": session.episode_id}
        return _serialize_observation({"done": False, "reward": None, "metadata": meta})

    def state(self, session: Session) -> dict:
        return EnvState(
            episode_id=session.episode_id,
            step_count=session.step_count,
            session_id=session.session_id,
            rollouts_in_flight=self.service.in_flight(),
        ).model_dump()


def _serialize_observation(obs: dict) -> dict:
    """openenv/core/env_server/serialization.py serialize_observation: observation without reward/done, and
    reward, done (and metadata, when not empty) beside it."""
    observation = {k: v for k, v in obs.items() if k not in ("reward", "done")}
    out = {"observation": observation, "reward": obs.get("reward"), "done": bool(obs.get("done"))}
    if obs.get("metadata"):
        out["metadata"] = obs["metadata"]
    return out


# -- WS /ws -----------------------------------------------------------------------------------------------------------
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


async def _receive_text(ws: WebSocket) -> str | None:
    """The next message's text; None when the client went away."""
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return None
    if msg.get("text") is not None:
        return msg["text"]
    data = msg.get("bytes") or b""
    return data.decode("utf-8", "replace")


async def _serve_ws(compat: OpenEnvCompat, websocket: WebSocket) -> None:
    caller_token.set(bearer(websocket.headers.get("authorization")))  # tools run in process: see server/security
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
                session = compat.sessions.create()
                session.ws_attached = owns = True
        except SessionCapacityError as e:
            await sock.send(
                ws_error(str(e), "CAPACITY_REACHED", active_sessions=e.active_sessions, max_sessions=e.max_sessions)
            )
            return
        except LookupError as e:
            await sock.send(ws_error(str(e), "SESSION_ERROR"))
            return

        ordered: asyncio.Queue = asyncio.Queue()

        async def handle(msg: _WSMessage) -> None:
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
                reply = ws_error("Invalid message", "VALIDATION_ERROR", errors=_validation_errors(e))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                reply = ws_error(str(e) or type(e).__name__, "EXECUTION_ERROR")
            with contextlib.suppress(Exception):
                await sock.send(reply, rid)

        async def in_order() -> None:
            while True:
                await handle(await ordered.get())

        sock.spawn(in_order())
        while True:
            raw = await _receive_text(websocket)
            if raw is None:
                break
            if len(raw) > MAX_WS_MESSAGE:
                await sock.send(
                    ws_error(f"message of {len(raw)} bytes exceeds the {MAX_WS_MESSAGE}-byte limit", "VALIDATION_ERROR")
                )
                continue
            try:
                body = json.loads(raw)
            except ValueError as e:
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
                await sock.send(ws_error("Invalid message", "VALIDATION_ERROR", errors=_validation_errors(e)), rid)
                continue
            if isinstance(msg, WSCloseMessage):
                break
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
    except Exception as e:  # never let one socket's failure reach the server
        with contextlib.suppress(Exception):
            await sock.send(ws_error(str(e) or type(e).__name__, "SESSION_ERROR"))
    finally:
        await sock.cancel_all()  # rollouts themselves go on in the rollout service, retrievable by id
        if session is not None:
            session.ws_attached = False
            session.last_activity_at = time.monotonic()
            if owns or session.pending_close:
                compat.sessions.remove(session.session_id)
        with contextlib.suppress(Exception):
            await websocket.close()


async def _serve_ws_mcp(compat: OpenEnvCompat, websocket: WebSocket) -> None:
    """WS /mcp: JSON-RPC frames, one session per connection; each request answered by its id as it completes."""
    caller_token.set(bearer(websocket.headers.get("authorization")))
    await websocket.accept()
    sock = _Socket(websocket)
    session: Session | None = None
    try:
        try:
            session = compat.sessions.create()
            session.ws_attached = True
        except SessionCapacityError as e:
            data = {"active_sessions": e.active_sessions, "max_sessions": e.max_sessions}
            await sock.send(rpc_error(None, SERVER_ERROR, str(e), data))
            return

        async def handle(raw: str) -> None:
            reply = await compat.handle_rpc_raw(raw, session)
            with contextlib.suppress(Exception):
                await sock.send(reply)

        while True:
            raw = await _receive_text(websocket)
            if raw is None:
                break
            if len(raw) > MAX_WS_MESSAGE:
                await sock.send(rpc_error(None, INVALID_REQUEST, f"message exceeds the {MAX_WS_MESSAGE}-byte limit"))
            elif len(sock.tasks) > MAX_IN_FLIGHT_PER_SOCKET:
                await sock.send(rpc_error(None, SERVER_ERROR, "too many requests in flight on this connection"))
            else:
                sock.spawn(handle(raw))
    except WebSocketDisconnect:
        pass
    finally:
        await sock.cancel_all()
        if session is not None:
            compat.sessions.remove(session.session_id)
        with contextlib.suppress(Exception):
            await websocket.close()


# -- HTTP /mcp: OpenEnv's bare JSON-RPC beside real MCP -------------------------------------------------------------
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
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or _route_path(scope).rstrip("/") != self.path
            or _header(scope, b"mcp-session-id") is not None
        ):
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
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                body = json.loads(b"".join(chunks))
        if not complete or not _is_openenv_request(scope, body):
            await self.app(scope, _replay(messages, receive), send)
            return
        if body is _UNPARSEABLE:
            await _send_json(send, rpc_error(None, PARSE_ERROR, "Parse error"))
            return
        caller_token.set(bearer((_header(scope, b"authorization") or b"").decode("latin-1")))
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


async def _send_json(send: Send, reply: dict) -> None:
    payload = json.dumps(reply, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
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


# -- Task API, /metadata, /schema -------------------------------------------------------------------------------------
class ListTasksRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    split: str = Field(description="Task split name")


class NumTasksRequest(ListTasksRequest):
    pass


class GetTaskRequest(ListTasksRequest):
    index: int = Field(description="Task index within the split")


class GetTaskRangeRequest(ListTasksRequest):
    start: int | None = Field(None, description="Inclusive start index")
    stop: int | None = Field(None, description="Exclusive stop index")


def _check_env(env_name: str) -> None:
    if env_name.lower() != ENV_NAME:
        raise HTTPException(status_code=404, detail=f"unknown environment {env_name!r}")


async def _split_tasks(split: str) -> tuple:
    try:
        return await asyncio.to_thread(tasks_in, split)
    except TaskNotFound as e:
        raise HTTPException(status_code=400, detail=str(e)) from e


def _views(tasks) -> list[dict]:
    return [t.view().model_dump(mode="json") for t in tasks]


def _metadata() -> EnvironmentMetadata:
    try:
        ver = version("swe_gym_env")
    except PackageNotFoundError:
        ver = None
    readme = Path(__file__).resolve().parent.parent / "README.md"
    return EnvironmentMetadata(
        name=ENV_NAME,
        description=(
            "Coding-agent RL rollouts on real software tasks: run_rollout boots a sandbox, runs the agent with "
            "every model call captured (prompt/completion token ids, logprobs), grades its diff with the task's "
            "tests and returns the reward and the token-level trace."
        ),
        readme_content=readme.read_text(encoding="utf-8") if readme.is_file() else None,
        version=ver,
    )


def _schemas() -> dict:
    action = STEP_ACTION.json_schema()
    action.setdefault("$defs", {})["RolloutRequest"] = RolloutRequest.model_json_schema()
    action["description"] = (
        "A step is one MCP tool call: call_tool (run_rollout takes RolloutRequest's fields as arguments) or list_tools."
    )
    return {
        "action": action,
        "observation": TypeAdapter(CallToolObservation | ListToolsObservation).json_schema(),
        "state": EnvState.model_json_schema(),
        "reset_observation": Observation.model_json_schema(),
    }


def _env_settings() -> tuple[float, int]:
    idle = float(os.environ.get("SWE_GYM_OPENENV_SESSION_IDLE_S", "3600"))
    cap = int(os.environ.get("SWE_GYM_OPENENV_MAX_SESSIONS", "4096"))
    return idle, cap


def install_openenv_routes(
    app: FastAPI,
    mcp: FastMCP,
    service: RolloutService,
    *,
    session_idle_s: float | None = None,
    max_sessions: int | None = None,
) -> None:
    """Add OpenEnv's routes to ``app``. Call it before the catch-all mounts; then mount the MCP app as
    ``wrap_mcp_app(app, mcp_app)`` so OpenEnv's bare JSON-RPC POSTs to /mcp are answered too.

    Sessions expire after ``session_idle_s`` idle (env SWE_GYM_OPENENV_SESSION_IDLE_S, default 3600) and number
    at most ``max_sessions`` (SWE_GYM_OPENENV_MAX_SESSIONS, default 4096)."""
    idle, cap = _env_settings()
    compat = OpenEnvCompat(
        mcp,
        service,
        idle if session_idle_s is None else session_idle_s,
        cap if max_sessions is None else max_sessions,
    )
    app.state.openenv = compat

    @app.get("/metadata", tags=["Environment Info"])
    async def metadata() -> EnvironmentMetadata:
        return _metadata()

    @app.get("/schema", tags=["Schema"])
    async def schema() -> dict:
        return _schemas()

    @app.get("/list_environments", tags=["Task API"])
    async def list_environments() -> list[str]:
        return [ENV_NAME]

    @app.get("/{env_name}/splits", tags=["Task API"])
    async def list_splits(env_name: str) -> list[dict[str, Any]]:
        _check_env(env_name)
        sources = extra_sources()
        out = []
        for name in split_names():
            kind = sources[name][1] if name in sources else name
            out.append({"name": name, "type": kind if kind in ("train", "validation", "test") else "validation"})
        return out

    @app.post("/{env_name}/tasks", tags=["Task API"])
    async def list_tasks(env_name: str, request: ListTasksRequest) -> dict[str, Any]:
        _check_env(env_name)
        return {"tasks": _views(await _split_tasks(request.split)), "env_name": ENV_NAME}

    @app.post("/{env_name}/num_tasks", tags=["Task API"])
    async def num_tasks(env_name: str, request: NumTasksRequest) -> dict[str, Any]:
        _check_env(env_name)
        return {"num_tasks": len(await _split_tasks(request.split))}

    @app.post("/{env_name}/task", tags=["Task API"])
    async def get_task(env_name: str, request: GetTaskRequest) -> dict[str, Any]:
        _check_env(env_name)
        tasks = await _split_tasks(request.split)
        if not 0 <= request.index < len(tasks):
            raise HTTPException(status_code=400, detail="Invalid task index")
        return {"task": tasks[request.index].view().model_dump(mode="json")}

    @app.post("/{env_name}/task_range", tags=["Task API"])
    async def get_task_range(env_name: str, request: GetTaskRangeRequest) -> dict[str, Any]:
        _check_env(env_name)
        tasks = await _split_tasks(request.split)
        return {"tasks": _views(tasks[request.start : request.stop])}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await _serve_ws(compat, websocket)

    @app.websocket("/mcp")
    async def ws_mcp(websocket: WebSocket) -> None:
        await _serve_ws_mcp(compat, websocket)


def wrap_mcp_app(app: FastAPI, mcp_app: ASGIApp) -> ASGIApp:
    """The fastmcp HTTP app behind OpenEnv's bare JSON-RPC flavour (needs install_openenv_routes first)."""
    return OpenEnvMCPBridge(mcp_app, app.state.openenv)


__all__ = ["ENV_NAME", "OpenEnvMCPBridge", "install_openenv_routes", "wrap_mcp_app"]
