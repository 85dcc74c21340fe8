"""Typed websocket client for a swe_gym_env server: OpenEnv's `/ws` protocol plus a `request_id` per message.

- Every request carries a fresh `request_id` and its reply is matched by it, so a call that timed out can never
  hand its late reply to the next call, and one client is safe to share between many concurrent tasks.
- Per-call timeouts with a long default for rollouts; `run_rollout` gives every rollout an id first, so a caller
  whose wait timed out (or whose connection dropped) can fetch the result later with `get_rollout`.
- `max_size` bounds incoming frames (rollout results can be large; default 512 MiB).
- `SweGymWSClient` is async; `SyncSweGymWSClient` runs one in a private event-loop thread, and its `close()`
  really closes the socket and stops the thread.

Imports nothing from the server: only `swe_gym_env.wire`, `websockets` and `httpx`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import httpx
import websockets

from swe_gym_env.client.servers import NoServerAvailable, Server, ServerSet
from swe_gym_env.wire import RolloutRequest, RolloutResult, RolloutStatus, TaskPage, TaskView, failed_result

T = TypeVar("T")
ENV_NAME = "swe_gym_env"


class ServerError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class _Socket:
    """One websocket to one server; replies matched to requests by `request_id`."""

    def __init__(self, base_url: str, timeout_s: float, max_size: int) -> None:
        self.base_url = base_url
        self.ws_url = "ws" + base_url.removeprefix("http") + "/ws"
        self.timeout_s = timeout_s
        self.max_size = max_size
        self._ws: Any = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._connecting = asyncio.Lock()

    async def connect(self) -> None:
        async with self._connecting:  # concurrent first calls share one socket
            if self._ws is None:
                ws = await websockets.connect(self.ws_url, max_size=self.max_size, open_timeout=self.timeout_s)
                self._ws = ws
                self._reader = asyncio.create_task(self._read(ws))

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.send(json.dumps({"type": "close"}))
            await ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        self._fail_pending(ConnectionError("client closed"))

    def _fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()

    async def _read(self, ws: Any) -> None:
        try:
            async for raw in ws:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                rid = msg.get("request_id") if isinstance(msg, dict) else None
                fut = self._pending.get(rid) if isinstance(rid, str) else None
                if fut is not None and not fut.done():  # replies to abandoned requests are dropped
                    fut.set_result(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            if self._ws is ws:  # the next request opens a new connection (the server may be back)
                self._ws = None
            self._fail_pending(ConnectionError(f"connection to the server {self.base_url} closed"))

    async def request(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        if self._ws is None:
            await self.connect()
        ws = self._ws
        if ws is None:
            raise ConnectionError(f"not connected to the server {self.base_url}")
        rid = uuid.uuid4().hex
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            try:
                await ws.send(json.dumps({**message, "request_id": rid}))
            except websockets.ConnectionClosed as e:
                raise ConnectionError(f"connection to the server {self.base_url} closed: {e}") from None
            reply = await asyncio.wait_for(fut, timeout_s or self.timeout_s)
        finally:
            self._pending.pop(rid, None)
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise ServerError(str(data.get("code")), str(data.get("message")))
        return reply

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> Any:
        reply = await self.request(
            {"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments or {}}}, timeout_s
        )
        obs = (reply.get("data") or {}).get("observation") or {}
        if obs.get("error"):
            raise ServerError(obs["error"].get("error_type", "tool_error"), obs["error"].get("message", ""))
        result = obs.get("result") or {}
        return result.get("structured_content") or result.get("data")


UNREACHABLE = (ConnectionError, OSError, websockets.WebSocketException)  # OSError: refused, reset, DNS


class SweGymWSClient:
    """`SweGymWSClient(url)` or `SweGymWSClient([url1, url2, ...])`: with several servers, each rollout goes to the
    one with most free capacity and its id names that server (`swe_gym_env.client.servers`)."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        timeout_s: float = 60.0,
        rollout_timeout_s: float = 4 * 3600.0,
        max_size: int = 512 * 1024 * 1024,
        health_ttl_s: float = 2.0,
    ) -> None:
        self.servers = ServerSet([base_url] if isinstance(base_url, str) else list(base_url), health_ttl_s, timeout_s)
        self.base_urls = [s.url for s in self.servers.servers]
        self.base_url = self.base_urls[0]
        self.timeout_s = timeout_s
        self.rollout_timeout_s = rollout_timeout_s
        self._sockets = {s.tag: _Socket(s.url, timeout_s, max_size) for s in self.servers.servers}
        self.ws_url = self._sockets[self.servers.servers[0].tag].ws_url

    async def __aenter__(self) -> SweGymWSClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _socket(self, server: Server) -> _Socket:
        return self._sockets[server.tag]

    async def connect(self) -> None:
        """One server: connect (raises when it cannot). Several: read their health and connect to those up;
        `NoServerAvailable` when none is."""
        if self.servers.single:
            await self._socket(self.servers.servers[0]).connect()
            return
        await self.servers.refresh(force=True)
        for server in self.servers.servers:
            if server.down is None:
                with contextlib.suppress(*UNREACHABLE, TimeoutError):
                    await self._socket(server).connect()
        await self.servers.any_server()  # raises NoServerAvailable, naming why each is down

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._sockets.values()))
        await self.servers.aclose()

    async def request(self, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """A raw OpenEnv message to a server (with several: the first healthy one)."""
        return await self._socket(await self.servers.any_server()).request(message, timeout_s)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> Any:
        """A tool call on a server (with several: the first healthy one)."""
        return await self._socket(await self.servers.any_server()).call_tool(name, arguments, timeout_s)

    async def list_tools(self) -> list[str]:
        reply = await self.request({"type": "step", "data": {"type": "list_tools"}})
        return [t["name"] for t in ((reply.get("data") or {}).get("observation") or {}).get("tools", [])]

    async def run_rollout(
        self, request: RolloutRequest | None = None, *, timeout_s: float | None = None, **fields: Any
    ) -> RolloutResult:
        """Run a rollout on the server with most room (an id that names a server goes back to it); never raises
        for a rollout: an unreachable server, a dropped connection or a timeout is a failed result that names the
        rollout id to fetch later."""
        req = request or RolloutRequest(**fields)
        wait = timeout_s or self.rollout_timeout_s
        home = self.servers.home(req.rollout_id)
        where = ""
        try:
            for _ in self.base_urls:  # a server unreachable before the rollout was sent to it: try the next
                async with self.servers.slot(wait, home) as server:
                    where, sock = f" on {server.url}", self._socket(server)
                    try:
                        await sock.connect()
                    except (*UNREACHABLE, TimeoutError) as e:
                        if home is not None or self.servers.single:
                            raise
                        self.servers.mark_down(server, f"cannot connect: {type(e).__name__}: {e}")
                        continue
                    if req.rollout_id is None:  # an id first, so the result can be fetched whatever happens next
                        req = req.model_copy(update={"rollout_id": self.servers.new_rollout_id(server)})
                    self.servers.record(str(req.rollout_id), server)
                    try:
                        data = await sock.call_tool("run_rollout", req.model_dump(exclude_none=True), wait)
                    except UNREACHABLE as e:
                        if not self.servers.single:
                            self.servers.mark_down(server, f"connection lost: {e}")
                        raise
                    return RolloutResult.model_validate(data)
        except NoServerAvailable as e:
            return failed_result(req, str(e))
        except (TimeoutError, ServerError, *UNREACHABLE) as e:
            if req.rollout_id is None:  # it never reached a server
                return failed_result(req, f"{type(e).__name__}: {e}")
            return failed_result(
                req,
                f"{type(e).__name__}: {e}; the rollout may still be running{where}: get_rollout({req.rollout_id!r})",
            )
        return failed_result(req, "no server could be reached: " + "; ".join(self._down_reasons()))

    def _down_reasons(self) -> list[str]:
        return [f"{s.url}: {s.down}" for s in self.servers.servers if s.down]

    async def get_rollout(self, rollout_id: str) -> RolloutStatus:
        """A rollout's status from the server that ran it (recorded, or named by the id; else every server is asked
        in turn). Raises `ServerError` when no server knows it, `ConnectionError` when its server is unreachable."""
        candidates = self.servers.candidates(rollout_id)
        errors: list[str] = []
        unreachable = False
        for server in candidates:
            try:
                data = await self._socket(server).call_tool("get_rollout", {"rollout_id": rollout_id})
                return RolloutStatus.model_validate(data)
            except ServerError as e:
                if len(candidates) == 1:
                    raise
                errors.append(f"{server.url}: {e}")
            except (*UNREACHABLE, TimeoutError) as e:
                unreachable = True
                errors.append(f"{server.url}: unreachable: {type(e).__name__}: {e}")
        what = f"rollout {rollout_id!r} not found: " + "; ".join(errors)
        if unreachable:
            raise ConnectionError(what)
        raise ServerError("not_found", what)

    async def list_tasks(self, split: str = "bundled", offset: int = 0, limit: int = 50) -> TaskPage:
        return TaskPage.model_validate(
            await self.call_tool("list_tasks", {"split": split, "offset": offset, "limit": limit})
        )

    # Task API (plain HTTP, OpenEnv's routes) ------------------------------------------------------------------
    async def splits(self) -> list[dict]:
        url = (await self.servers.any_server()).url
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            r = await http.get(f"{url}/{ENV_NAME}/splits")
            r.raise_for_status()
            return r.json()

    async def task(self, split: str, index: int) -> TaskView:
        url = (await self.servers.any_server()).url
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            r = await http.post(f"{url}/{ENV_NAME}/task", json={"split": split, "index": index})
            r.raise_for_status()
            return TaskView.model_validate(r.json()["task"])


class SyncSweGymWSClient:
    """The async client driven from synchronous code (a private event loop in a daemon thread)."""

    def __init__(self, base_url: str | Sequence[str], **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swe-gym-ws-client", daemon=True)
        self._thread.start()
        self._client = SweGymWSClient(base_url, **kwargs)
        self._run(self._client.connect())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncSweGymWSClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run_rollout(self, request: RolloutRequest | None = None, **fields: Any) -> RolloutResult:
        return self._run(self._client.run_rollout(request, **fields))

    def get_rollout(self, rollout_id: str) -> RolloutStatus:
        return self._run(self._client.get_rollout(rollout_id))

    def list_tasks(self, split: str = "bundled", offset: int = 0, limit: int = 50) -> TaskPage:
        return self._run(self._client.list_tasks(split, offset, limit))

    def list_tools(self) -> list[str]:
        return self._run(self._client.list_tools())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
