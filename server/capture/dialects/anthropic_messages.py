"""The Anthropic Messages dialect (`POST /v1/messages`, `POST /v1/messages/count_tokens`), translated to and from
the engine's chat completions (see `translated`).

Request: ``system`` (a string or text blocks) becomes the system message; a user message's text blocks one user
message, each ``tool_result`` block a ``tool`` message (in block order); an assistant message's text its content,
its ``thinking`` blocks its ``reasoning``, its ``tool_use`` blocks its tool calls (``input`` serialised as JSON).
``tools`` become function tools (``input_schema`` as parameters), ``tool_choice`` auto/any/tool/none the chat
equivalents, ``stop_sequences`` ``stop``, ``max_tokens``/``temperature``/``top_p``/``top_k`` as they are. Lost, and
so reported: ``cache_control``, ``redacted_thinking`` and server-tool blocks, server tools, a tool result's
``is_error`` flag, assistant text after a tool call (moved before the calls), and any other parameter (``thinking``,
``metadata``, ``service_tier``, …). Images and documents are refused (400).

Reply: content blocks thinking (with a fixed signature, so the agent sends them back as thinking) → text →
tool_use; ``stop_reason`` end_turn / max_tokens / tool_use / stop_sequence (the engine's matched stop string) /
refusal (content_filter); usage input/output tokens. Streamed as message_start, content_block_start/delta/stop per
block, message_delta, message_stop (``event:`` lines, as the SDKs read them); errors as ``{"type": "error",
"error": {"type", "message"}}`` (``event: error`` in a stream).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from swe_gym_env.server.capture.dialect import AgentRequest, AuxAnswer, AuxCall, DialectError, DialectRoute
from swe_gym_env.server.capture.dialects import translated
from swe_gym_env.server.capture.dialects.translated import IMAGES_REFUSED, DialectEvents, TranslatedDialect, Translation

SIGNATURE = "swe-gym-capture"  # thinking blocks need a signature, or clients send them back as plain text
HANDLED = {
    "model", "messages", "system", "max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences",
    "tools", "tool_choice",
}  # fmt: skip
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "api_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _text_blocks(content: Any, where: str, t: Translation) -> str:
    """The text of a string or a list of text blocks (images refused, anything else dropped and reported)."""

    def text(kind: str | None, block: Any) -> str | None:
        if kind != "text":
            return None
        _cache(block, t)
        return str(block.get("text", ""))

    return translated.content_text(
        content,
        where,
        t,
        text,
        refused=("image", "document"),
        noun="block",
        dropped=f"block in {where.split('[')[0]} dropped",
    )


def _cache(block: dict, t: Translation) -> None:
    if "cache_control" in block:
        t.lose("cache_control ignored (the engine does its own prefix caching)")


def _user(content: Any, i: int, t: Translation) -> list[dict]:
    """A user message: text blocks → user messages, tool_result blocks → tool messages, in block order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise DialectError(400, f"messages[{i}].content must be a string or a list of content blocks")
    out: list[dict] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts.clear()

    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            _cache(block, t)
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            flush()
            _cache(block, t)
            if block.get("is_error"):
                t.lose("tool_result is_error flag dropped (chat tool messages have none)")
            text = _text_blocks(block.get("content") or "", f"messages[{i}].content[{j}].content", t)
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind in ("image", "document"):
            raise DialectError(400, f"{IMAGES_REFUSED}: an {kind} block in messages[{i}].content[{j}]")
        else:
            t.lose(f"{kind} block in user messages dropped")
    flush()
    return out


def _assistant(content: Any, i: int, t: Translation) -> dict:
    if isinstance(content, str):
        return translated.assistant_message(content, [], None)
    if not isinstance(content, list):
        raise DialectError(400, f"messages[{i}].content must be a string or a list of content blocks")
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            _cache(block, t)
            if calls:
                t.lose("assistant text after a tool call moved before the tool calls")
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            _cache(block, t)
            calls.append(
                translated.tool_call(str(block.get("id")), block.get("name"), translated.dumps_args(block.get("input")))
            )
        elif kind == "redacted_thinking":
            t.lose("redacted_thinking block dropped (opaque to the engine)")
        else:
            t.lose(f"{kind} block in assistant messages dropped")
    return translated.assistant_message("".join(texts) or None, calls, "\n".join(thinking) or None)


def _tools(tools: Any, t: Translation) -> list[dict]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind not in (None, "custom"):
            t.lose(f"server tool {kind} dropped")
            continue
        fn: dict[str, Any] = {"name": tool.get("name"), "description": tool.get("description")}
        fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            fn["strict"] = tool["strict"]
        for k in sorted(set(tool) - {"name", "description", "input_schema", "type", "strict"}):
            if k == "cache_control":
                _cache(tool, t)
            else:
                t.lose(f"tool field {k} ignored")
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, body: dict, t: Translation) -> None:
    if not isinstance(choice, dict):
        return
    kind = choice.get("type")
    if kind in ("auto", "none"):
        body["tool_choice"] = kind
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        t.lose(f"tool_choice {kind} ignored")
    if choice.get("disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False


def translate_messages(body: dict, t: Translation) -> dict:
    """An Anthropic Messages request as a chat-completions body (deterministic)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise DialectError(400, "messages: a list of messages is required")
    chat: list[dict] = []
    system = body.get("system")
    if system:
        chat.append({"role": "system", "content": _text_blocks(system, "system", t)})
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DialectError(400, f"messages[{i}] must be an object")
        role = m.get("role")
        if role == "user":
            chat += _user(m.get("content"), i, t)
        elif role == "assistant":
            chat.append(_assistant(m.get("content"), i, t))
        elif role == "system":  # claude-code sends one inside messages
            chat.append({"role": "system", "content": _text_blocks(m.get("content"), f"messages[{i}]", t)})
        else:
            raise DialectError(400, f"messages[{i}].role must be user or assistant, not {role!r}")
    out: dict[str, Any] = {"messages": chat}
    if "tools" in body:
        out["tools"] = _tools(body["tools"], t)
    _tool_choice(body.get("tool_choice"), out, t)
    if isinstance(body.get("max_tokens"), int):
        out["max_tokens"] = body["max_tokens"]
    for k in ("temperature", "top_p", "top_k"):
        if body.get(k) is not None:
            out[k] = body[k]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    for k in sorted(set(body) - HANDLED):
        if body[k] is not None:
            t.lose(f"parameter {k} ignored")
    return out


class MessagesEvents(DialectEvents):
    """message_start, one content block at a time (start, deltas, stop), message_delta, message_stop."""

    def __init__(self, dialect: AnthropicDialect, request: AgentRequest) -> None:
        super().__init__(dialect, request)
        self.messages = dialect
        self.id = translated.new_id("msg_")
        self.index = -1
        self.open: str | None = None  # the kind of the open block

    def _close(self) -> Iterator[bytes]:
        if self.open == "thinking":
            delta = {"type": "signature_delta", "signature": SIGNATURE}
            yield event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})
        if self.open is not None:
            yield event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.open = None

    def _open(self, kind: str, block: dict) -> Iterator[bytes]:
        yield from self._close()
        self.index += 1
        self.open = kind
        yield event("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def start(self, prompt_tokens: int) -> Iterator[bytes]:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(prompt_tokens, 0),
        }
        yield event("message_start", {"type": "message_start", "message": message})

    def reasoning(self, text: str) -> Iterator[bytes]:
        if self.open != "thinking":
            yield from self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        yield self._delta({"type": "thinking_delta", "thinking": text})

    def text(self, text: str) -> Iterator[bytes]:
        if self.open != "text":
            yield from self._open("text", {"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": text})

    def tool_start(self, index: int, cid: str, name: str) -> Iterator[bytes]:
        yield from self._open("tool_use", {"type": "tool_use", "id": cid, "name": name, "input": {}})

    def tool_args(self, index: int, text: str) -> Iterator[bytes]:
        if self.open == "tool_use":
            yield self._delta({"type": "input_json_delta", "partial_json": text})

    def finish(self, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        yield from self._close()
        reason, sequence = self.messages.stop_reason(self.request, finish)
        p, c = translated.usage_counts(usage)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        yield event("message_delta", {**delta, "usage": _usage(p, c)})
        yield event("message_stop", {"type": "message_stop"})


def _usage(prompt: int, completion: int) -> dict:
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class AnthropicDialect(TranslatedDialect):
    name = "anthropic-messages"
    routes = (
        DialectRoute("/v1/messages", ("POST",)),
        DialectRoute("/v1/messages/count_tokens", ("POST",), aux="count_tokens"),
    )

    def translate(self, body: dict, route: DialectRoute, params: Mapping[str, str]) -> Translation:
        t = Translation(body={}, stream=bool(body.get("stream")), model=body.get("model"))
        t.body = translate_messages(body, t)
        if body.get("stop_sequences"):
            t.state["stop_sequences"] = list(body["stop_sequences"])
        return t

    def stop_reason(self, request: AgentRequest, finish: str | None) -> tuple[str, str | None]:
        stop = request.state.get("engine_stop")
        if finish == "stop" and isinstance(stop, str) and stop in request.state.get("stop_sequences", []):
            return "stop_sequence", stop
        if finish is not None and finish not in STOP_REASONS:
            self.note(request, f"finish reason {finish} answered as end_turn")
        return STOP_REASONS.get(finish or "stop", "end_turn"), None

    def events(self, request: AgentRequest) -> MessagesEvents:
        return MessagesEvents(self, request)

    def reply(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> dict:
        blocks: list[dict] = []
        if message.get("reasoning"):
            blocks.append({"type": "thinking", "thinking": message["reasoning"], "signature": SIGNATURE})
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            args, ok = translated.loads_args(fn.get("arguments"))
            if not ok:
                self.note(request, "tool-call arguments that are not a JSON object answered as {}")
            blocks.append(
                {"type": "tool_use", "id": translated.call_id(call, i), "name": fn.get("name"), "input": args}
            )
        reason, sequence = self.stop_reason(request, finish)
        return {
            "id": translated.new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": blocks,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(*translated.usage_counts(usage)),
        }

    def error_body(self, status: int, message: str) -> dict:
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def sse_error(self, status: int, message: str) -> bytes:
        return event("error", self.error_body(status, message))

    async def answer_aux(self, call: AuxCall) -> AuxAnswer:
        if call.route.aux != "count_tokens":
            return await super().answer_aux(call)
        body = dict(call.body) if isinstance(call.body, dict) else call.body
        n, how = await self.count_tokens(call, body, self.routes[0])
        return AuxAnswer(200, {"input_tokens": n}, how)
