"""The base of the dialects that translate to and from the engine's chat completions (Responses, Messages, Gemini).

A translated dialect reads the agent's request into a chat-completions body (`TranslatedDialect.translate`, noting
every loss: an ignored parameter, a dropped block type), sends that to the engine with capture forced on exactly as
the chat dialect does (`openai_chat.upstream_body`), and answers in the agent's own shape. Streams are translated
chunk by chunk as the engine sends them (`TranslatedStream` turns each engine chunk into neutral deltas, the
dialect's `DialectEvents` turns those into its own event sequence), so the time to first token stays the engine's;
a complete reply (non-streamed engine call, budget reply) is replayed through the same events.

Translation is deterministic: the same agent history always gives the same chat messages (content parts of text
only become one string joined by newlines, as the chat template renders them; tool-call inputs are serialised with
`json.dumps`), so turn k+1's prompt extends turn k's whenever the agent resends its history unchanged, and the graph
links turns the same whatever the dialect. What a dialect cannot carry over is a finding, never silent: losses found
in the request are returned with the rewrites (`upstream_body`), those found in the reply go to `AgentRequest.rewrites`
(the session's counter). Images are refused (400, in the dialect's error shape): the engine takes text only.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swe_gym_env.server.capture.dialect import (
    AgentRequest,
    AuxAnswer,
    AuxCall,
    CapturedCall,
    Dialect,
    DialectError,
    DialectRoute,
    DialectStream,
)
from swe_gym_env.server.capture.dialects.openai_chat import StreamAccumulator
from swe_gym_env.server.capture.dialects.openai_chat import upstream_body as chat_upstream_body
from swe_gym_env.server.capture.ids import check_ids

if TYPE_CHECKING:  # annotations only
    from swe_gym_env.server.capture.dialect import EngineTerms

IMAGES_REFUSED = "images are not supported through the capture proxy (the engine takes text only)"


@dataclass
class Translation:
    """One request as the engine gets it (a chat-completions body) and what the translation lost."""

    body: dict
    stream: bool
    model: Any
    lost: list[str] = field(default_factory=list)  # each kind once per call: counted per call in the findings
    state: dict = field(default_factory=dict)

    def lose(self, what: str) -> None:
        if what not in self.lost:
            self.lost.append(what)


def text_of(parts: list[str], sep: str = "\n") -> str:
    return sep.join(parts)


def content_text(
    content: Any,
    where: str,
    t: Translation,
    text: Callable[[str | None, Any], str | None],
    *,
    refused: tuple[str, ...],
    noun: str,
    dropped: str,
) -> str:
    """The text of a message's content (at ``where`` in the request): a string as it is; of a list of blocks (each a
    ``noun``), what ``text`` takes of each given its type (None where it is no dict), one a line; a block it takes
    nothing of (None) is refused (400) where its type is one of ``refused`` (images, files), else dropped and
    reported (`<type> <dropped>`). Anything else: no text."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if (got := text(kind, block)) is not None:
            parts.append(got)
        elif kind in refused:
            raise DialectError(400, f"{IMAGES_REFUSED}: an {kind} {noun} in {where}")
        else:
            t.lose(f"{kind} {dropped}")
    return "\n".join(parts)


def dumps_args(args: Any) -> str:
    """Tool-call arguments as the chat request carries them (a JSON string; the same input, the same string)."""
    return json.dumps(args if args is not None else {}, ensure_ascii=False)


def loads_args(arguments: Any) -> tuple[dict, bool]:
    """A tool call's JSON-string arguments as an object, and whether they were one."""
    if isinstance(arguments, dict):
        return arguments, True
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {}, False
    return (parsed, True) if isinstance(parsed, dict) else ({}, False)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def call_id(call: dict, index: int) -> str:
    return call.get("id") or f"call_{index}"


def usage_counts(usage: dict | None) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of a chat usage object (zeros when there is none: budget replies)."""
    u = usage or {}
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    return (p if isinstance(p, int) else 0), (c if isinstance(c, int) else 0)


def assistant_message(content: str | None, tool_calls: list[dict], reasoning: str | None) -> dict:
    """An assistant message in chat shape, as every translated dialect builds it from the agent's history."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if reasoning:
        msg["reasoning"] = reasoning
    return msg


def tool_call(cid: str, name: Any, arguments: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def engine_message(msg: dict) -> dict:
    """The engine's assistant message as a turn records it: content, tool calls, and reasoning where it gave some."""
    out = {"role": "assistant", "content": msg.get("content"), "tool_calls": msg.get("tool_calls") or []}
    reasoning = msg.get("reasoning") or msg.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning"] = reasoning
    return out


class DialectEvents(ABC):
    """One call's reply as the agent's own event sequence, from neutral deltas. Each method returns SSE bytes."""

    def __init__(self, dialect: TranslatedDialect, request: AgentRequest) -> None:
        self.dialect = dialect
        self.request = request

    @abstractmethod
    def start(self, prompt_tokens: int) -> Iterator[bytes]: ...

    @abstractmethod
    def reasoning(self, text: str) -> Iterator[bytes]: ...

    @abstractmethod
    def text(self, text: str) -> Iterator[bytes]: ...

    @abstractmethod
    def tool_start(self, index: int, cid: str, name: str) -> Iterator[bytes]: ...

    @abstractmethod
    def tool_args(self, index: int, text: str) -> Iterator[bytes]: ...

    @abstractmethod
    def finish(self, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        """Close what is open and end the stream (the reply's stop reason and usage)."""


def _first_choice(chunk: dict) -> Iterator[tuple[dict, dict]]:
    """A streamed engine chunk's first choice (index 0: the one the agent gets) and its delta, where it has one."""
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            yield choice, choice.get("delta") or {}


def _reasoning(delta: dict) -> str:
    """A delta's reasoning text ('' where it has none)."""
    r = delta.get("reasoning") or delta.get("reasoning_content")
    return r if isinstance(r, str) else ""


class TranslatedStream(DialectStream):
    """A streamed engine reply, captured as chat's is and translated chunk by chunk into the agent's events."""

    def __init__(self, dialect: TranslatedDialect, request: AgentRequest) -> None:
        self.dialect = dialect
        self.request = request
        self.events = dialect.events(request)
        self.acc = StreamAccumulator()
        self.reasoning: list[str] = []
        self.started = False
        self.tools: set[int] = set()
        self._call: CapturedCall | None = None

    def check_first(self, chunk: dict | None) -> None:
        if chunk is None or chunk.get("prompt_token_ids") is None:
            raise DialectError(502, "engine streamed no prompt_token_ids", "no_token_ids")

    def add(self, chunk: dict) -> None:
        self.acc.add(chunk)
        for choice, delta in _first_choice(chunk):
            if r := _reasoning(delta):
                self.reasoning.append(r)
            if choice.get("finish_reason") and choice.get("stop_reason") is not None:
                self.request.state["engine_stop"] = choice["stop_reason"]

    def holds(self, chunk: dict) -> bool:
        choices = chunk.get("choices") or []
        return any(isinstance(c, dict) and c.get("finish_reason") for c in choices) or not choices

    def _deltas(self, chunk: dict) -> Iterator[bytes]:
        if not self.started:
            self.started = True
            yield from self.events.start(len(self.acc.prompt_token_ids or []))
        for _, delta in _first_choice(chunk):
            if r := _reasoning(delta):
                yield from self.events.reasoning(r)
            if isinstance(delta.get("content"), str) and delta["content"]:
                yield from self.events.text(delta["content"])
            for tc in delta.get("tool_calls") or []:
                i = int(tc.get("index", 0))
                fn = tc.get("function") or {}
                if i not in self.tools:
                    self.tools.add(i)
                    yield from self.events.tool_start(i, tc.get("id") or f"call_{i}", fn.get("name") or "")
                if fn.get("arguments"):
                    yield from self.events.tool_args(i, fn["arguments"])

    def agent_chunk(self, chunk: dict) -> bytes:
        return b"".join(self._deltas(chunk))

    def end(self, held: list[dict]) -> Iterator[bytes]:
        for chunk in held:
            yield from self._deltas(chunk)
        call = self.call()
        yield from self.events.finish(call.message, call.finish_reason, call.usage)

    def call(self) -> CapturedCall:
        if self._call is None:
            call = self.acc.call()
            if self.reasoning:
                call.message["reasoning"] = "".join(self.reasoning)
            if call.usage is None:
                call.usage = {
                    "prompt_tokens": len(call.prompt_token_ids),
                    "completion_tokens": len(call.completion_token_ids),
                }
            self._call = call
        return self._call


class TranslatedDialect(Dialect):
    """A dialect whose agent-facing shape is not chat completions: translated both ways, captured as chat is."""

    relays_engine = False  # black-box sessions translate too (without capture fields)
    upstream_path = "/chat/completions"

    # -- the agent's request -----------------------------------------------------------------------------------
    @abstractmethod
    def translate(self, body: dict, route: DialectRoute, params: Mapping[str, str]) -> Translation:
        """The agent's request as a chat-completions body; `DialectError` (400) when it cannot be one."""

    def parse_request(self, body: Any) -> AgentRequest:
        return self.read_request(body, self.routes[0], {})

    def read_request(self, body: Any, route: DialectRoute, params: Mapping[str, str]) -> AgentRequest:
        if not isinstance(body, dict):
            raise DialectError(400, "the request body must be a JSON object")
        t = self.translate(body, route, params)
        return AgentRequest(
            body=t.body, stream=t.stream, include_usage=True, model=t.model, state={**t.state, "lost": t.lost}
        )

    def upstream_body(self, request: AgentRequest, terms: EngineTerms) -> tuple[dict, list[str]]:
        up, rewrites = chat_upstream_body(request.body, terms)
        if not terms.capture:
            up["stream"] = False  # black-box: one whole reply, translated for the agent
            up.pop("stream_options", None)
        return up, rewrites + [f"{self.name}: {what}" for what in request.state.get("lost", [])]

    def note(self, request: AgentRequest, what: str) -> None:
        """A loss found while answering (counted in the session's rewrite findings)."""
        request.rewrites[f"{self.name}: {what}"] += 1

    # -- the engine's reply ------------------------------------------------------------------------------------
    def call_from_reply(self, data: Any) -> CapturedCall:
        return self._read(data, None, capture=True)

    def read_reply(self, request: AgentRequest, data: Any, capture: bool = True) -> CapturedCall:
        return self._read(data, request, capture)

    @staticmethod
    def _read(data: Any, request: AgentRequest | None, capture: bool) -> CapturedCall:
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            raise DialectError(502, "engine reply has no choices")
        choice = data["choices"][0]
        if not isinstance(choice, dict):
            raise DialectError(502, "engine reply choice is not an object")
        message = engine_message(choice.get("message") or {})
        if request is not None and choice.get("stop_reason") is not None:
            request.state["engine_stop"] = choice["stop_reason"]
        if not capture:
            finish = choice.get("finish_reason")
            return CapturedCall(array("q"), array("q"), array("d"), message, finish, data.get("usage"))
        prompt, completion, lps = check_ids(
            data.get("prompt_token_ids"), choice.get("token_ids"), (choice.get("logprobs") or {}).get("content")
        )
        return CapturedCall(
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=lps,
            message=message,
            finish_reason=choice.get("finish_reason"),
            usage=data.get("usage"),
        )

    # -- answering the agent -----------------------------------------------------------------------------------
    @abstractmethod
    def events(self, request: AgentRequest) -> DialectEvents:
        """The agent's event sequence for one streamed reply."""

    def open_stream(self, request: AgentRequest) -> TranslatedStream:
        return TranslatedStream(self, request)

    def replay(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        """A complete reply as the agent's stream: the same events a streamed one gets, all at once."""
        ev = self.events(request)
        yield from ev.start(usage_counts(usage)[0])
        if message.get("reasoning"):
            yield from ev.reasoning(message["reasoning"])
        if message.get("content"):
            yield from ev.text(message["content"])
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            yield from ev.tool_start(i, call_id(call, i), fn.get("name") or "")
            if fn.get("arguments"):
                yield from ev.tool_args(i, fn["arguments"])
        yield from ev.finish(message, finish, usage)

    # -- auxiliary calls ---------------------------------------------------------------------------------------
    async def count_tokens(self, call: AuxCall, body: Any, route: DialectRoute) -> tuple[int, str]:
        """The prompt tokens of a request in this dialect: the engine's /tokenize of its translation (a rough
        estimate, said so, when the engine has no /tokenize)."""
        req = self.read_request(body, route, call.params)
        chat = {"messages": req.body.get("messages") or []}
        if req.body.get("tools"):
            chat["tools"] = req.body["tools"]
        ids = await call.tokenize(chat)
        if ids is not None:
            return len(ids), "answered with the engine's /tokenize of the translated request"
        return len(json.dumps(chat)) // 4, "estimated (bytes / 4): the engine has no /tokenize"

    async def answer_aux(self, call: AuxCall) -> AuxAnswer:
        raise DialectError(404, f"{self.name} has no auxiliary route {call.route.aux!r}")
