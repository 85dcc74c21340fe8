"""The OpenAI chat-completions dialect: the agent speaks the engine's own API, with token capture forced on.

Request rewriting (served model, capture fields, max-tokens cap, sampling, compatibility rewrites), reply and chunk
validation (ids and logprobs aligned), and the agent's answers: JSON, SSE (streamed through or replayed) and errors.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from swe_gym_env.server.capture.dialect import (
    AgentRequest,
    CapturedCall,
    Dialect,
    DialectError,
    DialectRoute,
    DialectStream,
    EngineTerms,
    read_event,
    sse,
)
from swe_gym_env.server.capture.ids import check_ids, cut_prompt_ids, parse_id_list

CAPTURE_ONLY_KEYS = ("prompt_token_ids", "token_ids", "prompt_logprobs", "kv_transfer_params")


def _strip_schema(node: Any) -> int:
    """Remove JSON-schema `$schema` keys (some engines reject them) in place; returns how many."""
    n = 0
    if isinstance(node, dict):
        if "$schema" in node:
            del node["$schema"]
            n += 1
        for v in node.values():
            n += _strip_schema(v)
    elif isinstance(node, list):
        for v in node:
            n += _strip_schema(v)
    return n


def upstream_body(body: dict, terms: EngineTerms) -> tuple[dict, list[str]]:
    """The request as the engine gets it, and the rewrites made (reported as findings)."""
    up = copy.deepcopy(body)
    rewrites: list[str] = []
    up["model"] = terms.served_model
    if up.get("tools") == []:
        del up["tools"]
        up.pop("tool_choice", None)
        rewrites.append("removed an empty tools array (engines reject it)")
    if isinstance(up.get("tools"), list) and _strip_schema(up["tools"]):
        rewrites.append("removed $schema keys from tool parameters")
    if not terms.capture:
        return up, rewrites
    up["stream"] = terms.stream
    if terms.stream:
        up["stream_options"] = {"include_usage": True}
    else:
        up.pop("stream_options", None)
    up["return_token_ids"] = True
    up["logprobs"] = True
    up["top_logprobs"] = max(1, min(int(up.get("top_logprobs") or 1), 20))
    up["return_tokens_as_token_ids"] = True
    up.update(terms.sampling)
    for k in ("max_completion_tokens", "max_tokens"):
        if k in up:
            up[k] = min(int(up[k]), terms.max_tokens)
    if "max_completion_tokens" not in up and "max_tokens" not in up:
        up["max_tokens"] = terms.max_tokens
    return up, rewrites


def call_from_reply(data: Any) -> CapturedCall:
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise DialectError(502, "engine reply has no choices")
    choice = data["choices"][0]
    if not isinstance(choice, dict):
        raise DialectError(502, "engine reply choice is not an object")
    content = (choice.get("logprobs") or {}).get("content")
    prompt, completion, lps = check_ids(data.get("prompt_token_ids"), choice.get("token_ids"), content)
    msg = choice.get("message") or {}
    return CapturedCall(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=lps,
        message={"role": "assistant", "content": msg.get("content"), "tool_calls": msg.get("tool_calls") or []},
        finish_reason=choice.get("finish_reason"),
        usage=data.get("usage"),
    )


@dataclass
class StreamAccumulator:
    """Reassembles a streamed reply (vLLM: prompt ids in the first chunk, token ids and logprobs per chunk)."""

    prompt_token_ids: Any = None
    prompt_raw: bytes | None = None  # the first chunk's prompt ids as the engine wrote them, parsed by `settle`
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict | None = None
    chunks: int = 0

    def add(self, chunk: dict) -> None:
        self.chunks += 1
        if "prompt_token_ids" in chunk and chunk["prompt_token_ids"] is not None:
            self.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            ids = choice.get("token_ids")
            if ids:  # validated once, whole, in call()
                if not isinstance(ids, list):
                    raise DialectError(502, "engine streamed token_ids that are not a list")
                self.token_ids.extend(ids)
            lp = (choice.get("logprobs") or {}).get("content")
            if lp:
                self.logprobs.extend(lp)
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    int(tc.get("index", 0)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def settle(self) -> None:
        """Parse the prompt ids cut from the first chunk (`cut_prompt_ids`), once the agent has that chunk."""
        raw, self.prompt_raw = self.prompt_raw, None
        if raw is None or self.prompt_token_ids is not None:
            return
        ids = parse_id_list(raw)
        if ids is None:  # not plainly a list of ints: read it as JSON, and `check_ids` says what is wrong
            try:
                ids = orjson.loads(raw)
            except ValueError:
                raise DialectError(502, "engine streamed prompt_token_ids that are not JSON") from None
        self.prompt_token_ids = ids

    def call(self) -> CapturedCall:
        self.settle()
        prompt, completion, lps = check_ids(self.prompt_token_ids, self.token_ids, self.logprobs)
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return CapturedCall(
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=lps,
            message={"role": "assistant", "content": "".join(self.content) or None, "tool_calls": calls},
            finish_reason=self.finish_reason,
            usage=self.usage,
        )


def agent_chunk(chunk: dict, model: Any) -> dict:
    """A streamed chunk as the agent gets it: capture-only fields removed, its own model name back."""
    out = {k: v for k, v in chunk.items() if k not in CAPTURE_ONLY_KEYS}
    out["model"] = model or out.get("model")
    choices = []
    for c in out.get("choices") or []:
        if isinstance(c, dict):
            c = {k: v for k, v in c.items() if k not in CAPTURE_ONLY_KEYS and k != "logprobs"}
        choices.append(c)
    out["choices"] = choices
    return out


def reply_json(model: Any, msg: dict, finish: str | None, usage: dict | None) -> dict:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "capture",
        "usage": usage,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
    }


def sse_replay(model: Any, msg: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
    """A faithful stream of a complete reply: role, content, incremental tool_calls, finish, usage, [DONE]."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or "capture"}

    def event(choices: list, **extra) -> bytes:
        return sse({**base, "object": "chat.completion.chunk", "choices": choices, **extra})

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
        args = {"index": i, "function": {"arguments": fn.get("arguments") or ""}}
        yield event([{"index": 0, "delta": {"tool_calls": [args]}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": finish or "stop"}])
    if usage is not None:
        yield event([], usage=usage)
    yield sse("[DONE]")


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "capture_proxy_error", "code": status}}


class ChatStream(DialectStream):
    """A streamed chat completion: vLLM's chunks, forwarded with capture-only fields removed."""

    def __init__(self, model: Any, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.acc = StreamAccumulator()
        self._last: tuple[dict | None, bytes] = (None, b"")  # the chunk `read` made last, and its bytes

    def read(self, data: bytes) -> dict:
        """The first chunk's prompt ids are cut out unparsed (`settle` reads them once the agent has the chunk)."""
        if self.acc.prompt_token_ids is None and self.acc.prompt_raw is None and (cut := cut_prompt_ids(data)):
            rest, self.acc.prompt_raw = cut
            event = read_event(rest)
            self._last = (event, rest)
            return event
        event = read_event(data)
        self._last = (event, data)
        return event

    def _as_sent(self, chunk: dict) -> bytes | None:
        """The chunk's own bytes when the agent gets it unchanged: nothing to strip, the model name already its."""
        event, data = self._last
        if event is not chunk or any(k in chunk for k in CAPTURE_ONLY_KEYS):
            return None
        if self.model and chunk.get("model") != self.model:
            return None
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return None
        for c in choices:
            if isinstance(c, dict) and ("logprobs" in c or any(k in c for k in CAPTURE_ONLY_KEYS)):
                return None
        return data

    def check_first(self, chunk: dict | None) -> None:
        if chunk is None or (chunk.get("prompt_token_ids") is None and self.acc.prompt_raw is None):
            raise DialectError(502, "engine streamed no prompt_token_ids", "no_token_ids")

    def add(self, chunk: dict) -> None:
        self.acc.add(chunk)

    def forwarded(self) -> None:
        self.acc.settle()

    def holds(self, chunk: dict) -> bool:
        choices = chunk.get("choices") or []
        return any(isinstance(c, dict) and c.get("finish_reason") for c in choices) or not choices

    def agent_chunk(self, chunk: dict) -> bytes:
        if (data := self._as_sent(chunk)) is not None:
            return b"data: " + data + b"\n\n"
        return sse(agent_chunk(chunk, self.model))

    def end(self, held: list[dict]) -> Iterator[bytes]:
        for chunk in held:
            if not chunk.get("choices") and not self.include_usage:
                continue  # the usage event the proxy asked for on its own account
            yield sse(agent_chunk(chunk, self.model))
        yield sse("[DONE]")

    def call(self) -> CapturedCall:
        return self.acc.call()


class ChatDialect(Dialect):
    name = "openai-chat"
    routes = (DialectRoute("/v1/chat/completions", ("POST",)),)
    upstream_path = "/chat/completions"

    def parse_request(self, body: Any) -> AgentRequest:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise DialectError(400, "a chat completion request needs a messages list")
        return AgentRequest(
            body=body,
            stream=bool(body.get("stream")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            model=body.get("model"),
        )

    def upstream_body(self, request: AgentRequest, terms: EngineTerms) -> tuple[dict, list[str]]:
        return upstream_body(request.body, terms)

    def call_from_reply(self, data: Any) -> CapturedCall:
        return call_from_reply(data)

    def open_stream(self, request: AgentRequest) -> ChatStream:
        return ChatStream(request.model, request.include_usage)

    def reply(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> dict:
        return reply_json(request.model, message, finish, usage)

    def replay(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        return sse_replay(request.model, message, finish, usage)

    def error_body(self, status: int, message: str) -> dict:
        return error_body(status, message)
