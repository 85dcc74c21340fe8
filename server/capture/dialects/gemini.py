"""The Gemini dialect (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` (SSE, as the SDKs ask
with ``?alt=sse``), `:countTokens`, and the model list `GET /v1beta/models[/{model}]`), translated to and from the
engine's chat completions (see `translated`). The key comes in ``x-goog-api-key``.

Request: ``systemInstruction`` becomes the system message; each ``user`` content's text parts one user message and
its ``functionResponse`` parts tool messages (``response.output`` / ``response.error`` as the text, any other
response as JSON); each ``model`` content one assistant message (``thought`` parts its reasoning, text its content,
``functionCall`` parts its tool calls). Function calls without ids (Pi and gemini-cli send none for Gemini models)
get deterministic ids by position (``call_<content>_<part>``), and the function responses after them the same ids in
order. ``functionDeclarations`` become function tools (``parametersJsonSchema`` as it is, OpenAPI ``parameters``
with lower-cased types); ``toolConfig`` the tool choice; ``generationConfig`` temperature/topP/topK/maxOutputTokens/
stopSequences/seed/penalties and a JSON response schema ``response_format``. Lost, and so reported: thought
signatures, non-function tools (search, code execution), code-execution parts, a function response's error flag,
and any other parameter (``safetySettings``, ``thinkingConfig``, ``cachedContent``, …). Images and files (inlineData,
fileData) are refused (400). ``:streamGenerateContent`` always answers SSE.

Reply: one candidate whose parts are thought text → text → functionCall (``id`` is the engine's tool-call id);
``finishReason`` STOP (also after tool calls) / MAX_TOKENS / SAFETY; ``usageMetadata``. Streamed as one ``data:``
chunk per engine delta of text or reasoning (a function call is sent whole, when its arguments are complete), the
last with the finish reason and usage; errors as ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from swe_gym_env.server.capture.dialect import AgentRequest, AuxAnswer, AuxCall, DialectError, DialectRoute, sse
from swe_gym_env.server.capture.dialects import translated
from swe_gym_env.server.capture.dialects.translated import IMAGES_REFUSED, DialectEvents, TranslatedDialect, Translation

HANDLED = {"contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "generationConfig", "model"}
GENERATION = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "stopSequences": "stop",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
IMAGE_PARTS = ("inlineData", "fileData", "inline_data", "file_data")


def _lower_types(node: Any) -> Any:
    """An OpenAPI schema (Gemini's ``parameters``: ``"type": "OBJECT"``) as JSON schema (lower-case types)."""
    if isinstance(node, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_lower_types(v) for v in node]
    return node


def _system(value: Any, t: Translation) -> str:
    if isinstance(value, str):
        return value
    parts = value.get("parts") if isinstance(value, dict) else value
    return "\n".join(str(p.get("text", "")) for p in parts or [] if isinstance(p, dict) and "text" in p)


def _response_text(response: Any, t: Translation) -> str:
    if isinstance(response, dict) and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    if isinstance(response, dict) and set(response) == {"error"} and isinstance(response["error"], str):
        t.lose("functionResponse error flag dropped (chat tool messages have none)")
        return response["error"]
    return translated.dumps_args(response)


def translate_contents(body: dict, t: Translation) -> list[dict]:
    contents = body.get("contents")
    if not isinstance(contents, list):
        raise DialectError(400, "contents: a list of contents is required")
    chat: list[dict] = []
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system:
        chat.append({"role": "system", "content": _system(system, t)})
    last_calls: list[str] = []  # the ids of the previous model content's function calls, in order
    answered = 0
    for c, content in enumerate(contents):
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
            raise DialectError(400, f"contents[{c}] must be an object with parts")
        role = content.get("role") or "user"
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict] = []
        pending: list[dict] = []  # the user content's messages, in part order
        for p, part in enumerate(content["parts"]):
            if not isinstance(part, dict):
                raise DialectError(400, f"contents[{c}].parts[{p}] must be an object")
            if part.get("thoughtSignature") or part.get("thought_signature"):
                t.lose("thought signatures ignored (opaque to the engine)")
            if any(k in part for k in IMAGE_PARTS):
                raise DialectError(400, f"{IMAGES_REFUSED}: inline or file data in contents[{c}].parts[{p}]")
            if role == "model":
                if "functionCall" in part:
                    fc = part["functionCall"] or {}
                    cid = str(fc.get("id") or f"call_{c}_{p}")
                    calls.append(translated.tool_call(cid, fc.get("name"), translated.dumps_args(fc.get("args"))))
                elif "text" in part and part.get("thought"):
                    reasoning.append(str(part["text"]))
                elif "text" in part:
                    if calls and part["text"]:
                        t.lose("model text after a function call moved before the calls")
                    texts.append(str(part["text"]))
                else:
                    t.lose(f"model part {sorted(part)[0] if part else 'empty'} dropped")
            elif "functionResponse" in part:
                fr = part["functionResponse"] or {}
                cid = fr.get("id") or (last_calls[answered] if answered < len(last_calls) else f"call_{c}_{p}")
                answered += 1
                if texts:
                    pending.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                pending.append(
                    {"role": "tool", "tool_call_id": str(cid), "content": _response_text(fr.get("response"), t)}
                )
            elif "text" in part:
                texts.append(str(part["text"]))
            else:
                t.lose(f"user part {sorted(part)[0] if part else 'empty'} dropped")
        if role == "model":
            chat.append(translated.assistant_message("".join(texts) or None, calls, "\n".join(reasoning) or None))
            last_calls, answered = [c_["id"] for c_ in calls], 0
        else:
            if texts:
                pending.append({"role": "user", "content": "\n".join(texts)})
            chat += pending
    return chat


def _tools(tools: Any, t: Translation) -> list[dict]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        for k in sorted(set(tool) - {"functionDeclarations", "function_declarations"}):
            t.lose(f"tool {k} dropped")
        for decl in tool.get("functionDeclarations") or tool.get("function_declarations") or []:
            if "parametersJsonSchema" in decl:
                params = decl["parametersJsonSchema"]
            elif "parameters" in decl:
                params = _lower_types(decl["parameters"])
            else:
                params = {"type": "object", "properties": {}}
            fn = {"name": decl.get("name"), "description": decl.get("description"), "parameters": params}
            out.append({"type": "function", "function": fn})
    return out


def _tool_choice(config: Any, out: dict, t: Translation) -> None:
    fcc = (config or {}).get("functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(fcc, dict):
        return
    mode = str(fcc.get("mode") or "AUTO").upper()
    names = fcc.get("allowedFunctionNames") or []
    if mode == "NONE":
        out["tool_choice"] = "none"
    elif mode == "ANY" and len(names) == 1:
        out["tool_choice"] = {"type": "function", "function": {"name": names[0]}}
    elif mode == "ANY":
        out["tool_choice"] = "required"
        if names:
            t.lose("allowedFunctionNames ignored (more than one)")
    elif mode != "AUTO":
        t.lose(f"function calling mode {mode} answered as auto")


def _generation(config: Any, out: dict, t: Translation) -> None:
    if not isinstance(config, dict):
        return
    for k, v in config.items():
        if k in GENERATION:
            if v is not None:
                out[GENERATION[k]] = v
        elif k in ("responseMimeType", "responseSchema", "responseJsonSchema", "response_json_schema"):
            continue
        elif k == "candidateCount" and v in (None, 1):
            continue
        elif v is not None:
            t.lose(f"generationConfig.{k} ignored")
    schema = config.get("responseJsonSchema") or config.get("response_json_schema")
    if schema is None and config.get("responseSchema") is not None:
        schema = _lower_types(config["responseSchema"])
    if schema is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    elif config.get("responseMimeType") == "application/json":
        out["response_format"] = {"type": "json_object"}


def translate_request(body: dict, t: Translation) -> dict:
    if isinstance(body.get("generateContentRequest"), dict):  # countTokens may wrap a whole request
        body = body["generateContentRequest"]
    out: dict[str, Any] = {"messages": translate_contents(body, t)}
    if "tools" in body:
        out["tools"] = _tools(body["tools"], t)
    _tool_choice(body.get("toolConfig"), out, t)
    _generation(body.get("generationConfig"), out, t)
    for k in sorted(set(body) - HANDLED):
        if body[k] is not None:
            t.lose(f"parameter {k} ignored")
    return out


def _usage(prompt: int, completion: int) -> dict:
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


class GeminiEvents(DialectEvents):
    """One ``data:`` chunk per delta of text or reasoning; function calls whole; the finish with usage last."""

    def __init__(self, dialect: GeminiDialect, request: AgentRequest) -> None:
        super().__init__(dialect, request)
        self.gemini = dialect
        self.id = translated.new_id("")[:24]
        self.tool: tuple[str, str, list[str]] | None = None  # (id, name, argument pieces) until it is complete
        self.sent = 0  # parts sent

    def _chunk(self, parts: list[dict], **extra: Any) -> bytes:
        self.sent += len(parts)
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0, **extra.pop("candidate", {})}
        return sse({"candidates": [candidate], **extra, "modelVersion": self.request.model, "responseId": self.id})

    def _flush_tool(self) -> list[dict]:
        if self.tool is None:
            return []
        cid, name, pieces = self.tool
        self.tool = None
        return [self.gemini.call_part(self.request, cid, name, "".join(pieces))]

    def start(self, prompt_tokens: int) -> Iterator[bytes]:
        return iter(())

    def reasoning(self, text: str) -> Iterator[bytes]:
        yield self._chunk([*self._flush_tool(), {"text": text, "thought": True}])

    def text(self, text: str) -> Iterator[bytes]:
        yield self._chunk([*self._flush_tool(), {"text": text}])

    def tool_start(self, index: int, cid: str, name: str) -> Iterator[bytes]:
        if parts := self._flush_tool():
            yield self._chunk(parts)
        self.tool = (cid, name, [])

    def tool_args(self, index: int, text: str) -> Iterator[bytes]:
        if self.tool is not None:
            self.tool[2].append(text)
        return iter(())

    def finish(self, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        parts = self._flush_tool() or [{"text": ""}]  # the last chunk carries a part, as the API's own does
        extra = {"candidate": {"finishReason": self.gemini.finish_reason(self.request, finish)}}
        yield self._chunk(parts, **extra, usageMetadata=_usage(*translated.usage_counts(usage)))


class GeminiDialect(TranslatedDialect):
    name = "gemini"
    key_headers = ("x-goog-api-key",)
    routes = (
        DialectRoute("/v1beta/models/{model:path}:generateContent", ("POST",)),
        DialectRoute("/v1beta/models/{model:path}:streamGenerateContent", ("POST",)),
        DialectRoute("/v1beta/models/{model:path}:countTokens", ("POST",), aux="count_tokens"),
        DialectRoute("/v1beta/models", ("GET",), aux="models"),
        DialectRoute("/v1beta/models/{model:path}", ("GET",), aux="model"),
    )

    def translate(self, body: dict, route: DialectRoute, params: Mapping[str, str]) -> Translation:
        stream = route.path.endswith(":streamGenerateContent")
        t = Translation(body={}, stream=stream, model=params.get("model") or body.get("model"))
        t.body = translate_request(body, t)
        return t

    def finish_reason(self, request: AgentRequest, finish: str | None) -> str:
        if finish is not None and finish not in FINISH:
            self.note(request, f"finish reason {finish} answered as OTHER")
            return "OTHER"
        return FINISH[finish or "stop"]

    def call_part(self, request: AgentRequest, cid: str, name: str, arguments: Any) -> dict:
        args, ok = translated.loads_args(arguments)
        if not ok:
            self.note(request, "function-call arguments that are not a JSON object answered as {}")
        return {"functionCall": {"id": cid, "name": name, "args": args}}

    def events(self, request: AgentRequest) -> GeminiEvents:
        return GeminiEvents(self, request)

    def reply(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> dict:
        parts: list[dict] = []
        if message.get("reasoning"):
            parts.append({"text": message["reasoning"], "thought": True})
        if message.get("content"):
            parts.append({"text": message["content"]})
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            parts.append(
                self.call_part(request, translated.call_id(call, i), fn.get("name") or "", fn.get("arguments"))
            )
        candidate = {
            "content": {"role": "model", "parts": parts or [{"text": ""}]},
            "finishReason": self.finish_reason(request, finish),
            "index": 0,
        }
        return {
            "candidates": [candidate],
            "usageMetadata": _usage(*translated.usage_counts(usage)),
            "modelVersion": request.model,
            "responseId": translated.new_id("")[:24],
        }

    def error_body(self, status: int, message: str) -> dict:
        code = STATUSES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": code}}

    async def answer_aux(self, call: AuxCall) -> AuxAnswer:
        def model(name: str) -> dict:
            return {
                "name": f"models/{name}",
                "baseModelId": name,
                "version": "1",
                "displayName": name,
                "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
            }

        if call.route.aux == "models":
            return AuxAnswer(200, {"models": [model(call.served_model)]}, "answered by the proxy")
        if call.route.aux == "model":
            return AuxAnswer(200, model(call.params.get("model") or call.served_model), "answered by the proxy")
        if call.route.aux == "count_tokens":
            n, how = await self.count_tokens(call, call.body, self.routes[0])
            return AuxAnswer(200, {"totalTokens": n}, how)
        return await super().answer_aux(call)
