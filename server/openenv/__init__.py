"""OpenEnv's wire protocol on this server, so OpenEnv's own clients and trainers built on them work unchanged.

Matched against openenv 0.10.0 (`openenv/core/env_server/http_server.py`, `mcp_types.py`, `types.py`,
`mcp_client.py`, `env_client.py`). One module per seam:

- `models`: the wire shapes (JSON-RPC, step actions and observations, state, metadata, websocket messages);
- `sessions`: OpenEnv sessions, their idle timeout and the cap on how many are open;
- `tools`: the MCP-tool bridge (tools called in process on the same FastMCP server, so a tool behaves the same on
  every path; names OpenEnv reserves, reset, step, state and close, are never listed or called);
- `protocol`: JSON-RPC handling and the step / reset / state messages, shared by every transport;
- `ws`: `WS /ws` (OpenEnv's messages) and `WS /mcp` (JSON-RPC frames, one session per connection);
- `http_bridge`: OpenEnv's bare JSON-RPC on `POST /mcp`, beside the real MCP endpoint;
- `tasks_api`: the Task API (`/list_environments`, `/{env}/splits`, `/{env}/tasks|num_tasks|task|task_range`);
- `info`: `GET /metadata` and `GET /schema`.

Who may start work is decided by the tools themselves (`server.security.start_refusal`); the transports here
record the caller of each request (`server.security.set_caller`), and opening a session needs what reading rollouts
needs (`server.security.session_refusal`, in `OpenEnvCompat.open_session`, on every path that opens one).
"""

from __future__ import annotations

from fastapi import FastAPI, WebSocket
from fastmcp import FastMCP
from starlette.types import ASGIApp

from swe_gym_env.server.openenv.http_bridge import OpenEnvMCPBridge
from swe_gym_env.server.openenv.info import install_info_routes
from swe_gym_env.server.openenv.models import ENV_NAME
from swe_gym_env.server.openenv.protocol import OpenEnvCompat
from swe_gym_env.server.openenv.sessions import Sessions
from swe_gym_env.server.openenv.tasks_api import install_task_api
from swe_gym_env.server.openenv.ws import serve_ws, serve_ws_mcp
from swe_gym_env.server.rollout import RolloutService

__all__ = ["ENV_NAME", "OpenEnvCompat", "OpenEnvMCPBridge", "Sessions", "install_openenv_routes", "wrap_mcp_app"]


def _env_settings() -> tuple[float, int, float]:
    from swe_gym_env.core.settings import setting

    return (
        setting("openenv_session_idle_s"),
        setting("openenv_max_sessions"),
        setting("openenv_unused_session_idle_s"),
    )


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

    Sessions expire after ``session_idle_s`` idle (env SWE_GYM_OPENENV_SESSION_IDLE_S, default 3600), or after
    SWE_GYM_OPENENV_UNUSED_SESSION_IDLE_S (120) if they never did anything, and number at most ``max_sessions``
    (SWE_GYM_OPENENV_MAX_SESSIONS, default 4096) of strangers' and as many of token holders'. Opening one needs
    what reading rollouts needs (``security.session_refusal``)."""
    idle, cap, unused = _env_settings()
    compat = OpenEnvCompat(
        mcp,
        service,
        idle if session_idle_s is None else session_idle_s,
        cap if max_sessions is None else max_sessions,
        unused,
    )
    app.state.openenv = compat

    install_info_routes(app)
    install_task_api(app)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_ws(compat, websocket)

    @app.websocket("/mcp")
    async def ws_mcp(websocket: WebSocket) -> None:
        await serve_ws_mcp(compat, websocket)


def wrap_mcp_app(app: FastAPI, mcp_app: ASGIApp) -> ASGIApp:
    """The fastmcp HTTP app behind OpenEnv's bare JSON-RPC flavour (needs install_openenv_routes first)."""
    return OpenEnvMCPBridge(mcp_app, app.state.openenv)
