"""Calls to the engine and what reaches the agent while they run, whatever the dialect.

A captured call asks the engine for a stream whatever the agent asked for. A streamed call is pumped by its own task
(`pump`) onto a queue, under two clocks: the whole call's timeout and a stall timeout that restarts with every
read, so an engine that hangs ends its call at the stall timeout, not at the call's (a whole reply still being
generated and a hung engine look the same). A call the agent wants whole is `collect`ed: the same stream, read to
its end by the same `DialectStream` (the same ids, logprobs, message, finish reason and usage as when it streams),
then answered whole. `post` (one upstream POST in a task its session can cancel) serves what never streams:
sessions that do not stream through (`CaptureSession.stream_through`), black-box calls.
The pump splits the engine's bytes into SSE payloads and queues them unparsed, all that arrived together at once;
`stream_through` has the dialect read them (`DialectStream.read`), forwards what arrived together in one write as it
arrives, does the work kept off the agent's path once that write is out (`DialectStream.forwarded`: vLLM's prompt
ids), and holds the end of the reply until the call is stored; `passthrough` relays the engine's answer unchanged
(black-box sessions, nothing captured).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response, StreamingResponse

from swe_gym_env.server.capture.dialect import (
    AgentRequest,
    CapturedCall,
    Dialect,
    DialectError,
    DialectStream,
    EngineTerms,
    sse,
)
from swe_gym_env.server.capture.session import CaptureSession, EngineTarget
from swe_gym_env.server.capture.upstream import Upstream, UpstreamError


def engine_headers(engine: EngineTarget) -> dict[str, str]:
    headers = {"content-type": "application/json", **dict(engine.headers)}
    if engine.api_key:
        headers["authorization"] = f"Bearer {engine.api_key}"
    return headers


def check_reply(status: int, data: bytes) -> Any:
    """The engine's JSON reply; `DialectError` for an HTTP error or a body that is not JSON."""
    if status != 200:
        text = data[:500].decode("utf-8", "replace")
        raise DialectError(status if status < 500 else 502, f"engine answered HTTP {status}: {text}")
    try:
        return orjson.loads(data)
    except ValueError as e:
        raise DialectError(502, "engine reply is not JSON") from e


def agent_error(dialect: Dialect, status: int, message: str) -> JSONResponse:
    return JSONResponse(dialect.error_body(status, message), status)


def fail(session: CaptureSession, dialect: Dialect, status: int, message: str, code: str | None = None) -> Response:
    session.fail(message, code)
    return agent_error(dialect, status, message)


def _track(session: CaptureSession, task: asyncio.Task) -> None:
    session.pumps.add(task)
    task.add_done_callback(session.pumps.discard)


async def post(upstream: Upstream, session: CaptureSession, path: str, body: dict) -> tuple[int, bytes]:
    """A non-streamed upstream call, in a task the session can cancel when it closes (a hung engine must not
    outlive the rollout, nor hold a socket)."""
    call = asyncio.create_task(
        upstream.post(f"{session.engine.base_url}{path}", body, engine_headers(session.engine), session.call_timeout_s)
    )
    _track(session, call)
    try:
        return await call
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # we are being cancelled ourselves: let it through
            raise
        raise UpstreamError("the capture session closed during this call") from None


def _sse_data(lines: list[bytes]) -> tuple[list[bytes], bool]:
    """The ``data:`` payloads among complete SSE lines, and whether ``[DONE]`` ended them."""
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return out, True
            out.append(data)
    return out, False


async def pump(upstream: Upstream, session: CaptureSession, path: str, body: dict, queue: asyncio.Queue) -> None:
    """Owns the upstream stream (its own task, so its timeout and cleanup never touch the caller's task) and puts
    its ``data:`` payloads on ``queue`` unparsed, as many at a time as have arrived (``("data", [bytes, …])``), then
    ``("done", None)`` or ``("error", DialectError)``. Two clocks: the whole call's timeout, and a stall timeout that
    restarts whenever the engine sends anything."""
    loop = asyncio.get_running_loop()
    stall = session.stall_timeout_s
    idle = asyncio.timeout(stall)
    try:
        async with asyncio.timeout(session.call_timeout_s), idle:
            async with upstream.stream(
                f"{session.engine.base_url}{path}",
                body,
                engine_headers(session.engine),
                session.call_timeout_s,
            ) as reply:
                if reply.status != 200:
                    check_reply(reply.status, await reply.body())
                if not reply.content_type.startswith("text/event-stream"):
                    kind = reply.content_type or "no content type"
                    raise DialectError(502, f"engine answered a streamed request with {kind}, not a stream")
                buf = b""
                async for piece in reply.chunks():
                    idle.reschedule(loop.time() + stall)
                    buf += piece
                    if b"\n" not in piece:
                        continue
                    *lines, buf = buf.split(b"\n")
                    batch, done = _sse_data(lines)
                    if batch:
                        queue.put_nowait(("data", batch))
                    if done:
                        queue.put_nowait(("done", None))
                        return
                batch, done = _sse_data([buf])  # a last line without its newline
                if batch:
                    queue.put_nowait(("data", batch))
                if done:
                    queue.put_nowait(("done", None))
                    return
                raise DialectError(502, "engine stream ended without [DONE]")
    except DialectError as e:
        queue.put_nowait(("error", e))
    except UpstreamError as e:
        queue.put_nowait(("error", DialectError(504 if e.timeout else 502, str(e))))
    except TimeoutError:
        if idle.expired():
            msg = f"engine stream stalled: nothing for {stall:g}s (stall timeout)"
        else:
            msg = f"engine timed out after {session.call_timeout_s:.0f}s"
        queue.put_nowait(("error", DialectError(504, msg)))
    except asyncio.CancelledError:
        queue.put_nowait(("error", DialectError(409, "the capture session closed during this call")))
        raise


def start_pump(
    upstream: Upstream, session: CaptureSession, path: str, body: dict
) -> tuple[asyncio.Task, asyncio.Queue]:
    queue: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(pump(upstream, session, path, body, queue))
    _track(session, task)
    return task, queue


async def next_batch(queue: asyncio.Queue) -> list[bytes] | None:
    """The pump's next payloads (`pump`); None once the stream is done; its error raised (`DialectError`)."""
    kind, got = await queue.get()
    if kind == "error":
        raise got
    return got if kind == "data" else None


async def start_stream(
    upstream: Upstream, session: CaptureSession, dialect: Dialect, request: AgentRequest, up: dict
) -> tuple[asyncio.Task, asyncio.Queue, DialectStream, dict, list[bytes]]:
    """The engine's stream started (`pump`) and its first chunk read and checked (`DialectStream.check_first`): the
    pump, its queue, the call's stream, that chunk, and the payloads that arrived with it. `DialectError` (the pump
    cancelled) when the engine's reply cannot start a captured stream."""
    task, queue = start_pump(upstream, session, dialect.upstream_path, up)
    stream = dialect.open_stream(request)
    try:
        batch = await next_batch(queue)
        first = stream.read(batch[0]) if batch else None
        stream.check_first(first)
    except BaseException:
        task.cancel()
        raise
    assert first is not None and batch is not None
    return task, queue, stream, first, batch[1:]


async def stream_through(
    upstream: Upstream,
    session: CaptureSession,
    dialect: Dialect,
    request: AgentRequest,
    up: dict,
    record: Callable[[CapturedCall], None],
) -> Response:
    """Forward the engine's stream as it arrives (what has arrived together goes to the agent in one write); the end
    of the reply waits until ``record`` has stored the call."""
    try:
        task, queue, stream, first, rest = await start_stream(upstream, session, dialect, request, up)
    except DialectError as err:
        return fail(session, dialect, err.status, err.message, err.code)

    async def body() -> AsyncIterator[bytes]:
        try:
            stream.add(first)
            out = [stream.agent_chunk(first)]
            items = rest
            held: list[dict] = []
            while True:
                for data in items:
                    item = stream.read(data)
                    stream.add(item)
                    if held or stream.holds(item):
                        held.append(item)  # the end of the reply waits until the call is stored
                    else:
                        out.append(stream.agent_chunk(item))
                if chunk := b"".join(out):
                    yield chunk
                    out.clear()
                stream.forwarded()
                got = await next_batch(queue)
                if got is None:
                    break
                items = got
            record(stream.call())
            yield b"".join(stream.end(held))
        except DialectError as e:
            session.fail(e.message, e.code)
            yield dialect.sse_error(e.status, e.message)
        finally:
            task.cancel()

    return StreamingResponse(body(), media_type="text/event-stream")


async def collect(
    upstream: Upstream, session: CaptureSession, dialect: Dialect, request: AgentRequest, up: dict
) -> CapturedCall:
    """A call the agent wants whole (``up`` asks the engine for a stream): the engine's stream read to its end by the
    dialect's `DialectStream`, exactly as `stream_through` reads it, nothing forwarded; the whole call, validated.
    `DialectError` when the engine fails, stalls or sends anything off."""
    task, queue, stream, first, rest = await start_stream(upstream, session, dialect, request, up)
    try:
        stream.add(first)
        items: list[bytes] | None = rest
        while items is not None:
            for data in items:
                stream.add(stream.read(data))
            items = await next_batch(queue)
        call = stream.call()
    finally:
        task.cancel()
    if call.usage is None:  # a whole reply always has one: the counts of the ids themselves
        n, m = len(call.prompt_token_ids), len(call.completion_token_ids)
        call.usage = {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}
    return call


async def passthrough(upstream: Upstream, session: CaptureSession, dialect: Dialect, request: AgentRequest) -> Response:
    """Black-box: the request with only the served model and compatibility rewrites; the answer as the engine gave
    it. Nothing is captured."""
    terms = EngineTerms(session.engine.served_model, session.max_tokens, {}, request.stream, capture=False)
    up, rewrites = dialect.upstream_body(request, terms)
    session.rewrites.update(rewrites)
    if not request.stream:
        try:
            status, data = await post(upstream, session, dialect.upstream_path, up)
        except UpstreamError as e:
            return fail(session, dialect, 504 if e.timeout else 502, str(e))
        if status == 200:
            session.consecutive_failures = 0
        else:
            session.fail(f"engine answered HTTP {status}")
        session.publish({"type": "call", "session": session.id, "call": session.calls, "status": status})
        return Response(data, status, media_type="application/json")
    task, queue = start_pump(upstream, session, dialect.upstream_path, up)
    kind, first = await queue.get()
    if kind == "error":
        return fail(session, dialect, first.status, first.message)

    async def relay() -> AsyncIterator[bytes]:
        item, k = first, kind
        try:
            while k != "done":
                if k == "error":
                    session.fail(item.message)
                    yield dialect.sse_error(item.status, item.message)
                    return
                yield b"".join(b"data: " + data + b"\n\n" for data in item)
                k, item = await queue.get()
            yield sse("[DONE]")
            session.consecutive_failures = 0
            session.publish({"type": "call", "session": session.id, "call": session.calls, "status": 200})
        finally:
            task.cancel()

    return StreamingResponse(relay(), media_type="text/event-stream")
