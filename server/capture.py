"""The capture proxy, mounted at /capture. It knows nothing of sandboxes, agents or tasks.

Each rollout gets a session: a public id (URLs, UI, results) and a separate secret key the agent uses as its API key.
Every call is forwarded to the session's engine with token capture forced on, validated (ids and logprobs aligned;
anything off is an error to the agent, never a silent success), linked into the rollout graph, written to the
durable store, and only then answered. When the agent streams, the engine's stream is forwarded chunk by chunk as it
arrives (time to first token is the engine's) and the final chunk and `[DONE]` are held until the call is stored.

Agent-facing: ``POST /capture/v1/chat/completions`` (the only route a sandbox can reach). Admin (server app only,
admin key when configured): ``/capture/sessions`` list / mint, ``/capture/sessions/{id}`` detail, ``…/export``,
``…/events`` (SSE push of calls as they land), ``DELETE`` to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from swe_gym_env.server import capture_chat as chat
from swe_gym_env.server.capture_graph import RolloutGraph, Segment
from swe_gym_env.server.capture_store import CaptureStore
from swe_gym_env.server.capture_upstream import Upstream, UpstreamError, make_upstream
from swe_gym_env.server.security import admin_ok, bearer
from swe_gym_env.wire import CaptureSessionCreate, Finding, Turn

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_FAILURE_FINDINGS = 20  # per session; the rest are counted in one finding
SESSION_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True)
class EngineTarget:
    base_url: str  # ends with /v1
    served_model: str
    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # extra headers, held server-side
    revision: str | None = None  # model revision, when the operator knows it
    chat_template_sha256: str | None = None

    def public(self) -> dict:
        return {
            "base_url": self.base_url,
            "served_model": self.served_model,
            "revision": self.revision,
            "chat_template_sha256": self.chat_template_sha256,
        }


@dataclass
class CaptureSession:
    id: str
    engine: EngineTarget
    max_calls: int
    max_tokens: int
    call_timeout_s: float
    sampling: dict[str, float | int] = field(default_factory=dict)  # forced on every upstream call
    stall_timeout_s: float = 60.0  # a stream that sends nothing for this long ends its call with an error
    max_consecutive_failures: int = 5  # failed calls in a row that stop the session (stop_reason engine_failures)
    passthrough: bool = False  # black-box: forward unchanged, capture nothing (eval only)
    stream_through: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rewrites: Counter = field(default_factory=Counter)
    calls: int = 0  # calls the agent made (budget replies excluded)
    failed: int = 0  # of which failed at the engine or the proxy (they do not count against the budget)
    consecutive_failures: int = 0  # failed calls since the last one that succeeded
    failures: list[tuple[int, str]] = field(default_factory=list)  # (call number, error), for the findings
    demoted: set[int] = field(default_factory=set)  # turns the agent's own record shows it never used
    sequences: list[Segment] = field(default_factory=list)  # set when the session closes
    stop_reason: str | None = None
    budget_replies: int = 0  # final "budget exhausted" replies: seen by the agent, not turns
    closed: bool = False
    created_at: float = field(default_factory=time.time)
    last_call_at: float | None = None
    on_turn: Callable[[Turn], None] | None = None
    graph: RolloutGraph = field(default_factory=RolloutGraph)
    subscribers: list[asyncio.Queue] = field(default_factory=list)
    pumps: set[asyncio.Task] = field(default_factory=set)  # upstream calls in flight: cancelled when it closes

    def publish(self, event: dict) -> None:
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(event)

    def summary(self) -> dict:
        return {
            "id": self.id,
            "state": "closed" if self.closed else "open",
            "mode": "passthrough" if self.passthrough else "capture",
            "engine": self.engine.public(),
            "labels": self.labels,
            "calls": self.calls,
            "failed_calls": self.failed,
            "turns": len(self.turns),
            "roots": len(self.graph.roots()),
            "budget_replies": self.budget_replies,
            "stop_reason": self.stop_reason,
            "created_at": self.created_at,
            "seconds_since_last_call": round(time.time() - self.last_call_at, 3) if self.last_call_at else None,
            "errors": self.errors[-5:],
        }


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def _agent_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(chat.error_body(status, message), status)


class CaptureProxy:
    def __init__(self, store: CaptureStore | None = None, upstream: Upstream | None = None) -> None:
        self._by_key: dict[str, CaptureSession] = {}
        self.sessions: dict[str, CaptureSession] = {}  # open and recently closed, by public id
        self.store = store
        self._upstream = upstream

    # -- sessions ---------------------------------------------------------------------------------------------
    def open_session(
        self,
        engine: EngineTarget,
        *,
        max_calls: int,
        max_tokens: int,
        call_timeout_s: float = 300.0,
        sampling: dict[str, float | int] | None = None,
        passthrough: bool = False,
        session_id: str | None = None,
        labels: dict[str, str] | None = None,
        stall_timeout_s: float = 60.0,
        max_consecutive_failures: int = 5,
    ) -> tuple[CaptureSession, str]:
        """A new session and its secret key (returned once; only its hash is kept)."""
        sid = session_id or uuid.uuid4().hex[:16]
        if not (1 <= len(sid) <= 64 and set(sid) <= SESSION_ID_CHARS):
            raise ValueError(f"invalid session id {sid!r}")
        if sid in self.sessions and not self.sessions[sid].closed:
            raise ValueError(f"session {sid!r} is already open")
        key = "sgk-" + secrets.token_urlsafe(32)
        session = CaptureSession(
            id=sid,
            engine=engine,
            max_calls=max_calls,
            max_tokens=max_tokens,
            call_timeout_s=call_timeout_s,
            sampling=dict(sampling or {}),
            passthrough=passthrough,
            labels=dict(labels or {}),
            stall_timeout_s=stall_timeout_s,
            max_consecutive_failures=max_consecutive_failures,
        )
        self._by_key[_hash(key)] = session
        self.sessions[sid] = session
        self._trim()
        if self.store is not None:
            self.store.open_session(sid, self._meta(session))
        return session, key

    @staticmethod
    def _meta(session: CaptureSession) -> dict:
        return {
            "engine": session.engine.public(),
            "sampling": session.sampling,
            "max_calls": session.max_calls,
            "max_tokens": session.max_tokens,
            "call_timeout_s": session.call_timeout_s,
            "stall_timeout_s": session.stall_timeout_s,
            "max_consecutive_failures": session.max_consecutive_failures,
            "mode": "passthrough" if session.passthrough else "capture",
            "labels": session.labels,
        }

    def close_session(self, session: CaptureSession) -> None:
        """Idempotent. Marks discarded branches and roles, adds the closing findings, persists the state."""
        if session.closed:
            return
        session.closed = True
        for pump in list(session.pumps):  # a hung engine call must not outlive its session (nor hold a socket)
            pump.cancel()
        for h, s in list(self._by_key.items()):
            if s is session:
                del self._by_key[h]
        self._finalize(session)
        if self.store is not None:
            self.store.close_session(
                session.id,
                stop_reason=session.stop_reason,
                findings=[f.model_dump() for f in session.findings],
                errors=session.errors,
                budget_replies=session.budget_replies,
                demoted=sorted(session.demoted),
            )
        session.publish({"type": "closed", "session": session.id, "turns": len(session.turns)})

    @staticmethod
    def _finalize(session: CaptureSession) -> None:
        for what, n in session.rewrites.items():
            session.findings.append(Finding(severity="info", code="rewrite", message=f"{what} ({n} calls)"))
        for call, message in session.failures[:MAX_FAILURE_FINDINGS]:
            session.findings.append(
                Finding(severity="warning", code="engine_failure", message=f"model call {call} failed: {message}")
            )
        if len(session.failures) > MAX_FAILURE_FINDINGS:
            more = len(session.failures) - MAX_FAILURE_FINDINGS
            session.findings.append(
                Finding(severity="warning", code="engine_failure", message=f"{more} more failed model calls")
            )
        if session.passthrough:
            return
        if not session.turns:
            session.findings.append(
                Finding(severity="fatal", code="no_model_calls", message="no model call was captured")
            )
            return
        session.sequences = CaptureProxy.apply_graph(session.graph, session.turns, session.demoted)
        roots = session.graph.roots()
        if len(roots) > 1:
            aux = sum(1 for r in roots if session.graph.nodes[r].role == "aux")
            session.findings.append(
                Finding(
                    severity="info",
                    code="roots",
                    message=f"{len(roots)} conversations (roots); {aux} outside the agent's own",
                )
            )

    @staticmethod
    def apply_graph(g: RolloutGraph, turns: list, demoted: set[int] | list[int]) -> list[Segment]:
        """Discards, roles and training sequences from the graph, written onto the turns (models or dicts)."""
        g.finalize(demoted)
        for turn, node in zip(turns, g.nodes, strict=True):
            fields = {"discarded": node.discarded, "role": node.role}
            if isinstance(turn, dict):
                turn.update(fields)
            else:
                turn.discarded, turn.role = node.discarded, node.role
        return g.segments()

    def open_sessions(self) -> int:
        return len(self._by_key)

    def _trim(self, keep_closed: int = 512) -> None:
        closed = [sid for sid, s in self.sessions.items() if s.closed]
        for sid in closed[: max(0, len(closed) - keep_closed)]:
            del self.sessions[sid]

    async def aclose(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()
            self._upstream = None

    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            self._upstream = make_upstream()
        return self._upstream

    def _session_for(self, request: Request) -> CaptureSession | None:
        key = bearer(request.headers.get("authorization")) or request.headers.get("x-api-key", "")
        if not key:
            return None
        s = self._by_key.get(_hash(key))
        return None if s is None or s.closed else s

    @staticmethod
    def _headers(engine: EngineTarget) -> dict[str, str]:
        headers = {"content-type": "application/json", **dict(engine.headers)}
        if engine.api_key:
            headers["authorization"] = f"Bearer {engine.api_key}"
        return headers

    # -- the agent-facing route -------------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        session = self._session_for(request)
        if session is None:
            return _agent_error(401, "unknown or closed capture key")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _agent_error(413, f"request body over {MAX_BODY_BYTES} bytes")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _agent_error(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            body = orjson.loads(raw)
        except ValueError:
            return _agent_error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _agent_error(400, "a chat completion request needs a messages list")
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = body.get("model")
        if session.stop_reason == "engine_failures":  # the session gave up on its engine: fail at once
            return _agent_error(
                503, f"capture session stopped after {session.consecutive_failures} failed calls in a row"
            )
        if session.calls - session.failed >= session.max_calls:  # failed calls never use up the budget
            session.stop_reason = "budget_exhausted"
            session.budget_replies += 1
            msg = {"role": "assistant", "content": "Model-call budget exhausted; stopping.", "tool_calls": []}
            if stream:
                return StreamingResponse(chat.sse_replay(model, msg, "stop", None), media_type="text/event-stream")
            return _json(chat.reply_json(model, msg, "stop", None))
        session.calls += 1
        session.last_call_at = time.time()
        if session.passthrough:
            return await self._passthrough(session, body, stream)
        through = stream and session.stream_through
        up, rewrites = chat.upstream_body(
            body,
            served_model=session.engine.served_model,
            max_tokens=session.max_tokens,
            sampling=session.sampling,
            stream=through,
        )
        session.rewrites.update(rewrites)
        t0 = time.monotonic()
        if through:
            return await self._stream_through(session, up, model, include_usage, t0)
        try:
            status, data = await self._post(session, up)
            reply = self._parse_reply(status, data)
            call = chat.call_from_reply(reply)
            self._record(session, up, call, streamed=stream, wall=time.monotonic() - t0)
        except UpstreamError as e:
            return self._fail(session, 504 if e.timeout else 502, str(e))
        except chat.DialectError as e:
            return self._fail(session, e.status, e.message, e.code)
        if stream:
            return StreamingResponse(
                chat.sse_replay(model, call.message, call.finish_reason, call.usage if include_usage else None),
                media_type="text/event-stream",
            )
        return _json(chat.reply_json(model, call.message, call.finish_reason, call.usage))

    @staticmethod
    def _parse_reply(status: int, data: bytes) -> Any:
        if status != 200:
            text = data[:500].decode("utf-8", "replace")
            raise chat.DialectError(status if status < 500 else 502, f"engine answered HTTP {status}: {text}")
        try:
            return orjson.loads(data)
        except ValueError as e:
            raise chat.DialectError(502, "engine reply is not JSON") from e

    def _fail(self, session: CaptureSession, status: int, message: str, code: str | None = None) -> JSONResponse:
        self._error(session, message, code)
        return _agent_error(status, message)

    @staticmethod
    def _error(session: CaptureSession, message: str, code: str | None = None) -> None:
        """A call that failed at the engine or here: it does not count against the budget; enough of them in a row
        stop the session; an engine that stops returning token ids makes the capture unusable."""
        session.errors.append(f"call {session.calls}: {message}")
        session.failed += 1
        session.consecutive_failures += 1
        session.failures.append((session.calls, message))
        if (
            code == "no_token_ids"
            and not session.passthrough
            and not any(f.code == "engine_stopped_ids" for f in session.findings)
        ):
            session.findings.append(
                Finding(
                    severity="fatal",
                    code="engine_stopped_ids",
                    message=f"the engine stopped returning token ids (call {session.calls}: {message})",
                )
            )
        if session.consecutive_failures >= session.max_consecutive_failures and session.stop_reason is None:
            session.stop_reason = "engine_failures"
        session.publish({"type": "error", "session": session.id, "call": session.calls, "message": message})

    def _record(self, session: CaptureSession, up: dict, call: chat.CapturedCall, streamed: bool, wall: float) -> None:
        """Validate, link, persist, publish — before the agent sees the end of the reply."""
        usage = call.usage or {}
        reported = usage.get("completion_tokens")
        if isinstance(reported, int) and reported != len(call.completion_token_ids):
            raise chat.DialectError(
                502,
                f"engine reports {reported} completion tokens but returned {len(call.completion_token_ids)} ids",
            )
        if session.closed:
            raise chat.DialectError(409, "the capture session closed during this call")
        g = session.graph
        node, keys, findings = g.link(call.prompt_token_ids, call.completion_token_ids, call.logprobs)
        index = len(session.turns)
        if self.store is not None:
            try:
                self.store.add_call(
                    session.id,
                    node,
                    finish_reason=call.finish_reason,
                    streamed=streamed,
                    wall_s=round(wall, 4),
                    request=up,
                    response=call.message,
                )
            except Exception as e:  # never answer a call we could not keep
                raise chat.DialectError(500, f"could not persist the call: {type(e).__name__}: {e}") from e
        g.commit(node, keys)
        turn = Turn(
            index=index,
            prompt_token_ids=call.prompt_token_ids,
            completion_token_ids=call.completion_token_ids,
            logprobs=call.logprobs,
            finish_reason=call.finish_reason,
            streamed=streamed,
            wall_s=round(wall, 4),
            request=up,
            response_message=call.message,
            parent=node.parent,
            relation=node.relation,
            retry_of=node.retry_of,
        )
        session.turns.append(turn)
        session.consecutive_failures = 0
        session.findings.extend(findings)
        session.last_call_at = time.time()
        session.publish(
            {
                "type": "turn",
                "session": session.id,
                "index": index,
                "parent": node.parent,
                "relation": node.relation,
                "retry_of": node.retry_of,
                "prompt_tokens": len(call.prompt_token_ids),
                "completion_tokens": len(call.completion_token_ids),
                "finish_reason": call.finish_reason,
                "tool_calls": [c["name"] for c in chat.decoded_tool_calls(call.message)],
                "at": session.last_call_at,
            }
        )
        if session.on_turn is not None:
            session.on_turn(turn)

    async def _post(self, session: CaptureSession, body: dict) -> tuple[int, bytes]:
        """A non-streamed upstream call, in a task the session can cancel when it closes (a hung engine must not
        outlive the rollout, nor hold a socket)."""
        call = asyncio.create_task(
            self.upstream.post(
                f"{session.engine.base_url}/chat/completions",
                body,
                self._headers(session.engine),
                session.call_timeout_s,
            )
        )
        session.pumps.add(call)
        call.add_done_callback(session.pumps.discard)
        try:
            return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # we are being cancelled ourselves: let it through
                raise
            raise UpstreamError("the capture session closed during this call") from None

    # -- streaming --------------------------------------------------------------------------------------------
    async def _pump(self, session: CaptureSession, body: dict, queue: asyncio.Queue, raw: bool) -> None:
        """Owns the upstream stream (its own task, so its timeout and cleanup never touch the caller's task).
        Two clocks: the whole call's timeout, and a stall timeout that restarts with every line the engine sends."""
        loop = asyncio.get_running_loop()
        stall = session.stall_timeout_s
        idle = asyncio.timeout(stall)
        try:
            async with asyncio.timeout(session.call_timeout_s), idle:
                async with self.upstream.stream(
                    f"{session.engine.base_url}/chat/completions",
                    body,
                    self._headers(session.engine),
                    session.call_timeout_s,
                ) as reply:
                    if reply.status != 200:
                        self._parse_reply(reply.status, await reply.body())
                    if not reply.content_type.startswith("text/event-stream"):
                        kind = reply.content_type or "no content type"
                        raise chat.DialectError(502, f"engine answered a streamed request with {kind}, not a stream")
                    async for line in reply.lines():
                        idle.reschedule(loop.time() + stall)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            await queue.put(("done", None))
                            return
                        if raw:
                            await queue.put(("raw", data))
                            continue
                        try:
                            event = orjson.loads(data)
                        except ValueError:
                            raise chat.DialectError(502, "engine streamed a chunk that is not JSON") from None
                        if not isinstance(event, dict):
                            raise chat.DialectError(502, "engine streamed a chunk that is not an object")
                        if "error" in event:
                            raise chat.DialectError(502, f"engine error mid-stream: {str(event['error'])[:300]}")
                        await queue.put(("event", event))
                    raise chat.DialectError(502, "engine stream ended without [DONE]")
        except chat.DialectError as e:
            await queue.put(("error", e))
        except UpstreamError as e:
            await queue.put(("error", chat.DialectError(504 if e.timeout else 502, str(e))))
        except TimeoutError:
            if idle.expired():
                msg = f"engine stream stalled: nothing for {stall:g}s (stall timeout)"
            else:
                msg = f"engine timed out after {session.call_timeout_s:.0f}s"
            await queue.put(("error", chat.DialectError(504, msg)))
        except asyncio.CancelledError:
            queue.put_nowait(("error", chat.DialectError(409, "the capture session closed during this call")))
            raise

    async def _stream_through(
        self, session: CaptureSession, up: dict, model: Any, include_usage: bool, t0: float
    ) -> Response:
        queue: asyncio.Queue = asyncio.Queue()
        pump = asyncio.create_task(self._pump(session, up, queue, raw=False))
        session.pumps.add(pump)
        pump.add_done_callback(session.pumps.discard)
        kind, first = await queue.get()
        if kind != "event" or first.get("prompt_token_ids") is None:
            pump.cancel()
            err = (
                first
                if kind == "error"
                else chat.DialectError(502, "engine streamed no prompt_token_ids", "no_token_ids")
            )
            return self._fail(session, err.status, err.message, err.code)
        acc = chat.StreamAccumulator()

        async def body() -> AsyncIterator[bytes]:
            try:
                acc.add(first)
                yield chat.sse(chat.agent_chunk(first, model))
                held: list[dict] = []
                while True:
                    kind, item = await queue.get()
                    if kind == "done":
                        break
                    if kind == "error":
                        raise item
                    acc.add(item)
                    choices = item.get("choices") or []
                    if held or any(isinstance(c, dict) and c.get("finish_reason") for c in choices) or not choices:
                        held.append(item)  # the end of the reply waits until the call is stored
                        continue
                    yield chat.sse(chat.agent_chunk(item, model))
                self._record(session, up, acc.call(), streamed=True, wall=time.monotonic() - t0)
                for item in held:
                    if not item.get("choices") and not include_usage:
                        continue
                    yield chat.sse(chat.agent_chunk(item, model))
                yield chat.sse("[DONE]")
            except chat.DialectError as e:
                self._error(session, e.message, e.code)
                yield chat.sse(chat.error_body(e.status, e.message))
            finally:
                pump.cancel()

        return StreamingResponse(body(), media_type="text/event-stream")

    async def _passthrough(self, session: CaptureSession, body: dict, stream: bool) -> Response:
        up, rewrites = chat.upstream_body(
            body,
            served_model=session.engine.served_model,
            max_tokens=session.max_tokens,
            sampling={},
            stream=stream,
            capture=False,
        )
        session.rewrites.update(rewrites)
        if not stream:
            try:
                status, data = await self._post(session, up)
            except UpstreamError as e:
                return self._fail(session, 504 if e.timeout else 502, str(e))
            if status == 200:
                session.consecutive_failures = 0
            else:
                self._error(session, f"engine answered HTTP {status}")
            session.publish({"type": "call", "session": session.id, "call": session.calls, "status": status})
            return Response(data, status, media_type="application/json")
        queue: asyncio.Queue = asyncio.Queue()
        pump = asyncio.create_task(self._pump(session, up, queue, raw=True))
        session.pumps.add(pump)
        pump.add_done_callback(session.pumps.discard)
        kind, first = await queue.get()
        if kind == "error":
            return self._fail(session, first.status, first.message)

        async def relay() -> AsyncIterator[bytes]:
            item, k = first, kind
            try:
                while k != "done":
                    if k == "error":
                        self._error(session, item.message)
                        yield chat.sse(chat.error_body(item.status, item.message))
                        return
                    yield b"data: " + item + b"\n\n"
                    k, item = await queue.get()
                yield chat.sse("[DONE]")
                session.consecutive_failures = 0
                session.publish({"type": "call", "session": session.id, "call": session.calls, "status": 200})
            finally:
                pump.cancel()

        return StreamingResponse(relay(), media_type="text/event-stream")

    # -- admin ------------------------------------------------------------------------------------------------
    def get_session(self, session_id: str) -> CaptureSession | None:
        return self.sessions.get(session_id)

    def session_detail(self, session_id: str) -> dict | None:
        s = self.sessions.get(session_id)
        if s is not None:
            return {
                **s.summary(),
                "findings": [f.model_dump() for f in s.findings],
                "calls": [
                    {
                        "index": t.index,
                        "parent": t.parent,
                        "relation": t.relation,
                        "role": t.role,
                        "discarded": t.discarded,
                        "prompt_tokens": len(t.prompt_token_ids),
                        "completion_tokens": len(t.completion_token_ids),
                        "finish_reason": t.finish_reason,
                        "wall_s": t.wall_s,
                    }
                    for t in s.turns
                ],
            }
        doc = self.export(session_id)
        if doc is None:
            return None
        return {k: v for k, v in doc.items() if k not in ("turns", "sequences")} | {
            "calls": [{k: t[k] for k in ("index", "parent", "relation", "finish_reason")} for t in doc["turns"]]
        }

    def export(self, session_id: str) -> dict | None:
        """The session as a document: every turn with its own ids and logprobs, provenance, sequences + masks.
        A closed session's document is the same before and after a server restart."""
        s = self.sessions.get(session_id)
        if s is None:
            return self._export_stored(session_id)
        if not s.closed and s.turns:  # provisional discards and roles (final when it closes)
            self.apply_graph(s.graph, s.turns, s.demoted)
        turns = [t.model_dump() for t in s.turns]
        state = "closed" if s.closed else "open"
        findings = [f.model_dump() for f in s.findings]
        return self._document(session_id, state, self._meta(s), turns, s.graph, findings, s.stop_reason)

    def _export_stored(self, session_id: str) -> dict | None:
        if self.store is None:
            return None
        data = self.store.load_session(session_id)
        if data is None:
            return None
        g = RolloutGraph()
        linked = []  # what linking found; a closed session's stored findings hold it already
        turns = []
        for c in data["calls"]:
            linked += [f.model_dump() for f in g.add(c["prompt_token_ids"], c["completion_token_ids"], c["logprobs"])]
            n = g.nodes[-1]
            turn = {k: v for k, v in c.items() if k != "at"}
            turns.append(Turn(**turn, parent=n.parent, relation=n.relation, retry_of=n.retry_of).model_dump())
        if g.nodes:
            self.apply_graph(g, turns, data["demoted"])
        findings = list(data["findings"]) + (linked if data["state"] != "closed" else [])
        return self._document(session_id, data["state"], data["meta"], turns, g, findings, data["stop_reason"])

    @staticmethod
    def _document(
        sid: str, state: str, meta: dict, turns: list[dict], g: RolloutGraph, findings: list, stop_reason: str | None
    ) -> dict:
        for t in turns:
            t["tool_calls"] = chat.decoded_tool_calls(t.get("response_message") or {})
        return {
            "session_id": sid,
            "state": state,
            "stop_reason": stop_reason,
            "provenance": {
                "engine": meta.get("engine"),
                "sampling": meta.get("sampling"),
                "seed": (meta.get("sampling") or {}).get("seed"),
                "max_tokens": meta.get("max_tokens"),
                "mode": meta.get("mode"),
            },
            "roots": g.roots(),
            "turns": turns,
            "sequences": g.sequences() if g.nodes else [],
            "findings": findings,
        }

    def _admin(self, request: Request) -> JSONResponse | None:
        presented = bearer(request.headers.get("authorization")) or request.headers.get("x-admin-key")
        if not admin_ok(presented):
            return JSONResponse({"error": "admin key required"}, 401)
        return None

    async def list_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        live = [s.summary() for s in self.sessions.values()]
        known = {s["id"] for s in live}
        stored = [sid for sid in self.store.session_ids(200) if sid not in known] if self.store is not None else []
        return JSONResponse({"sessions": live, "stored": stored})

    async def create_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        raw = await request.body()
        if len(raw) > 64 * 1024:
            return JSONResponse({"error": "request body too large"}, 413)
        try:
            spec = CaptureSessionCreate.model_validate_json(raw)
        except ValueError as e:
            return JSONResponse({"error": f"invalid session spec: {e}"}, 422)
        engine = EngineTarget(
            spec.engine_url.rstrip("/"),
            spec.served_model,
            spec.engine_api_key,
            tuple(spec.engine_headers.items()),
        )
        session, key = self.open_session(
            engine,
            max_calls=spec.max_calls,
            max_tokens=spec.max_tokens,
            call_timeout_s=spec.call_timeout_s,
            sampling=spec.sampling,
            passthrough=spec.passthrough,
            labels=spec.labels,
        )
        return JSONResponse({"id": session.id, "key": key, "base_url": "/capture/v1"}, 201)

    async def detail_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        detail = self.session_detail(request.path_params["sid"])
        return JSONResponse(detail) if detail is not None else JSONResponse({"error": "no such session"}, 404)

    async def export_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        doc = self.export(request.path_params["sid"])
        return JSONResponse(doc) if doc is not None else JSONResponse({"error": "no such session"}, 404)

    async def close_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        s = self.sessions.get(request.path_params["sid"])
        if s is None:
            return JSONResponse({"error": "no such open session"}, 404)
        self.close_session(s)
        return JSONResponse(s.summary())

    async def events_route(self, request: Request) -> Response:
        if (denied := self._admin(request)) is not None:
            return denied
        s = self.sessions.get(request.path_params["sid"])
        if s is None:
            return JSONResponse({"error": "no such live session"}, 404)
        queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)
        s.subscribers.append(queue)

        async def events() -> AsyncIterator[dict]:
            try:
                yield {"event": "session", "data": json.dumps(s.summary())}
                if s.closed:
                    return
                while True:
                    event = await queue.get()
                    yield {"event": event["type"], "data": json.dumps(event)}
                    if event["type"] == "closed":
                        return
            finally:
                s.subscribers.remove(queue)

        return EventSourceResponse(events(), ping=15)

    def app(self, admin: bool = False) -> Starlette:
        """The agent-facing route; with ``admin`` also the session API (never served to sandboxes)."""
        routes = [Route("/v1/chat/completions", self.chat_completions, methods=["POST"])]
        if admin:
            routes += [
                Route("/sessions", self.list_route, methods=["GET"]),
                Route("/sessions", self.create_route, methods=["POST"]),
                Route("/sessions/{sid}", self.detail_route, methods=["GET"]),
                Route("/sessions/{sid}", self.close_route, methods=["DELETE"]),
                Route("/sessions/{sid}/export", self.export_route, methods=["GET"]),
                Route("/sessions/{sid}/events", self.events_route, methods=["GET"]),
            ]
        return Starlette(routes=routes)
