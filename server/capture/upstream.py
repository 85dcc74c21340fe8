"""The capture proxy's HTTP client to engines: one small interface, two implementations.

aiohttp is the default: measured with `swe-gym-env bench capture` (direct vs through /capture, 256 concurrent
sessions), it kept up where httpx's connection pool spent its CPU scanning (NOTES §1 saw the same). httpx stays
available (`SWE_GYM_UPSTREAM=httpx`) so the bench can compare them in one run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import orjson

from swe_gym_env.core.settings import setting

STALE_RETRIES = 3  # a request on a kept-alive connection the engine had closed is sent again, this many times at most


class UpstreamError(Exception):
    """The engine could not be reached or did not answer in time."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class StreamReply(Protocol):
    status: int
    content_type: str

    async def body(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (as many as are there at each step: lines are the reader's business)."""
        ...


class Upstream(Protocol):
    async def post(self, url: str, body: dict, headers: dict[str, str], timeout: float) -> tuple[int, bytes]: ...

    def stream(
        self, url: str, body: dict, headers: dict[str, str], timeout: float
    ) -> AbstractAsyncContextManager[StreamReply]: ...

    async def aclose(self) -> None: ...


class _Reply:
    """An engine's streamed reply (`StreamReply`) from either client: its status, content type and readers."""

    def __init__(
        self,
        status: int,
        content_type: str,
        read: Callable[[], Awaitable[bytes]],
        chunks: Callable[[], AsyncIterator[bytes]],
    ) -> None:
        self.status = status
        self.content_type = content_type
        self._read = read
        self._chunks = chunks

    async def body(self) -> bytes:
        return await self._read()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for data in self._chunks():
            yield data


class AiohttpUpstream:
    def __init__(self, max_connections: int = 1024) -> None:
        self._session = None
        self._limit = max_connections

    def _client(self):
        import aiohttp

        if self._session is None or self._session.closed:
            # idle connections are dropped before an engine's server drops them (uvicorn, so vLLM: 5 s)
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit, keepalive_timeout=4)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=json.dumps)
        return self._session

    async def _open(self, url: str, body: dict, headers: dict[str, str], timeout):
        """The engine's response to a POST. A kept-alive connection the engine closed while it sat in the pool fails
        before any reply, all the more often under load (the close is read late): such a failure is retried, on
        another connection, a few times (a pool can hold several such connections)."""
        import aiohttp

        data = orjson.dumps(body)
        for _ in range(STALE_RETRIES):
            try:
                return await self._client().post(url, data=data, headers=headers, timeout=timeout)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                continue
        return await self._client().post(url, data=data, headers=headers, timeout=timeout)

    async def post(self, url: str, body: dict, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with await self._open(url, body, headers, aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status, await r.read()
        except TimeoutError as e:
            raise UpstreamError(f"engine timed out after {timeout:.0f}s", timeout=True) from e
        except aiohttp.ClientError as e:
            raise UpstreamError(f"engine unreachable: {type(e).__name__}: {e}") from e

    @asynccontextmanager
    async def stream(self, url: str, body: dict, headers: dict[str, str], timeout: float):
        import aiohttp

        try:
            async with await self._open(
                url, body, headers, aiohttp.ClientTimeout(total=timeout, sock_read=timeout)
            ) as r:
                yield _Reply(r.status, r.headers.get("content-type", ""), r.read, r.content.iter_any)
        except TimeoutError as e:
            raise UpstreamError(f"engine timed out after {timeout:.0f}s", timeout=True) from e
        except aiohttp.ClientError as e:
            raise UpstreamError(f"engine unreachable: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxUpstream:
    def __init__(self, max_connections: int = 1024, client=None) -> None:
        import httpx

        self._client = client or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        )

    async def post(self, url: str, body: dict, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        import httpx

        try:
            r = await self._client.post(url, content=orjson.dumps(body), headers=headers, timeout=timeout)
        except httpx.TimeoutException as e:
            raise UpstreamError(f"engine timed out after {timeout:.0f}s", timeout=True) from e
        except httpx.HTTPError as e:
            raise UpstreamError(f"engine unreachable: {type(e).__name__}: {e}") from e
        return r.status_code, r.content

    @asynccontextmanager
    async def stream(self, url: str, body: dict, headers: dict[str, str], timeout: float):
        import httpx

        try:
            async with asyncio.timeout(timeout):
                async with self._client.stream(
                    "POST", url, content=orjson.dumps(body), headers=headers, timeout=timeout
                ) as r:
                    yield _Reply(r.status_code, r.headers.get("content-type", ""), r.aread, r.aiter_bytes)
        except (httpx.TimeoutException, TimeoutError) as e:
            raise UpstreamError(f"engine timed out after {timeout:.0f}s", timeout=True) from e
        except httpx.HTTPError as e:
            raise UpstreamError(f"engine unreachable: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        await self._client.aclose()


UPSTREAMS = {"aiohttp": AiohttpUpstream, "httpx": HttpxUpstream}


def make_upstream(name: str | None = None) -> Upstream:
    name = name or setting("upstream")  # SWE_GYM_UPSTREAM
    if name not in UPSTREAMS:
        raise ValueError(f"unknown upstream client {name!r}; known: {sorted(UPSTREAMS)}")
    return UPSTREAMS[name]()
