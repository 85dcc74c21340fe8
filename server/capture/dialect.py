"""What the capture proxy needs from an API dialect: everything about the agent's wire format, nothing else.

The proxy itself (sessions, keys, budgets, the upstream pump, the graph, the store) only sees token ids, logprobs
and normalised messages. A dialect owns the rest: its agent-facing routes, how a request body is read and checked,
the body sent to the engine with token capture forced on, how a reply (or a stream of chunks) is validated and read
into a `CapturedCall`, and how the agent is answered — JSON, SSE and errors — in its own shape.

What a turn records is the same whatever the agent spoke: the engine's chat-completions request (``Turn.request``)
and an assistant message in chat shape (``role``, ``content``, ``tool_calls`` with ``function.name`` /
``function.arguments``). The graph and the store rely on that, and `request_text` / `decoded_tool_calls` below read
it (the rollout pipeline checks the agent saw its task; the export decodes tool calls). Passthrough sessions (eval
only, nothing captured) relay the engine's own bytes, so they suit dialects whose wire format is the engine's.

Adding a dialect (OpenAI Responses, Anthropic Messages, …) takes one module and one registry entry:

1. ``server/capture/dialects/<name>.py``: a `Dialect` subclass (and a `DialectStream` for its streamed replies) that
   maps its request shape onto an engine chat-completions body and the engine's replies back onto its own shape
   (`openai_chat.ChatDialect` is the reference; subclass it when only the agent-facing side differs;
   `translated.TranslatedDialect` is the base of the dialects that translate to and from chat completions);
2. ``server/capture/registry.py``: its entry in `DIALECTS` (and the import). `CaptureProxy.app` serves each route.

A dialect can also serve auxiliary routes (`DialectRoute.aux`: token counting, model lists): calls an agent makes on
the side that are not model calls. `Dialect.answer_aux` answers them (through the engine's ``/tokenize`` where it
needs token counts); the proxy records each as a session event and counts them in an ``aux_call`` finding, never as
a turn.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson


class DialectError(Exception):
    """A call that cannot be answered as a success. ``code`` names failures with a meaning beyond this call
    (``no_token_ids``: the engine stopped returning token ids)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass
class CapturedCall:
    """One validated call. Ids are int64 and logprobs float64 arrays (the engine's values exactly): they stay arrays
    through the graph and the store; a turn's wire form (`wire.Turn`) has them as JSON lists."""

    prompt_token_ids: array  # typecode "q"
    completion_token_ids: array  # "q"
    logprobs: array  # "d"
    message: dict  # the assistant message, chat-shaped: role, content, tool_calls
    finish_reason: str | None
    usage: dict | None


@dataclass(frozen=True)
class DialectRoute:
    path: str  # under the capture mount, e.g. "/v1/chat/completions"
    methods: tuple[str, ...] = ("POST",)
    aux: str | None = None  # an auxiliary route (not a model call): the name `Dialect.answer_aux` knows it by


@dataclass
class AgentRequest:
    """An agent's request, read by its dialect."""

    body: dict  # normalised: an OpenAI chat-completions request (what `Dialect.upstream_body` starts from)
    stream: bool  # the agent wants SSE
    include_usage: bool  # ... with a final usage event
    model: Any  # the model name the agent asked for (answered back to it; the engine gets the served model)
    state: dict = field(default_factory=dict)  # the dialect's own per-call state (e.g. the agent's original request)
    # translation losses found while answering (set by the proxy to the session's counter; reported as findings)
    rewrites: Counter = field(default_factory=Counter)


@dataclass
class AuxCall:
    """An auxiliary call (a `DialectRoute` with ``aux``), as the proxy hands it to its dialect."""

    route: DialectRoute
    body: Any  # the decoded JSON body (None for a GET)
    params: Mapping[str, str]  # path parameters
    served_model: str  # the session's engine model
    tokenize: Callable[[dict], Awaitable[list[int] | None]]  # the engine's /tokenize of a chat body (None: no such)


@dataclass
class AuxAnswer:
    status: int
    body: dict
    how: str  # how it was answered, for the session's aux finding (e.g. "answered via the engine's /tokenize")


def sse(data: dict | str) -> bytes:
    """One server-sent event carrying ``data`` (a string as it is, anything else as JSON)."""
    return b"data: " + (data.encode() if isinstance(data, str) else orjson.dumps(data)) + b"\n\n"


def read_event(data: bytes) -> dict:
    """One streamed engine chunk (an SSE ``data:`` payload): a JSON object, or `DialectError`."""
    try:
        event = orjson.loads(data)
    except ValueError:
        raise DialectError(502, "engine streamed a chunk that is not JSON") from None
    if not isinstance(event, dict):
        raise DialectError(502, "engine streamed a chunk that is not an object")
    if "error" in event:
        raise DialectError(502, f"engine error mid-stream: {str(event['error'])[:300]}")
    return event


class DialectStream(ABC):
    """One streamed call: collects and checks the engine's chunks and turns each into what the agent gets."""

    def read(self, data: bytes) -> dict:
        """One engine chunk's bytes as a chunk (`read_event`); a dialect may leave parts to parse later."""
        return read_event(data)

    def forwarded(self) -> None:
        """Called once what the agent got so far is on its way: work kept off the agent's path goes here."""
        return None

    @abstractmethod
    def check_first(self, chunk: dict | None) -> None:
        """Raise `DialectError` when the engine's first chunk (None: the stream ended before any) cannot start a
        captured stream."""

    @abstractmethod
    def add(self, chunk: dict) -> None:
        """Accumulate one engine chunk (raising `DialectError` on a malformed one)."""

    @abstractmethod
    def holds(self, chunk: dict) -> bool:
        """Whether the chunk is part of the end of the reply, which the agent only gets once the call is stored."""

    @abstractmethod
    def agent_chunk(self, chunk: dict) -> bytes:
        """The chunk as the agent gets it: SSE bytes, empty when the agent gets nothing for it."""

    @abstractmethod
    def end(self, held: list[dict]) -> Iterator[bytes]:
        """The end of the agent's stream, once the call is stored: the held chunks, then the end marker."""

    @abstractmethod
    def call(self) -> CapturedCall:
        """The whole call, validated (ids and logprobs aligned)."""


@dataclass(frozen=True)
class EngineTerms:
    """What a session asks of the engine beside the agent's request (`Dialect.upstream_body`): the served model, the
    max-tokens cap, the session's sampling and whether the engine streams. With ``capture``, token capture is forced
    on; without it (passthrough, black box) only the served model and the compatibility rewrites apply."""

    served_model: str
    max_tokens: int
    sampling: dict
    stream: bool
    capture: bool = True


class Dialect(ABC):
    name: str
    routes: tuple[DialectRoute, ...]
    upstream_path: str = "/chat/completions"  # under the engine's base URL (which ends with /v1)
    key_headers: tuple[str, ...] = ()  # headers carrying the session key besides Authorization and x-api-key
    relays_engine: bool = True  # passthrough (black-box) sessions relay the engine's own bytes (its wire format)

    def read_request(self, body: Any, route: DialectRoute, params: Mapping[str, str]) -> AgentRequest:
        """The agent's request on one of its routes (path and query parameters in ``params``); `parse_request`
        unless the route says something the body does not (Gemini's model and streaming are in its path)."""
        return self.parse_request(body)

    def read_reply(self, request: AgentRequest, data: Any, capture: bool = True) -> CapturedCall:
        """A whole engine reply to ``request``; without ``capture`` (black-box sessions of dialects that do not relay
        the engine's bytes) the message only, no ids."""
        return self.call_from_reply(data)

    async def answer_aux(self, call: AuxCall) -> AuxAnswer:
        """An auxiliary call on one of its aux routes."""
        raise DialectError(404, f"{self.name} has no auxiliary route {call.route.aux!r}")

    @abstractmethod
    def parse_request(self, body: Any) -> AgentRequest:
        """The agent's decoded JSON body, checked and normalised; `DialectError` (400) when it is not a request."""

    @abstractmethod
    def upstream_body(self, request: AgentRequest, terms: EngineTerms) -> tuple[dict, list[str]]:
        """The request as the engine gets it and the rewrites made (reported as findings). With ``terms.capture``,
        token capture is forced on (token ids, logprobs, tokens as ids), the served model, the max-tokens cap and the
        session's sampling; without it (passthrough) only the served model and the compatibility rewrites."""

    @abstractmethod
    def call_from_reply(self, data: Any) -> CapturedCall:
        """A whole (non-streamed) engine reply, validated; `DialectError` when anything is off."""

    @abstractmethod
    def open_stream(self, request: AgentRequest) -> DialectStream:
        """The state of one streamed call."""

    @abstractmethod
    def reply(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> dict:
        """A complete reply as the agent's JSON body."""

    @abstractmethod
    def replay(self, request: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> Iterator[bytes]:
        """A complete reply as the agent's SSE stream, end marker included."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict:
        """An error in the agent's own shape (as a JSON body, or inside a stream already under way)."""

    def sse_error(self, status: int, message: str) -> bytes:
        return sse(self.error_body(status, message))

    def request_text(self, request: dict) -> str:
        """The text of a request as a turn records it."""
        return request_text(request)

    def tool_calls(self, message: dict) -> list[dict]:
        """The decoded tool calls of an assistant message as a turn records it."""
        return decoded_tool_calls(message)


def request_text(request: dict) -> str:
    """All the text of a chat request's messages (string contents and text parts), for content checks."""
    out: list[str] = []
    for m in request.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(out)


def decoded_tool_calls(message: dict) -> list[dict]:
    """Tool calls with their JSON-string arguments decoded (left as the raw string where they do not parse)."""
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = args
        out.append({"id": call.get("id"), "name": fn.get("name"), "arguments": parsed})
    return out
