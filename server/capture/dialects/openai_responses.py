"""The OpenAI Responses dialect (`POST /v1/responses`, `POST /v1/responses/input_tokens`, and the model list
`GET /v1/models`), translated to and from the engine's chat completions (see `translated`).

Request: ``instructions`` become the system message; ``input`` (a string, or items) chat messages in order: message
items by role (``developer`` as ``system``, reported), consecutive assistant-side items (``reasoning``, assistant
``message``, ``function_call``, ``custom_tool_call``) one assistant message (reasoning, content, tool calls),
``function_call_output`` / ``custom_tool_call_output`` tool messages. Function tools become chat function tools;
custom (freeform) tools function tools with one string parameter ``input`` (reported); ``text.format`` becomes
``response_format``; ``max_output_tokens`` ``max_tokens``. Lost, and so reported: hosted tools (web search, tool
search, namespaces, …), encrypted reasoning, unknown input items, and any other parameter (``reasoning``,
``include``, ``prompt_cache_key``, …). ``previous_response_id`` is refused (nothing is stored: send the whole input).
Images and files are refused (400).

Reply: a response with output items reasoning → message (``output_text``) → ``function_call`` (``call_id`` is the
engine's tool-call id) / ``custom_tool_call``; status ``completed``, or ``incomplete`` with ``max_output_tokens`` /
``content_filter``; usage. Streamed as response.created, response.in_progress, per item output_item.added, its
deltas (reasoning_text / output_text / function_call_arguments), its .done events and output_item.done, then
response.completed (or response.incomplete); errors as ``{"error": {...}}`` (an ``error`` event in a stream).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from swe_gym_env.server.capture.dialect import AgentRequest, AuxAnswer, AuxCall, DialectError, DialectRoute
from swe_gym_env.server.capture.dialects import translated
from swe_gym_env.server.capture.dialects.translated import DialectEvents, TranslatedDialect, Translation

HANDLED = {
    "model", "input", "instructions", "stream", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "text", "store", "previous_response_id",
}  # fmt: skip
ECHO = ("tool_choice", "parallel_tool_calls", "temperature", "top_p", "max_output_tokens", "instructions", "metadata")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def event(data: dict) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _text(content: Any, where: str, t: Translation, allowed: tuple[str, ...]) -> str:
    def text(kind: str | None, part: Any) -> str | None:
        if kind in allowed:
            return str(part.get("text", ""))
        return str(part.get("refusal", "")) if kind == "refusal" else None

    return translated.content_text(
        content, where, t, text, refused=("input_image", "input_file"), noun="part", dropped="content part dropped"
    )


class _Assistant:
    """Consecutive assistant-side input items, gathered into one chat assistant message."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict] = []

    def message(self) -> dict:
        return translated.assistant_message("".join(self.texts) or None, self.calls, "\n".join(self.reasoning) or None)


def _reasoning(item: dict, t: Translation) -> str:
    parts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
    if not parts:
        parts = [p.get("text", "") for p in item.get("summary") or [] if isinstance(p, dict)]
    if not parts and item.get("encrypted_content"):
        t.lose("encrypted reasoning dropped (opaque to the engine)")
    return "\n".join(str(p) for p in parts)


def translate_input(body: dict, t: Translation) -> list[dict]:
    chat: list[dict] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        chat.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*chat, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise DialectError(400, "input: a string or a list of input items is required")
    pending: _Assistant | None = None

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            chat.append(pending.message())
            pending = None

    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DialectError(400, f"input[{i}] must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role == "assistant":
            pending = pending or _Assistant()
            text = _text(item.get("content"), f"input[{i}]", t, ("output_text", "input_text", "text"))
            if pending.calls and text:
                t.lose("assistant text after a tool call moved before the tool calls")
            pending.texts.append(text)
        elif kind == "message":
            flush()
            if role == "developer":
                t.lose("developer messages sent as system messages")
                role = "system"
            if role not in ("user", "system"):
                raise DialectError(400, f"input[{i}].role must be user, system, developer or assistant")
            chat.append({"role": role, "content": _text(item.get("content"), f"input[{i}]", t, ("input_text", "text"))})
        elif kind == "reasoning":
            pending = pending or _Assistant()
            pending.reasoning.append(_reasoning(item, t))
        elif kind == "function_call":
            pending = pending or _Assistant()
            cid = str(item.get("call_id") or item.get("id"))
            pending.calls.append(translated.tool_call(cid, item.get("name"), str(item.get("arguments") or "")))
        elif kind == "custom_tool_call":
            pending = pending or _Assistant()
            cid = str(item.get("call_id") or item.get("id"))
            pending.calls.append(
                translated.tool_call(cid, item.get("name"), translated.dumps_args({"input": item.get("input", "")}))
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            flush()
            output = _text(item.get("output"), f"input[{i}].output", t, ("input_text", "output_text", "text"))
            chat.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            t.lose(f"input item {kind} dropped")
    flush()
    return chat


def _tools(tools: Any, t: Translation) -> tuple[list[dict], list[str]]:
    out, custom = [], []
    for tool in tools if isinstance(tools, list) else []:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            fn = {
                "name": tool.get("name"),
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
            }
            if tool.get("strict") is not None:
                fn["strict"] = tool["strict"]
            out.append({"type": "function", "function": fn})
        elif kind == "custom":
            t.lose("custom tools offered as functions with one string parameter `input`")
            custom.append(tool.get("name"))
            params = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool.get("name"),
                        "description": tool.get("description"),
                        "parameters": params,
                    },
                }
            )
        else:
            t.lose(f"tool type {kind} dropped")
    return out, custom


def translate_request(body: dict, t: Translation) -> dict:
    if body.get("previous_response_id"):
        raise DialectError(400, "previous_response_id is not supported: nothing is stored here; send the whole input")
    out: dict[str, Any] = {"messages": translate_input(body, t)}
    if "tools" in body:
        out["tools"], t.state["custom_tools"] = _tools(body["tools"], t)
    choice = body.get("tool_choice")
    if choice in ("auto", "none", "required"):
        out["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        t.lose("tool_choice of this kind ignored")
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    if isinstance(body.get("max_output_tokens"), int):
        out["max_tokens"] = body["max_output_tokens"]
    for k in ("temperature", "top_p"):
        if body.get(k) is not None:
            out[k] = body[k]
    text = body.get("text")
    if isinstance(text, dict):
        fmt = text.get("format") or {}
        if fmt.get("type") == "json_schema":
            schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
            if fmt.get("strict") is not None:
                schema["strict"] = fmt["strict"]
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt.get("type") == "json_object":
            out["response_format"] = {"type": "json_object"}
        for k in sorted(set(text) - {"format"}):
            t.lose(f"text.{k} ignored")
    if body.get("store"):
        t.lose("store ignored (responses are not stored)")
    for k in sorted(set(body) - HANDLED):
        if body[k] is not None:
            t.lose(f"parameter {k} ignored")
    return out


def _usage(prompt: int, completion: int) -> dict:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class ResponsesEvents(DialectEvents):
    """response.created / in_progress, each output item (added, deltas, done), response.completed / incomplete."""

    def __init__(self, dialect: ResponsesDialect, request: AgentRequest) -> None:
        super().__init__(dialect, request)
        self.responses = dialect
        self.id = translated.new_id("resp_")
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict] = []
        self.item: dict | None = None  # the open item
        self.buf: list[str] = []  # its text so far

    def _ev(self, kind: str, **data: Any) -> bytes:
        out = event({"type": kind, "sequence_number": self.seq, **data})
        self.seq += 1
        return out

    def _where(self) -> dict:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def _close(self) -> Iterator[bytes]:
        item = self.item
        if item is None:
            return
        text = "".join(self.buf)
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            yield self._ev("response.output_text.done", **self._where(), content_index=0, text=text, logprobs=[])
            yield self._ev("response.content_part.done", **self._where(), content_index=0, part=part)
            item = {**item, "status": "completed", "content": [part]}
        elif item["type"] == "reasoning":
            yield self._ev("response.reasoning_text.done", **self._where(), content_index=0, text=text)
            item = {**item, "status": "completed", "content": [{"type": "reasoning_text", "text": text}]}
        elif item["type"] == "function_call":
            yield self._ev("response.function_call_arguments.done", **self._where(), arguments=text)
            item = {**item, "status": "completed", "arguments": text}
        else:  # a custom tool call: its input is the engine's one string argument
            args, _ = translated.loads_args(text)
            value = args.get("input") if isinstance(args.get("input"), str) else text
            yield self._ev("response.custom_tool_call_input.done", **self._where(), input=value)
            item = {**item, "status": "completed", "input": value}
        yield self._ev("response.output_item.done", output_index=len(self.output), item=item)
        self.output.append(item)
        self.item, self.buf = None, []

    def _open(self, item: dict) -> Iterator[bytes]:
        yield from self._close()
        self.item = item
        yield self._ev("response.output_item.added", output_index=len(self.output), item=item)

    def start(self, prompt_tokens: int) -> Iterator[bytes]:
        shell = self.responses.response(self.request, self.id, self.created, "in_progress", [], None, None)
        yield self._ev("response.created", response=shell)
        yield self._ev("response.in_progress", response=shell)

    def reasoning(self, text: str) -> Iterator[bytes]:
        if self.item is None or self.item["type"] != "reasoning":
            item = {
                "type": "reasoning",
                "id": translated.new_id("rs_"),
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            yield from self._open(item)
        self.buf.append(text)
        yield self._ev("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)

    def text(self, text: str) -> Iterator[bytes]:
        if self.item is None or self.item["type"] != "message":
            item = {
                "type": "message",
                "id": translated.new_id("msg_"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            yield from self._open(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield self._ev("response.content_part.added", **self._where(), content_index=0, part=part)
        self.buf.append(text)
        yield self._ev("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=[])

    def tool_start(self, index: int, cid: str, name: str) -> Iterator[bytes]:
        yield from self._open(self.responses.call_item(self.request, cid, name, None, "in_progress"))

    def tool_args(self, index: int, text: str) -> Iterator[bytes]:
        if self.item is None or self.item["type"] not in ("function_call", "custom_tool_call"):
            return
        self.buf.append(text)
        if self.item["type"] == "function_call":
            yield self._ev("response.function_call_arguments.delta", **self._where(), delta=text)

    def finish(self, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        yield from self._close()
        status, incomplete = self.responses.status(self.request, finish)
        full = self.responses.response(
            self.request,
            self.id,
            self.created,
            status,
            self.output,
            incomplete,
            _usage(*translated.usage_counts(usage)),
        )
        yield self._ev("response.completed" if status == "completed" else "response.incomplete", response=full)


class ResponsesDialect(TranslatedDialect):
    name = "openai-responses"
    routes = (
        DialectRoute("/v1/responses", ("POST",)),
        DialectRoute("/v1/responses/input_tokens", ("POST",), aux="input_tokens"),
        DialectRoute("/v1/models", ("GET",), aux="models"),
        DialectRoute("/v1/models/{model:path}", ("GET",), aux="model"),
    )

    def translate(self, body: dict, route: DialectRoute, params: Mapping[str, str]) -> Translation:
        t = Translation(body={}, stream=bool(body.get("stream")), model=body.get("model"))
        t.body = translate_request(body, t)
        t.state["echo"] = {k: body.get(k) for k in ECHO}
        t.state["tools"] = body.get("tools") or []
        return t

    def status(self, request: AgentRequest, finish: str | None) -> tuple[str, dict | None]:
        if finish in INCOMPLETE:
            return "incomplete", {"reason": INCOMPLETE[finish]}
        if finish not in (None, "stop", "tool_calls"):
            self.note(request, f"finish reason {finish} answered as completed")
        return "completed", None

    def call_item(self, request: AgentRequest, cid: str, name: str, arguments: str | None, status: str) -> dict:
        if name in request.state.get("custom_tools", []):
            item: dict[str, Any] = {"type": "custom_tool_call", "id": f"ctc_{cid}", "call_id": cid, "name": name}
            if arguments is not None:
                args, _ = translated.loads_args(arguments)
                item["input"] = args.get("input") if isinstance(args.get("input"), str) else arguments
            return {**item, "status": status}
        return {
            "type": "function_call",
            "id": f"fc_{cid}",
            "call_id": cid,
            "name": name,
            "arguments": arguments if arguments is not None else "",
            "status": status,
        }

    def response(
        self,
        request: AgentRequest,
        rid: str,
        created: int,
        status: str,
        output: list[dict],
        incomplete: dict | None,
        usage: dict | None,
    ) -> dict:
        echo = request.state.get("echo") or {}
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "model": request.model,
            "output": output,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "text": {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice") or "auto",
            "tools": request.state.get("tools") or [],
            "usage": usage,
            **{k: echo.get(k) for k in ("temperature", "top_p", "max_output_tokens", "instructions")},
            "metadata": echo.get("metadata") or {},
        }

    def events(self, request: AgentRequest) -> ResponsesEvents:
        return ResponsesEvents(self, request)

    def reply(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> dict:
        output: list[dict] = []
        if message.get("reasoning"):
            content = [{"type": "reasoning_text", "text": message["reasoning"]}]
            output.append(
                {
                    "type": "reasoning",
                    "id": translated.new_id("rs_"),
                    "summary": [],
                    "content": content,
                    "status": "completed",
                }
            )
        if message.get("content"):
            part = {"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}
            output.append(
                {
                    "type": "message",
                    "id": translated.new_id("msg_"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [part],
                }
            )
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            args = fn.get("arguments") if isinstance(fn.get("arguments"), str) else ""
            output.append(self.call_item(request, translated.call_id(call, i), fn.get("name") or "", args, "completed"))
        status, incomplete = self.status(request, finish)
        usage_obj = _usage(*translated.usage_counts(usage))
        return self.response(
            request, translated.new_id("resp_"), int(time.time()), status, output, incomplete, usage_obj
        )

    def error_body(self, status: int, message: str) -> dict:
        kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def sse_error(self, status: int, message: str) -> bytes:
        return event({"type": "error", "code": str(status), "message": message, "param": None, "sequence_number": 0})

    async def answer_aux(self, call: AuxCall) -> AuxAnswer:
        model = {"id": call.served_model, "object": "model", "created": 0, "owned_by": "swe-gym-env"}
        # the Anthropic models API reads the same route: its fields ride along
        model |= {"type": "model", "display_name": call.served_model, "created_at": "1970-01-01T00:00:00Z"}
        if call.route.aux == "models":
            body = {"object": "list", "data": [model], "has_more": False}
            return AuxAnswer(
                200, body | {"first_id": call.served_model, "last_id": call.served_model}, "answered by the proxy"
            )
        if call.route.aux == "model":  # whatever name the agent knows the session's model by
            name = call.params.get("model") or call.served_model
            return AuxAnswer(200, model | {"id": name, "display_name": name}, "answered by the proxy")
        if call.route.aux == "input_tokens":
            n, how = await self.count_tokens(call, call.body, self.routes[0])
            return AuxAnswer(200, {"object": "response.input_tokens", "input_tokens": n}, how)
        return await super().answer_aux(call)
