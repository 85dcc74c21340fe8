"""OpenEnv's protocol, shared by every transport: JSON-RPC (HTTP /mcp, WS /mcp, `mcp` messages on WS /ws, as
OpenEnv's mcp_handler) and the WS /ws step, reset and state messages."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from fastmcp import FastMCP
from pydantic import ValidationError

from swe_gym_env.server.openenv.models import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SERVER_ERROR,
    STEP_ACTION,
    EnvState,
    JsonRpcRequest,
    ListToolsAction,
    ListToolsObservation,
    rpc_error,
    rpc_result,
)
from swe_gym_env.server.openenv.sessions import Session, SessionCapacityError, Sessions
from swe_gym_env.server.openenv.tools import ToolBridge, ToolCallError
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.security import (
    BodyError,
    holds_token,
    log_refusal,
    parse_json,
    presented_caller,
    session_refusal,
)

log = logging.getLogger(__name__)


class SessionRefused(PermissionError):
    """Opening an OpenEnv session was refused (``security.session_refusal``): the reason, one line."""


def one_line_errors(e: ValidationError, limit: int = 300) -> str:
    """A validation error as one line (where and what), never its multi-line text or the input it quotes."""
    parts = [f"{'.'.join(str(x) for x in err.get('loc', ())) or 'body'}: {err.get('msg', '')}" for err in e.errors()]
    return "; ".join(parts)[:limit]


class OpenEnvCompat:
    def __init__(
        self,
        mcp: FastMCP,
        service: RolloutService,
        idle_s: float,
        max_sessions: int,
        unused_idle_s: float | None = None,
    ) -> None:
        self.tools = ToolBridge(mcp)
        self.service = service
        self.sessions = Sessions(idle_s, max_sessions, unused_idle_s)

    def open_session(self, token: str | None, surface: str, client: Any = None) -> Session:
        """A new session for a caller presenting ``token``: SessionRefused unless it may read rollouts (the one
        check of every path that creates a session), SessionCapacityError at the cap of its kind (a token holder's
        sessions are counted apart from strangers')."""
        if (why := session_refusal(token)) is not None:
            log_refusal(surface, why, client)
            raise SessionRefused(why)
        return self.sessions.create(privileged=holds_token(token))

    # JSON-RPC: HTTP /mcp, WS /mcp, and `mcp` messages on WS /ws (OpenEnv's mcp_handler) -------------------------
    async def handle_rpc(self, req: JsonRpcRequest, ws_session: Session | None = None) -> dict:
        method, rid, params = req.method, req.id, req.params
        if method == "openenv/session/create":
            if ws_session is not None:
                return rpc_result(rid, {"session_id": ws_session.session_id})
            try:
                s = self.open_session(presented_caller().token, "POST /mcp openenv/session/create")
            except SessionRefused as e:
                return rpc_error(rid, SERVER_ERROR, str(e))
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
                except Exception:
                    log.exception("tools/list failed")
                    return rpc_error(rid, INTERNAL_ERROR, "listing the tools failed (see the server log)")
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
            body = parse_json(raw)
        except BodyError as e:
            return rpc_error(None, PARSE_ERROR, f"Parse error: {e}")
        return await self.handle_rpc_obj(body, ws_session)

    async def handle_rpc_obj(self, body: Any, ws_session: Session | None = None) -> dict:
        try:
            req = JsonRpcRequest.model_validate(body)
        except ValidationError as e:
            return rpc_error(None, INVALID_REQUEST, f"Invalid request: {one_line_errors(e)}")
        return await self.handle_rpc(req, ws_session)

    # WS /ws step actions -------------------------------------------------------------------------------------------
    async def step(self, session: Session, data: dict[str, Any]) -> dict:
        action = STEP_ACTION.validate_python(data)  # ValidationError -> VALIDATION_ERROR
        with self.sessions.busy(session, step=True):
            if isinstance(action, ListToolsAction):
                try:
                    obs = ListToolsObservation.model_validate({"tools": await self.tools.list_specs()})
                except Exception:
                    log.exception("list_tools failed")
                    why = "listing the tools failed (see the server log)"
                    obs = ListToolsObservation(tools=[], metadata={"error": why, "error_type": "list_tools_failed"})
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
        session.used = True
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
