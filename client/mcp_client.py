"""Typed client for a swe_gym_env server over MCP (Streamable HTTP). Imports nothing from the server."""

from __future__ import annotations

from typing import Any, Protocol

from fastmcp import Client

from swe_gym_env.wire import RolloutRequest, RolloutResult, failed_result


class Progress(Protocol):
    """A progress callback: MCP progress notifications of a running rollout (phases, model calls)."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


class SweGymClient:
    """`async with SweGymClient("http://host:port/mcp") as c: result = await c.run_rollout(...)`."""

    def __init__(self, url: str, *, timeout_s: float = 3600.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._client = Client(url, timeout=timeout_s)

    async def __aenter__(self) -> SweGymClient:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.__aexit__(*exc)

    async def list_tools(self) -> list[str]:
        return [t.name for t in await self._client.list_tools()]

    async def run_rollout(
        self, request: RolloutRequest | None = None, *, on_progress: Progress | None = None, **fields: Any
    ) -> RolloutResult:
        req = request or RolloutRequest(**fields)
        res = await self._client.call_tool(
            "run_rollout",
            req.model_dump(exclude_none=True),
            progress_handler=on_progress,
            timeout=self.timeout_s,
            raise_on_error=False,
        )
        if res.is_error or res.structured_content is None:
            text = " ".join(getattr(c, "text", "") for c in res.content)
            return failed_result(req, f"run_rollout failed on the server: {text[:1000]}")
        data = res.structured_content
        return RolloutResult.model_validate(data.get("result", data) if "rollout_id" not in data else data)
