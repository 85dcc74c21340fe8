"""Trainer-side clients. They import `swe_gym_env.wire` and never `swe_gym_env.server`.

`pip install swe_gym_env` alone brings what the websocket client needs (pydantic, httpx, websockets);
the MCP client needs the `mcp` extra (fastmcp); the server is the `server` extra.
"""

from typing import Any

__all__ = ["SweGymClient", "SweGymWSClient", "SyncSweGymWSClient"]


def __getattr__(name: str) -> Any:  # lazy: the MCP client's fastmcp is an optional extra
    if name == "SweGymClient":
        from swe_gym_env.client.mcp_client import SweGymClient

        return SweGymClient
    if name in ("SweGymWSClient", "SyncSweGymWSClient"):
        from swe_gym_env.client import ws_client

        return getattr(ws_client, name)
    raise AttributeError(name)
