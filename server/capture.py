"""The capture proxy, mounted at /capture. It knows nothing of sandboxes, agents or tasks.

Each rollout gets a session with a secret key; the agent uses the key as its API key. Every call is forwarded to
the session's engine with token capture forced on (`return_token_ids`, `logprobs`, `return_tokens_as_token_ids`),
checked (a reply without aligned ids and logprobs is an error, never a silent success), recorded as a turn, and
answered to the agent as an ordinary chat completion — an SSE replay when the agent asked to stream.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from swe_gym_env.wire import Turn

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class EngineTarget:
    base_url: str  # ends with /v1
    served_model: str
    api_key: str | None = field(default=None, repr=False)


@dataclass
class CaptureSession:
    id: str
    engine: EngineTarget
    max_calls: int
    max_tokens: int
    call_timeout_s: float
    sampling: dict[str, float | int] = field(default_factory=dict)  # forced on every upstream call
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    calls: int = 0
    stop_reason: str | None = None
    budget_replies: int = 0  # final "budget exhausted" replies: seen by the agent, not turns
    closed: bool = False
    last_call_at: float | None = None
    on_turn: Callable[[Turn], None] | None = None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class CaptureError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _agent_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "capture_proxy_error", "code": status}}, status)


class CaptureProxy:
    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._by_key: dict[str, CaptureSession] = {}
        self._client = client

    # -- sessions ---------------------------------------------------------------------------------------------
    def open_session(
        self,
        engine: EngineTarget,
        *,
        max_calls: int,
        max_tokens: int,
        call_timeout_s: float = 300.0,
        sampling: dict[str, float | int] | None = None,
    ) -> tuple[CaptureSession, str]:
        key = "sgk-" + secrets.token_urlsafe(32)
        session = CaptureSession(
            id=uuid.uuid4().hex[:12],
            engine=engine,
            max_calls=max_calls,
            max_tokens=max_tokens,
            call_timeout_s=call_timeout_s,
            sampling=dict(sampling or {}),
        )
        self._by_key[_hash(key)] = session
        return session, key

    def close_session(self, session: CaptureSession) -> None:
        session.closed = True
        for h, s in list(self._by_key.items()):
            if s is session:
                del self._by_key[h]

    def open_sessions(self) -> int:
        return len(self._by_key)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
        return self._client

    def _session_for(self, request: Request) -> CaptureSession | None:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not key:
            return None
        s = self._by_key.get(_hash(key))
        return None if s is None or s.closed else s

    # -- the route --------------------------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        session = self._session_for(request)
        if session is None:
            return _agent_error(401, "unknown or closed capture key")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _agent_error(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            return _agent_error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _agent_error(400, "a chat completion request needs a messages list")
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if session.calls >= session.max_calls:
            session.stop_reason = "budget_exhausted"
            session.budget_replies += 1
            msg = {"role": "assistant", "content": "Model-call budget exhausted; stopping.", "tool_calls": []}
            return self._reply(body.get("model"), msg, "stop", None, stream, include_usage)
        session.calls += 1
        upstream = self._upstream_body(session, body)
        t0 = time.monotonic()
        try:
            data = await self._call_engine(session, upstream)
            turn = self._turn_from(session, upstream, data, stream, time.monotonic() - t0)
        except CaptureError as e:
            session.errors.append(f"call {session.calls}: {e.message}")
            return _agent_error(e.status, e.message)
        session.turns.append(turn)
        session.last_call_at = time.time()
        if session.on_turn is not None:
            session.on_turn(turn)
        choice = data["choices"][0]
        return self._reply(
            body.get("model"),
            turn.response_message,
            choice.get("finish_reason"),
            data.get("usage"),
            stream,
            include_usage,
        )

    def _upstream_body(self, session: CaptureSession, body: dict) -> dict:
        up = copy.deepcopy(body)
        up["model"] = session.engine.served_model
        up["stream"] = False
        up.pop("stream_options", None)
        up["return_token_ids"] = True
        up["logprobs"] = True
        up["top_logprobs"] = max(1, min(int(up.get("top_logprobs") or 1), 20))
        up["return_tokens_as_token_ids"] = True
        up.update(session.sampling)
        if up.get("tools") == []:
            del up["tools"]
            up.pop("tool_choice", None)
            session.findings.append("removed an empty tools array (engines reject it)")
        for k in ("max_completion_tokens", "max_tokens"):
            if k in up:
                up[k] = min(int(up[k]), session.max_tokens)
        if "max_completion_tokens" not in up and "max_tokens" not in up:
            up["max_tokens"] = session.max_tokens
        return up

    async def _call_engine(self, session: CaptureSession, up: dict) -> dict:
        headers = {"content-type": "application/json"}
        if session.engine.api_key:
            headers["authorization"] = f"Bearer {session.engine.api_key}"
        try:
            r = await self.client.post(
                f"{session.engine.base_url}/chat/completions", json=up, headers=headers, timeout=session.call_timeout_s
            )
        except httpx.TimeoutException as e:
            raise CaptureError(504, f"engine timed out after {session.call_timeout_s:.0f}s") from e
        except httpx.HTTPError as e:
            raise CaptureError(502, f"engine unreachable: {type(e).__name__}") from e
        if r.status_code != 200:
            raise CaptureError(
                r.status_code if r.status_code < 500 else 502, f"engine answered HTTP {r.status_code}: {r.text[:500]}"
            )
        try:
            data = r.json()
        except ValueError as e:
            raise CaptureError(502, "engine reply is not JSON") from e
        return data

    def _turn_from(self, session: CaptureSession, up: dict, data: Any, stream: bool, wall: float) -> Turn:
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            raise CaptureError(502, "engine reply has no choices")
        choice = data["choices"][0]
        prompt_ids = data.get("prompt_token_ids")
        ids = choice.get("token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if not _int_list(prompt_ids) or not prompt_ids:
            raise CaptureError(502, "engine returned no prompt_token_ids (is it vLLM >= 0.10.2?)")
        if not _int_list(ids) or not ids:
            raise CaptureError(502, "engine returned no completion token_ids")
        if not isinstance(content, list) or len(content) != len(ids):
            raise CaptureError(502, f"engine returned {len(content or [])} logprobs for {len(ids)} tokens")
        lps = []
        for i, (tid, entry) in enumerate(zip(ids, content, strict=True)):
            if not isinstance(entry, dict) or entry.get("token") != f"token_id:{tid}":
                raise CaptureError(
                    502, f"logprob entry {i} does not name token {tid} (need --return-tokens-as-token-ids)"
                )
            lp = entry.get("logprob")
            if not isinstance(lp, int | float) or lp > 0:
                raise CaptureError(502, f"logprob entry {i} is not a log-probability: {lp!r}")
            lps.append(float(lp))
        msg = choice.get("message") or {}
        out_msg = {"role": "assistant", "content": msg.get("content"), "tool_calls": msg.get("tool_calls") or []}
        return Turn(
            index=len(session.turns),
            prompt_token_ids=prompt_ids,
            completion_token_ids=ids,
            logprobs=lps,
            finish_reason=choice.get("finish_reason"),
            streamed=stream,
            wall_s=round(wall, 4),
            request=up,
            response_message=out_msg,
        )

    def _reply(
        self, model: Any, msg: dict, finish: str | None, usage: dict | None, stream: bool, include_usage: bool
    ) -> Response:
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or "capture"}
        if not stream:
            return JSONResponse(
                {
                    **base,
                    "object": "chat.completion",
                    "usage": usage,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                }
            )
        return StreamingResponse(
            _sse_replay(base, msg, finish, usage if include_usage else None), media_type="text/event-stream"
        )

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat_completions, methods=["POST"])])


def _int_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)


def _sse_replay(base: dict, msg: dict, finish: str | None, usage: dict | None):
    def event(choices: list, **extra) -> str:
        return "data: " + json.dumps({**base, "object": "chat.completion.chunk", "choices": choices, **extra}) + "\n\n"

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    if msg.get("content"):
        yield event([{"index": 0, "delta": {"content": msg["content"]}, "finish_reason": None}])
    for i, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function") or {}
        head = {
            "index": i,
            "id": call.get("id") or f"call_{i}",
            "type": "function",
            "function": {"name": fn.get("name"), "arguments": ""},
        }
        yield event([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}])
        yield event(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": i, "function": {"arguments": fn.get("arguments") or ""}}]},
                    "finish_reason": None,
                }
            ]
        )
    yield event([{"index": 0, "delta": {}, "finish_reason": finish or "stop"}])
    if usage is not None:
        yield event([], usage=usage)
    yield "data: [DONE]\n\n"
