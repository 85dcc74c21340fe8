"""The capture proxy's translated dialects (OpenAI Responses, Anthropic Messages, Gemini) and Pi on every one of them.

- Requests recorded from the real Pi CLI in each API (tests/fixtures/dialects/, recorded by record_pi.py there, the
  Pi version in each file name) translate deterministically into chat completions, link turn by turn (turn 2's
  prompt extends turn 1's exactly), carry thinking blocks over, and report what they lose; images are refused in
  each dialect's own error shape.
- Replies: every stop reason, streamed and not (the same ids and the same content either way), the first event
  sent before the engine finishes, errors in each dialect's shape, auxiliary calls (token counts, model lists)
  answered and recorded but never turns, black-box sessions, the dialect kept in the export after a restart.
- Pi (real CLI, built-in engine's oracle, the local sandbox) solves a task through the pipeline on each of its four
  APIs: ok, reward 1.0, cross-check `match`, rows == export, every turn in the dialect it spoke.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, compile_path

from swe_gym_env.server.agents.harnesses.pi import PiHarness
from swe_gym_env.server.agents.harnesses.pi_apis import PI_APIS, pi_base_url, pi_provider
from swe_gym_env.server.capture import DIALECTS, CaptureProxy, EngineTarget
from swe_gym_env.server.capture.dialect import DialectRoute
from swe_gym_env.server.capture.dialects.translated import TranslatedDialect
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.capture.upstream import HttpxUpstream
from swe_gym_env.wire import HARNESS_OPTIONS, RolloutRequest, Turn

from helpers import MODEL, Served, Stack, engine_app, full_turns, rows_match_export

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
PI_VERSION = PiHarness.version
TRANSLATED = ["openai-responses", "anthropic-messages", "google-generative-ai"]  # Pi's apis on translated dialects
REASONING = "The issue names the function; I will patch it with the edit tool."  # record_pi.py's injected reasoning
PI_TOOLS = {"read", "bash", "edit", "write"}
LOSSES = {  # what each dialect reports losing on Pi's requests (the rest of what Pi sends carries over)
    "openai-responses": {"parameter prompt_cache_key ignored"},
    "anthropic-messages": {
        "cache_control ignored (the engine does its own prefix caching)",
        "tool field eager_input_streaming ignored",
    },
    "google-generative-ai": set(),
}
THINKING_LOSSES = {
    "openai-responses": {
        "parameter reasoning ignored",
        "parameter include ignored",
        "developer messages sent as system messages",
    },
    "anthropic-messages": {"parameter thinking ignored"},
    "google-generative-ai": {"generationConfig.thinkingConfig ignored"},
}


def fixture(api: str, scenario: str) -> dict:
    return json.loads((FIXTURES / f"pi-{PI_VERSION}-{api}-{scenario}.json").read_text())


def make_proxy(app, store: CaptureStore | None = None) -> CaptureProxy:
    return CaptureProxy(store, upstream=HttpxUpstream(client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app))))


def open_session(proxy: CaptureProxy, **kw):
    kw.setdefault("max_calls", 10)
    kw.setdefault("max_tokens", 4096)
    return proxy.open_session(EngineTarget("http://engine/v1", kw.pop("model", MODEL)), **kw)


def agent(proxy: CaptureProxy, key: str, **headers: str) -> httpx.AsyncClient:
    auth = {"authorization": f"Bearer {key}"} if not headers else headers
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app()), base_url="http://capture", headers=auth)


def path_of(call: dict) -> str:
    return call["path"].removeprefix("/capture") + (f"?{call['query']}" if call["query"] else "")


def route_of(path: str) -> tuple[TranslatedDialect, DialectRoute, dict]:
    """The translated dialect and route serving a recorded path, with its parameters."""
    bare, _, query = path.partition("?")
    for d in DIALECTS.values():
        for r in d.routes:
            if isinstance(d, TranslatedDialect) and (m := compile_path(r.path)[0].match(bare)):
                params = dict(p.split("=", 1) for p in query.split("&") if p) | m.groupdict()
                return d, r, params
    raise AssertionError(f"no translated dialect serves {path}")


async def replay(proxy: CaptureProxy, key: str, calls: list[dict]) -> list[httpx.Response]:
    async with agent(proxy, key) as c:
        return [await c.request(call["method"], path_of(call), json=call["body"]) for call in calls]


async def tokenize(chat: dict) -> list[int]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app("noop")), base_url="http://e") as e:
        return (await e.post("/tokenize", json={"messages": chat["messages"], "tools": chat.get("tools")})).json()[
            "tokens"
        ]


def losses(session) -> set[str]:
    return {
        f.message.split(": ", 1)[1].rsplit(" (", 1)[0]
        for f in session.findings
        if f.code == "rewrite" and ": " in f.message
    }


# --------------------------------------------------------------------------------------------------------------
# Pi's recorded requests


def test_fixtures_were_recorded_from_the_pinned_pi_at_the_paths_pi_apis_configures():
    client_path = {  # what each of Pi's clients appends to its baseUrl
        "openai-completions": "/chat/completions",
        "openai-responses": "/responses",
        "anthropic-messages": "/v1/messages",
        "google-generative-ai": f"/models/{MODEL}:streamGenerateContent",
    }
    for api, tail in client_path.items():
        for scenario in ("tools", "thinking", "image", "length"):
            doc = fixture(api, scenario)
            assert doc["_meta"]["agent"] == f"@mariozechner/pi-coding-agent@{PI_VERSION}"
            assert doc["_meta"]["dialect"] == PI_APIS[api] and doc["calls"]
            assert {c["path"] for c in doc["calls"]} == {pi_base_url(api, "/capture") + tail}, (api, scenario)
            assert all(c["body"].get("stream", True) is True for c in doc["calls"])
    assert fixture("google-generative-ai", "tools")["calls"][0]["query"] == "alt=sse"
    assert set(HARNESS_OPTIONS["pi"]["api"]) == set(PI_APIS)  # wire's allowed values are Pi's apis


@pytest.mark.parametrize("scenario", ["tools", "thinking", "length"])
@pytest.mark.parametrize("api", TRANSLATED)
def test_recorded_requests_translate_deterministically(api, scenario):
    for i, call in enumerate(fixture(api, scenario)["calls"]):
        d, route, params = route_of(path_of(call))
        assert d.name == PI_APIS[api]
        first = d.read_request(json.loads(json.dumps(call["body"])), route, params)
        again = d.read_request(json.loads(json.dumps(call["body"])), route, params)
        assert first.body == again.body and first.state["lost"] == again.state["lost"]
        assert first.stream is True and first.model == MODEL
        msgs = first.body["messages"]
        assert msgs[0]["role"] == "system" and "coding" in msgs[0]["content"]
        assert msgs[1]["role"] == "user" and "chunked()" in msgs[1]["content"]
        assert {t["function"]["name"] for t in first.body["tools"]} == PI_TOOLS
        assert all(t["function"]["parameters"]["type"] == "object" for t in first.body["tools"])
        if i == 1:  # the agent's history: its tool call, the tool's result, paired by id
            (call_msg,) = [m for m in msgs if m.get("tool_calls")]
            (result,) = [m for m in msgs if m["role"] == "tool"]
            assert call_msg["tool_calls"][0]["function"]["name"] == "edit"
            assert json.loads(call_msg["tool_calls"][0]["function"]["arguments"])["path"] == "batchtools/chunks.py"
            assert result["tool_call_id"] == call_msg["tool_calls"][0]["id"]
            assert "Successfully replaced" in result["content"]
            assert call_msg.get("reasoning") == (REASONING if scenario == "thinking" else None)


@pytest.mark.parametrize("scenario", ["tools", "thinking"])
@pytest.mark.parametrize("api", list(PI_APIS))
async def test_recorded_sessions_link_turn_by_turn_in_every_dialect(api, scenario):
    proxy = make_proxy(engine_app())
    session, key = open_session(proxy)
    replies = await replay(proxy, key, fixture(api, scenario)["calls"])
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    proxy.close_session(session)
    first, second = full = full_turns(session)
    assert (second.parent, second.relation) == (0, "extends")  # turn 2's prompt = turn 1's prompt + completion + …
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
    assert {t.dialect for t in session.turns} == {PI_APIS[api]}
    for t in full:  # the engine's own ids for the chat request we sent
        assert t.prompt_token_ids == await tokenize(t.request)
        assert t.request["return_token_ids"] is True and t.request["model"] == MODEL
    if api != "openai-completions":
        expected = LOSSES[api] | (THINKING_LOSSES[api] if scenario == "thinking" else set())
        assert losses(session) == expected
        assert all(f.message.endswith("(2 calls)") for f in session.findings if f.code == "rewrite")


async def test_the_same_conversation_gives_the_same_prompt_ids_in_chat_and_responses():
    """Pi sends Responses the same system prompt, tools and messages as chat: the engine sees the same prompt."""
    ids = {}
    for api in ("openai-completions", "openai-responses"):
        proxy = make_proxy(engine_app())
        session, key = open_session(proxy)
        await replay(proxy, key, fixture(api, "tools")["calls"])
        ids[api] = [t.prompt_token_ids for t in full_turns(session)]
    assert ids["openai-completions"][0] == ids["openai-responses"][0]
    assert len(ids["openai-completions"][1]) == len(ids["openai-responses"][1])


@pytest.mark.parametrize("api", TRANSLATED)
async def test_images_are_refused_in_the_dialects_own_shape(api):
    doc = fixture(api, "image")
    proxy = make_proxy(engine_app())
    session, key = open_session(proxy)
    (r,) = await replay(proxy, key, doc["calls"][:1])
    assert r.status_code == 400 and r.json() == json.loads(doc["calls"][0]["response"])
    assert "images are not supported" in r.text and session.turns == []
    assert any("images are not supported" in e for e in doc["_meta"]["pi_errors"])  # Pi showed it to its user
    shape = {"openai-responses": ("error", "type"), "anthropic-messages": ("error", "type")}
    if api in shape:
        assert r.json()["error"]["type"] == "invalid_request_error"
    else:
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT" and r.json()["error"]["code"] == 400


# --------------------------------------------------------------------------------------------------------------
# replies: a scripted vLLM-shaped engine


def _lp(ids: list[int]) -> dict:
    return {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in ids]}


def stub_engine(reply_for: Callable[[str], dict], gate: threading.Event | None = None) -> Starlette:
    """A vLLM-shaped engine replying what ``reply_for(last user text)`` says: reasoning / content pieces, tool calls
    (name, JSON arguments), a finish reason and stop string; with ``gate``, it holds its stream after one piece."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        key = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        spec = reply_for(key)
        if "status" in spec:
            return JSONResponse({"error": {"message": spec["message"], "code": spec["status"]}}, spec["status"])
        prompt = [1, 2, 3, 10 + len(body["messages"])]
        pieces: list[tuple[dict, list[int]]] = []
        pieces += [({"reasoning": p}, [100 + i]) for i, p in enumerate(spec.get("reasoning", []))]
        pieces += [({"content": p}, [200 + i]) for i, p in enumerate(spec.get("content", []))]
        calls = spec.get("tool_calls", [])
        for i, (name, args) in enumerate(calls):
            head = {
                "index": i,
                "id": f"call_stub_{i}",
                "type": "function",
                "function": {"name": name, "arguments": args[:5]},
            }
            pieces += [
                ({"tool_calls": [head]}, [300 + i]),
                ({"tool_calls": [{"index": i, "function": {"arguments": args[5:]}}]}, [400 + i]),
            ]
        ids = [t for _, ts in pieces for t in ts] + [2]
        finish, stop = spec.get("finish", "tool_calls" if calls else "stop"), spec.get("stop_reason")
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": "".join(spec.get("content", [])) or None}
            msg["reasoning"] = "".join(spec.get("reasoning", [])) or None
            if calls:
                msg["tool_calls"] = [
                    {"id": f"call_stub_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in enumerate(calls)
                ]
            choice = {"index": 0, "message": msg, "finish_reason": finish, "stop_reason": stop, "token_ids": ids}
            return JSONResponse(
                {"id": "x", "prompt_token_ids": prompt, "choices": [{**choice, "logprobs": _lp(ids)}], "usage": usage}
            )

        def chunk(**data) -> str:
            return (
                "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": MODEL, **data}) + "\n\n"
            )

        async def gen():
            yield chunk(prompt_token_ids=prompt, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])
            for k, (delta, ts) in enumerate(pieces):
                if gate is not None and k == 1:
                    await asyncio.to_thread(gate.wait, 30)
                if spec.get("fail_mid_stream") and k == 1:
                    yield "data: " + json.dumps({"error": {"message": "engine fell over", "code": 500}}) + "\n\n"
                    return
                choice = {"index": 0, "delta": delta, "token_ids": ts, "logprobs": _lp(ts), "finish_reason": None}
                yield chunk(choices=[choice])
            end = {"index": 0, "delta": {}, "token_ids": [2], "logprobs": _lp([2]), "finish_reason": finish}
            yield chunk(choices=[{**end, "stop_reason": stop}])
            yield chunk(choices=[], usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


DIALECT_NAMES = ["openai-responses", "anthropic-messages", "gemini"]
BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def request_for(dialect: str, text: str, stream: bool) -> tuple[str, dict]:
    if dialect == "anthropic-messages":
        tools = [{"name": "bash", "description": "Run a command", "input_schema": BASH}]
        messages = [{"role": "user", "content": text}]
        body = {"model": "agent-model", "max_tokens": 64, "stream": stream, "messages": messages, "tools": tools}
        return "/v1/messages", {**body, "stop_sequences": ["END"]}
    if dialect == "openai-responses":
        tools = [{"type": "function", "name": "bash", "description": "Run a command", "parameters": BASH}]
        return "/v1/responses", {"model": "agent-model", "input": text, "stream": stream, "tools": tools}
    decl = {"name": "bash", "description": "Run a command", "parametersJsonSchema": BASH}
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], "tools": [{"functionDeclarations": [decl]}]}
    return f"/v1beta/models/agent-model:{method}", {**body, "generationConfig": {"stopSequences": ["END"]}}


def sse_blocks(text: str) -> list[tuple[str | None, dict]]:
    out = []
    for block in text.split("\n\n"):
        kind, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((kind, data))
    return out


def summary(dialect: str, r: httpx.Response, stream: bool) -> dict:
    """What the agent was told, dialect-neutral: reasoning, text, tool calls, stop, usage."""
    out: dict = {"reasoning": "", "text": "", "calls": []}
    if dialect == "anthropic-messages":
        if stream:
            blocks: list[dict] = []
            for kind, ev in sse_blocks(r.text):
                assert kind == ev["type"]
                if kind == "message_start":
                    usage_in = ev["message"]["usage"]["input_tokens"]
                elif kind == "content_block_start":
                    blocks.append(dict(ev["content_block"], partial=""))
                elif kind == "content_block_delta":
                    d, b = ev["delta"], blocks[ev["index"]]
                    key, value = {
                        "thinking_delta": ("thinking", d.get("thinking")),
                        "text_delta": ("text", d.get("text")),
                        "input_json_delta": ("partial", d.get("partial_json")),
                        "signature_delta": ("signature", d.get("signature")),
                    }[d["type"]]
                    b[key] = b.get(key, "") + value
                elif kind == "message_delta":
                    stop = (ev["delta"]["stop_reason"], ev["delta"]["stop_sequence"])
                    usage = (usage_in, ev["usage"]["output_tokens"])
            for b in blocks:
                if b["type"] == "tool_use":
                    b["input"] = json.loads(b["partial"])
                b.pop("partial")
            msg = {"content": blocks, "stop_reason": stop[0], "stop_sequence": stop[1]}
            msg["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1]}
        else:
            msg = r.json()
        for b in msg["content"]:
            if b["type"] == "thinking":
                assert b["signature"]
                out["reasoning"] += b["thinking"]
            elif b["type"] == "text":
                out["text"] += b["text"]
            else:
                out["calls"].append((b["id"], b["name"], b["input"]))
        out["stop"] = (msg["stop_reason"], msg["stop_sequence"])
        out["usage"] = (msg["usage"]["input_tokens"], msg["usage"]["output_tokens"])
    elif dialect == "openai-responses":
        if stream:
            events = [ev for _, ev in sse_blocks(r.text)]
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[0]["type"] == "response.created" and events[-1]["type"] in (
                "response.completed",
                "response.incomplete",
            )
            resp = events[-1]["response"]
            deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert deltas == "".join(c["text"] for i in resp["output"] if i["type"] == "message" for c in i["content"])
        else:
            resp = r.json()
        for item in resp["output"]:
            if item["type"] == "reasoning":
                out["reasoning"] += "".join(c["text"] for c in item["content"])
            elif item["type"] == "message":
                out["text"] += "".join(c["text"] for c in item["content"])
            else:
                out["calls"].append((item["call_id"], item["name"], json.loads(item["arguments"])))
        out["stop"] = (resp["status"], (resp["incomplete_details"] or {}).get("reason"))
        out["usage"] = (resp["usage"]["input_tokens"], resp["usage"]["output_tokens"])
    else:
        chunks = [ev for _, ev in sse_blocks(r.text)] if stream else [r.json()]
        for ch in chunks:
            for part in ch["candidates"][0]["content"]["parts"]:
                if "functionCall" in part:
                    fc = part["functionCall"]
                    out["calls"].append((fc["id"], fc["name"], fc["args"]))
                elif part.get("thought"):
                    out["reasoning"] += part["text"]
                else:
                    out["text"] += part["text"]
        out["stop"] = chunks[-1]["candidates"][0]["finishReason"]
        meta = chunks[-1]["usageMetadata"]
        out["usage"] = (meta["promptTokenCount"], meta["candidatesTokenCount"])
    return out


SCRIPTS = {
    "stop": {"reasoning": ["Think", "ing."], "content": ["All ", "done."]},
    "length": {"content": ["cut ", "off"], "finish": "length"},
    "tool_calls": {"content": ["Running it."], "tool_calls": [("bash", '{"command": "pytest -q"}')]},
    "content_filter": {"content": ["no"], "finish": "content_filter"},
    "stop_sequence": {"content": ["before the stop"], "stop_reason": "END"},
    "abort": {"content": ["partial"], "finish": "abort"},
}
STOPS = {
    "anthropic-messages": {
        "stop": ("end_turn", None),
        "length": ("max_tokens", None),
        "tool_calls": ("tool_use", None),
        "content_filter": ("refusal", None),
        "stop_sequence": ("stop_sequence", "END"),
        "abort": ("end_turn", None),
    },
    "openai-responses": {
        "stop": ("completed", None),
        "length": ("incomplete", "max_output_tokens"),
        "tool_calls": ("completed", None),
        "content_filter": ("incomplete", "content_filter"),
        "stop_sequence": ("completed", None),
        "abort": ("completed", None),
    },
    "gemini": {
        "stop": "STOP",
        "length": "MAX_TOKENS",
        "tool_calls": "STOP",
        "content_filter": "SAFETY",
        "stop_sequence": "STOP",
        "abort": "OTHER",
    },
}


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
async def test_every_stop_reason_streamed_and_not_gives_the_same_ids_and_content(dialect):
    proxy = make_proxy(stub_engine(lambda text: SCRIPTS[text]))
    session, key = open_session(proxy, max_calls=20)
    async with agent(proxy, key) as c:
        for case, script in SCRIPTS.items():
            told = {}
            for stream in (False, True):
                path, body = request_for(dialect, case, stream)
                r = await c.post(path, json=body)
                assert r.status_code == 200, r.text
                assert r.headers["content-type"].startswith("text/event-stream" if stream else "application/json")
                told[stream] = summary(dialect, r, stream)
            assert told[False] == told[True], case
            assert told[True]["stop"] == STOPS[dialect][case], case
            assert told[True]["text"] == "".join(script.get("content", []))
            assert told[True]["reasoning"] == "".join(script.get("reasoning", []))
            calls = [(f"call_stub_{i}", n, json.loads(a)) for i, (n, a) in enumerate(script.get("tool_calls", []))]
            assert told[True]["calls"] == calls
            plain, streamed = full_turns(session)[-2:]
            assert not plain.streamed and streamed.streamed and streamed.request["stream"] is True
            assert plain.prompt_token_ids == streamed.prompt_token_ids
            assert plain.completion_token_ids == streamed.completion_token_ids and plain.logprobs == streamed.logprobs
            assert plain.response_message == streamed.response_message and plain.finish_reason == streamed.finish_reason
            assert told[True]["usage"] == (len(plain.prompt_token_ids), len(plain.completion_token_ids))
            assert plain.dialect == streamed.dialect == dialect
    proxy.close_session(session)
    assert session.turns[0].response_message["reasoning"] == "Thinking."  # reasoning is part of the turn's record
    answered = {"gemini": "OTHER", "anthropic-messages": "end_turn", "openai-responses": "completed"}[dialect]
    assert f"{dialect}: finish reason abort answered as {answered} (2 calls)" in {f.message for f in session.findings}


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
async def test_the_first_event_reaches_the_agent_before_the_engine_finishes(dialect):
    gate = threading.Event()
    script = {"content": ["hel", "lo"]}
    with Served(stub_engine(lambda _: script, gate)) as engine_url:
        proxy = CaptureProxy()
        session, key = proxy.open_session(EngineTarget(engine_url + "/v1", MODEL), max_calls=5, max_tokens=64)
        with Served(proxy.app()) as url:
            path, body = request_for(dialect, "go", True)
            headers = {"authorization": f"Bearer {key}"}
            async with (
                httpx.AsyncClient(timeout=30) as c,
                c.stream("POST", url + path, json=body, headers=headers) as r,
            ):
                pieces, got = r.aiter_bytes(), b""
                while b"hel" not in got:
                    got += await pieces.__anext__()
                assert not gate.is_set() and session.turns == []  # the text arrived while the engine still works
                gate.set()
                async for piece in pieces:
                    got += piece
        await proxy.aclose()
    assert len(session.turns) == 1 and session.turns[0].response_message["content"] == "hello"
    assert summary(dialect, httpx.Response(200, content=got), True)["text"] == "hello"


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
async def test_errors_come_back_in_each_dialects_own_shape(dialect):
    def reply(text: str) -> dict:
        if text == "fail":
            return {"content": ["a", "b"], "fail_mid_stream": True}
        return {"status": 404, "message": "The model `x` does not exist."}

    def shape(r: httpx.Response, status: int, text: str) -> None:
        assert r.status_code == status, r.text
        body = r.json()
        if dialect == "anthropic-messages":
            assert (
                body["type"] == "error"
                and set(body["error"]) == {"type", "message"}
                and text in body["error"]["message"]
            )
        elif dialect == "openai-responses":
            assert set(body["error"]) == {"message", "type", "param", "code"} and text in body["error"]["message"]
        else:
            assert set(body["error"]) == {"code", "message", "status"} and body["error"]["code"] == status
            assert text in body["error"]["message"]

    proxy = make_proxy(stub_engine(reply))
    session, key = open_session(proxy)
    path, body = request_for(dialect, "x", False)
    async with agent(proxy, "sgk-wrong") as c:
        shape(await c.post(path, json=body), 401, "unknown or closed capture key")
    async with agent(proxy, key) as c:
        shape(await c.post(path, json=body), 404, "does not exist")
        shape(await c.post(path, content=b"{not json"), 400, "not valid JSON")
        shape(await c.post(path, json={"nothing": 1}), 400, "required")
        path_s, body_s = request_for(dialect, "fail", True)
        r = await c.post(path_s, json=body_s)
    assert r.status_code == 200  # the stream had started: the error comes as the dialect's error event
    kind, last = sse_blocks(r.text)[-1]
    if dialect == "anthropic-messages":
        assert kind == "error" and last["error"]["type"] == "api_error" and "fell over" in last["error"]["message"]
    elif dialect == "openai-responses":
        assert kind == "error" and last["type"] == "error" and "fell over" in last["message"]
    else:
        assert last["error"]["status"] == "UNAVAILABLE" and "fell over" in last["error"]["message"]
    assert session.turns == [] and session.failed == 2


async def test_responses_refuses_previous_response_id_and_reports_hosted_tools():
    proxy = make_proxy(engine_app("noop"))
    session, key = open_session(proxy)
    tools = [{"type": "web_search"}, {"type": "custom", "name": "apply_patch", "description": "patch"}]
    async with agent(proxy, key) as c:
        r = await c.post("/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": "resp_1"})
        ok = await c.post("/v1/responses", json={"model": "m", "input": "hi", "tools": tools, "store": True})
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["output"][0]["content"][0]["text"] == "done"
    proxy.close_session(session)
    assert losses(session) == {
        "tool type web_search dropped",
        "custom tools offered as functions with one string parameter `input`",
        "store ignored (responses are not stored)",
    }
    assert [t["function"]["name"] for t in full_turns(session)[0].request["tools"]] == ["apply_patch"]


# --------------------------------------------------------------------------------------------------------------
# auxiliary calls, black-box sessions, the export


async def test_aux_calls_are_answered_and_recorded_but_never_turns():
    proxy = make_proxy(engine_app("noop"))
    session, key = open_session(proxy)
    doc = fixture("anthropic-messages", "tools")["calls"][0]["body"]
    gem = fixture("google-generative-ai", "tools")["calls"][0]["body"]
    resp = fixture("openai-responses", "tools")["calls"][0]["body"]
    async with agent(proxy, key) as c:
        counted = (
            await c.post("/v1/messages/count_tokens", json={k: v for k, v in doc.items() if k != "stream"})
        ).json()
        g = await c.post(
            f"/v1beta/models/{MODEL}:countTokens", json=gem, headers={"authorization": "", "x-goog-api-key": key}
        )
        i = (await c.post("/v1/responses/input_tokens", json=resp)).json()
        models = (await c.get("/v1/models")).json()
        one = (await c.get("/v1/models/claude-whatever")).json()
        gmodels = (await c.get("/v1beta/models", headers={"authorization": "", "x-goog-api-key": key})).json()
        denied = await c.get("/v1beta/models", headers={"authorization": "", "x-goog-api-key": "sgk-wrong"})
        assert session.turns == [] and session.calls == 0  # none of them is a model call
        for path, body in (
            ("/v1/messages", doc),
            (f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", gem),
            ("/v1/responses", resp),
        ):
            assert (await c.post(path, json=body)).status_code == 200
    proxy.close_session(session)
    anthropic, gemini, responses = (t.prompt_len for t in session.turns)
    assert counted == {"input_tokens": anthropic} and g.json() == {"totalTokens": gemini}
    assert i == {"object": "response.input_tokens", "input_tokens": responses}
    assert (
        [m["id"] for m in models["data"]] == [MODEL] and models["object"] == "list" and one["id"] == "claude-whatever"
    )
    assert [m["name"] for m in gmodels["models"]] == [f"models/{MODEL}"] and denied.status_code == 401
    assert denied.json()["error"]["status"] == "UNAUTHENTICATED"
    aux = sorted(f.message for f in session.findings if f.code == "aux_call")
    tokenized = "answered with the engine's /tokenize of the translated request; not a turn (1 calls)"
    assert aux == [
        "GET /v1/models/{model:path}: answered by the proxy; not a turn (1 calls)",
        "GET /v1/models: answered by the proxy; not a turn (1 calls)",
        "GET /v1beta/models: answered by the proxy; not a turn (1 calls)",
        f"POST /v1/messages/count_tokens: {tokenized}",
        f"POST /v1/responses/input_tokens: {tokenized}",
        f"POST /v1beta/models/{{model:path}}:countTokens: {tokenized}",
    ]


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
async def test_black_box_sessions_translate_without_capturing(dialect):
    proxy = make_proxy(stub_engine(lambda _: SCRIPTS["tool_calls"]))
    session, key = open_session(proxy, passthrough=True)
    async with agent(proxy, key) as c:
        told = []
        for stream in (False, True):
            path, body = request_for(dialect, "tool_calls", stream)
            r = await c.post(path, json=body)
            assert r.status_code == 200, r.text
            told.append(summary(dialect, r, stream))
    proxy.close_session(session)
    assert told[0] == told[1] and told[0]["calls"] == [("call_stub_0", "bash", {"command": "pytest -q"})]
    assert session.turns == [] and session.calls == 2 and session.failed == 0


async def test_the_export_keeps_each_turns_dialect_across_a_restart(tmp_path):
    store = CaptureStore(tmp_path / "c.sqlite")
    proxy = make_proxy(engine_app(), store)
    session, key = open_session(proxy)
    await replay(proxy, key, fixture("anthropic-messages", "tools")["calls"])
    await replay(proxy, key, fixture("google-generative-ai", "tools")["calls"][:1])
    proxy.close_session(session)
    live = proxy.export(session.id)
    again = CaptureProxy(CaptureStore(tmp_path / "c.sqlite")).export(session.id)
    assert live == again
    assert [t["dialect"] for t in again["turns"]] == ["anthropic-messages", "anthropic-messages", "gemini"]
    second = full_turns([Turn.model_validate(t) for t in again["turns"]])[1]  # the export's turns are compact
    assert second.request is not None and second.request["messages"][2]["tool_calls"][0]["function"]["name"] == "edit"


def test_harness_options_are_validated_and_pi_gets_a_provider_per_api():
    assert RolloutRequest(harness_options={"api": "google-generative-ai"}).harness_options == {
        "api": "google-generative-ai"
    }
    for bad in ({"api": "gemini"}, {"model": "x"}):
        with pytest.raises(ValueError):
            RolloutRequest(harness_options=bad)
    with pytest.raises(ValueError, match="has no option"):
        RolloutRequest(harness="opencode", harness_options={"api": "anthropic-messages"})
    base = "http://127.0.0.1:9/capture"
    urls = {api: pi_provider(api, base, "K", "m", 8192, 512)["baseUrl"] for api in PI_APIS}
    assert urls == {
        "openai-completions": f"{base}/v1",
        "openai-responses": f"{base}/v1",
        "anthropic-messages": base,
        "google-generative-ai": f"{base}/v1beta",
    }
    assert "compat" in pi_provider("openai-completions", base, "K", "m", 8192, 512)
    assert "compat" not in pi_provider("anthropic-messages", base, "K", "m", 8192, 512)


async def test_info_lists_the_dialects_and_their_routes():
    from swe_gym_env.commands.info import gather_info

    info = await gather_info(None)
    assert list(info["dialects"]) == ["openai-chat", "openai-responses", "anthropic-messages", "gemini"]
    assert "POST /capture/v1/messages/count_tokens (aux)" in info["dialects"]["anthropic-messages"]


# --------------------------------------------------------------------------------------------------------------
# Pi on each of its APIs, through the pipeline (real CLI, built-in engine, local sandbox)


@pytest.fixture(scope="module")
def oracle_stack():
    s = Stack("oracle")
    yield s
    s.stop()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
@pytest.mark.parametrize("api", list(PI_APIS))
async def test_pi_solves_a_task_on_each_api(oracle_stack, api):
    from fastmcp import Client

    from swe_gym_env.client.mcp_client import SweGymClient

    async with SweGymClient(oracle_stack.mcp_url) as c:
        result = await c.run_rollout(harness="pi", harness_options={"api": api})
    assert result.ok, result.error
    assert result.reward == 1.0 and result.grading.resolution == "RESOLVED_FULL"
    assert result.cross_check == "match", result.cross_check_detail
    assert len(result.turns) >= 2 and {t.dialect for t in result.turns} == {PI_APIS[api]}
    assert all(t.relation == "extends" for t in result.turns[1:])  # one conversation, linked turn by turn
    assert [s.turns for s in result.sequences if not s.discarded] == [[t.index for t in result.turns]]
    await rows_match_export(oracle_stack, result)
    if api == "anthropic-messages":
        async with Client(oracle_stack.mcp_url) as mcp:
            caps = (await mcp.call_tool("capabilities", {})).structured_content
        assert caps["dialects"] == list(DIALECTS)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_pi_on_responses_survives_a_reply_cut_at_max_tokens(oracle_stack):
    """The Responses API ends a cut reply with `response.incomplete`, which Pi's client ignores (it then reports no
    usage): the cross-check takes that as unreported, not as a disagreement."""
    from swe_gym_env.client.mcp_client import SweGymClient

    async with SweGymClient(oracle_stack.mcp_url) as c:
        result = await c.run_rollout(harness="pi", harness_options={"api": "openai-responses"}, max_tokens=24)
    assert result.ok, result.error
    assert [t.finish_reason for t in result.turns] == ["length"] and result.turns[0].dialect == "openai-responses"
    assert result.cross_check == "match", result.cross_check_detail
