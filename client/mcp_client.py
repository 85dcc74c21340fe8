"""Typed client for swe_gym_env servers over MCP (Streamable HTTP). Imports nothing from the server.

`SweGymClient(url)` talks to one server; `SweGymClient([url1, url2, ...])` spreads rollouts over several by their
free capacity, and gives each rollout an id that names its server (`swe_gym_env.client.servers`), so
`get_rollout` finds it again, also from another client process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

from fastmcp import Client

from swe_gym_env.client.servers import NoServerAvailable, Server, ServerSet
from swe_gym_env.wire import ResultSummary, RolloutRequest, RolloutResult, RolloutStatus, failed_result


class _Refetch(Exception):
    """The result could not be read whole this time: try again by the rollout's id."""


class Progress(Protocol):
    """A progress callback: MCP progress notifications of a running rollout (phases, model calls)."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


def _base(mcp_url: str) -> str:
    return mcp_url.strip().rstrip("/").removesuffix("/mcp")


class SweGymClient:
    """`async with SweGymClient("http://host:port/mcp") as c: result = await c.run_rollout(...)`."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        timeout_s: float = 3600.0,
        health_ttl_s: float = 2.0,
        retries: int = 6,
        token: str | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        self.urls = urls
        self.url = urls[0]
        self.timeout_s = timeout_s
        self.retries = retries
        self.servers = ServerSet([_base(u) for u in urls], health_ttl_s)
        self._client_kwargs: dict[str, Any] = {"auth": token} if token else {}
        self._urls = {s.tag: u for s, u in zip(self.servers.servers, urls, strict=True)}
        self._clients = {s.tag: Client(u, timeout=timeout_s, **self._client_kwargs) for s, u in self._urls_items()}
        self._open: contextlib.AsyncExitStack | None = None
        self._entered: set[str] = set()
        self._client = self._clients[self.servers.servers[0].tag]

    def _urls_items(self) -> list[tuple[Server, str]]:
        return [(s, self._urls[s.tag]) for s in self.servers.servers]

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
        """Run a rollout and return its whole result. Over MCP the server answers with the result's summary; the
        whole result is then read in pages (`resources/read`) and checked against the summary's SHA-256. Never
        raises for a rollout: a dropped stream or a server restart (while it runs or mid-fetch) is retried by the
        rollout's id (`run_rollout` with the same id attaches to it or returns its result), up to `retries` times;
        what still fails is a result with ok=false naming what failed and the id to fetch later."""
        req = request or RolloutRequest(**fields)
        try:
            async with self.servers.slot(self.timeout_s, self.servers.home(req.rollout_id)) as server:
                if req.rollout_id is None:
                    req = req.model_copy(update={"rollout_id": self.servers.new_rollout_id(server)})
                self.servers.record(str(req.rollout_id), server)
                return await self._run_on(server, req, on_progress)
        except (NoServerAvailable, TimeoutError) as e:
            return failed_result(req, f"{type(e).__name__}: {e}")

    async def _run_on(self, server: Server, req: RolloutRequest, on_progress: Progress | None) -> RolloutResult:
        args = req.model_dump(exclude_none=True)
        errors: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(2.0 ** (attempt - 1), 10.0, max(0.0, deadline - time.monotonic())))
            try:
                client = await self._session(server) if attempt == 0 else await self._reopen(server)
                res = await client.call_tool(
                    "run_rollout",
                    args,
                    progress_handler=on_progress,
                    timeout=max(1.0, deadline - time.monotonic()),
                    raise_on_error=False,
                )
                if res.is_error or res.structured_content is None:
                    text = " ".join(getattr(c, "text", "") for c in res.content)
                    return failed_result(req, f"run_rollout failed on the server: {text[:1000]}")
                data = res.structured_content
                del res
                if data.get("result_form") != "summary":
                    return RolloutResult.model_validate(data)
                return await self._whole(client, req, ResultSummary.model_validate(data))
            except _Refetch as e:
                errors.append(str(e))
            except Exception as e:  # transport failures: fastmcp raises httpx, anyio and MCP errors alike
                errors.append(f"{type(e).__name__}: {e}"[:500])
                if not self.servers.single:
                    self.servers.mark_down(server, f"MCP call failed: {type(e).__name__}: {e}")
                    break
            if time.monotonic() >= deadline:
                break
        return failed_result(
            req,
            f"could not get the result of rollout {req.rollout_id!r} from {server.url} after {len(errors)} tries "
            f"({'; '.join(errors[-3:])}); the rollout may still be running or stored there: "
            f"get_rollout({req.rollout_id!r})",
        )

    async def _reopen(self, server: Server) -> Client:
        """A new MCP session with the server (the old one's stream dropped, or the server restarted)."""
        if self._open is None:
            raise RuntimeError("use the client as `async with SweGymClient(...) as c:`")
        old = self._clients[server.tag]
        with contextlib.suppress(Exception):
            await old.close()
        client = Client(self._urls[server.tag], timeout=self.timeout_s, **self._client_kwargs)
        self._clients[server.tag] = client
        await self._open.enter_async_context(client)
        self._entered.add(server.tag)
        if server is self.servers.servers[0]:
            self._client = client
        return client

    async def _whole(self, client: Client, req: RolloutRequest, summary: ResultSummary) -> RolloutResult:
        """The whole result a summary links to, read page by page into one buffer and checked by its SHA-256."""
        if not summary.pages or not summary.result_uri or not summary.sha256:
            if summary.ok:
                raise _Refetch(f"the server linked no pages for a finished ok rollout ({summary.note})")
            return failed_result(
                req,
                summary.error or summary.note or "failed",
                summary.phase,
                rollout_id=summary.rollout_id or req.rollout_id,
                instance_id=summary.instance_id,
                stop_reason=summary.stop_reason,
                timings=summary.timings,
                wall_s=summary.wall_s,
            )
        buf = bytearray()
        uris = [summary.result_uri, *summary.page_uris[1:]]
        page = 0
        while page < summary.pages:
            uri = uris[page] if page < len(uris) else f"{summary.result_uri}/pages/{page}"
            read = await client.read_resource_mcp(uri)
            content = read.contents[0] if read.contents else None
            text = getattr(content, "text", None)
            meta = (getattr(content, "meta", None) or {}) if content is not None else {}
            if text is None or meta.get("sha256") != summary.sha256 or meta.get("start") != len(buf):
                raise _Refetch(f"page {page} of rollout {summary.rollout_id} does not continue the result")
            buf += text.encode()
            del read, content, text
            page += 1
        if len(buf) != summary.result_bytes or hashlib.sha256(buf).hexdigest() != summary.sha256:
            raise _Refetch(f"the pages of rollout {summary.rollout_id} do not make the result its summary names")
        try:
            return RolloutResult.model_validate_json(buf)
        finally:
            del buf

    async def get_rollout(self, rollout_id: str) -> RolloutStatus:
        """A rollout's status from the server that ran it (recorded, or named by its id; else each is asked)."""
        errors = []
        for server in self.servers.candidates(rollout_id):
            client = await self._session(server)
            res = await client.call_tool("get_rollout", {"rollout_id": rollout_id}, raise_on_error=False)
            if not res.is_error and res.structured_content is not None:
                status = RolloutStatus.model_validate(res.structured_content)
                if status.result is None and status.result_summary is not None:  # the whole result, in pages
                    summary, status.result_summary = status.result_summary, None
                    status.result = await self._whole(client, RolloutRequest(), summary)
                return status
            errors.append(f"{server.url}: " + " ".join(getattr(c, "text", "") for c in res.content)[:300])
        raise LookupError(f"rollout {rollout_id!r} not found: " + "; ".join(errors))
