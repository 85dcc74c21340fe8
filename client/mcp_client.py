"""Typed client for swe_gym_env servers over MCP (Streamable HTTP). Imports nothing from the server.

`SweGymClient(url)` talks to one server; `SweGymClient([url1, url2, ...])` spreads rollouts over several by their
free capacity, and gives each rollout an id that names its server (`swe_gym_env.client.servers`), so
`get_rollout` finds it again, also from another client process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from fastmcp import Client

from swe_gym_env.client.servers import NoServerAvailable, Server, ServerSet
from swe_gym_env.wire import RolloutRequest, RolloutResult, RolloutStatus, failed_result


class Progress(Protocol):
    """A progress callback: MCP progress notifications of a running rollout (phases, model calls)."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


def _base(mcp_url: str) -> str:
    return mcp_url.strip().rstrip("/").removesuffix("/mcp")


class SweGymClient:
    """`async with SweGymClient("http://host:port/mcp") as c: result = await c.run_rollout(...)`."""

    def __init__(self, url: str | Sequence[str], *, timeout_s: float = 3600.0, health_ttl_s: float = 2.0) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        self.urls = urls
        self.url = urls[0]
        self.timeout_s = timeout_s
        self.servers = ServerSet([_base(u) for u in urls], health_ttl_s)
        self._clients = {s.tag: Client(u, timeout=timeout_s) for s, u in zip(self.servers.servers, urls, strict=True)}
        self._open: contextlib.AsyncExitStack | None = None
        self._entered: set[str] = set()
        self._client = self._clients[self.servers.servers[0].tag]

    async def __aenter__(self) -> SweGymClient:
        self._open = contextlib.AsyncExitStack()
        if self.servers.single:
            await self._session(self.servers.servers[0])
        else:
            await self.servers.refresh(force=True)
            await self.servers.any_server()  # NoServerAvailable, naming why each is down
        return self

    async def __aexit__(self, *exc: Any) -> None:
        stack, self._open = self._open, None
        self._entered.clear()
        try:
            if stack is not None:
                await stack.__aexit__(*exc)
        finally:
            await self.servers.aclose()

    async def _session(self, server: Server) -> Client:
        """The server's MCP session, opened on first use."""
        client = self._clients[server.tag]
        if server.tag not in self._entered:
            if self._open is None:
                raise RuntimeError("use the client as `async with SweGymClient(...) as c:`")
            await self._open.enter_async_context(client)
            self._entered.add(server.tag)
        return client

    async def list_tools(self) -> list[str]:
        client = await self._session(await self.servers.any_server())
        return [t.name for t in await client.list_tools()]

    async def run_rollout(
        self, request: RolloutRequest | None = None, *, on_progress: Progress | None = None, **fields: Any
    ) -> RolloutResult:
        req = request or RolloutRequest(**fields)
        try:
            async with self.servers.slot(self.timeout_s, self.servers.home(req.rollout_id)) as server:
                if req.rollout_id is None:
                    req = req.model_copy(update={"rollout_id": self.servers.new_rollout_id(server)})
                self.servers.record(str(req.rollout_id), server)
                client = await self._session(server)
                try:
                    res = await client.call_tool(
                        "run_rollout",
                        req.model_dump(exclude_none=True),
                        progress_handler=on_progress,
                        timeout=self.timeout_s,
                        raise_on_error=False,
                    )
                except Exception as e:  # transport failures: fastmcp raises httpx, anyio and MCP errors alike
                    if self.servers.single:
                        raise
                    self.servers.mark_down(server, f"MCP call failed: {type(e).__name__}: {e}")
                    return failed_result(
                        req,
                        f"{type(e).__name__}: {e}; the rollout may still be running on {server.url}: "
                        f"get_rollout({req.rollout_id!r})",
                    )
        except (NoServerAvailable, TimeoutError) as e:
            return failed_result(req, f"{type(e).__name__}: {e}")
        if res.is_error or res.structured_content is None:
            text = " ".join(getattr(c, "text", "") for c in res.content)
            return failed_result(req, f"run_rollout failed on the server: {text[:1000]}")
        data = res.structured_content
        return RolloutResult.model_validate(data.get("result", data) if "rollout_id" not in data else data)

    async def get_rollout(self, rollout_id: str) -> RolloutStatus:
        """A rollout's status from the server that ran it (recorded, or named by its id; else each is asked)."""
        errors = []
        for server in self.servers.candidates(rollout_id):
            client = await self._session(server)
            res = await client.call_tool("get_rollout", {"rollout_id": rollout_id}, raise_on_error=False)
            if not res.is_error and res.structured_content is not None:
                return RolloutStatus.model_validate(res.structured_content)
            errors.append(f"{server.url}: " + " ".join(getattr(c, "text", "") for c in res.content)[:300])
        raise LookupError(f"rollout {rollout_id!r} not found: " + "; ".join(errors))
