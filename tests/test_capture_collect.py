"""A call the agent wants whole (no streaming: mini-swe-agent's litellm, some side calls of the others) is still asked
of the engine as a stream, read to its end and answered whole (`streaming.collect`), so the stall clock runs for it
as for a streamed call.

The proof that nothing recorded changed: the same calls, in every dialect, to an engine whose ids are deterministic,
once from the engine's whole reply (a session that does not stream through: the path every such call took before)
and once collected from its stream. The turns are the same, field for field (prompt ids, completion ids, logprobs,
finish reason, response message, graph links), but for the request's transport fields (``stream``,
``stream_options``: the request as it was forwarded); the agent's reply is the same whole reply.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import types
import uuid
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from test_dialects import SCRIPTS, request_for, stub_engine

from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.capture.upstream import HttpxUpstream
from swe_gym_env.server.engine import app as engine_module
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import MODEL, PI_TOOLS, engine_app, full_turns

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
PI_VERSION = "0.73.1"  # the recordings' Pi (tests/fixtures/dialects)
TRANSPORT = ("stream", "stream_options")  # what differs, by design, in the request as forwarded
RANDOM = {"id", "created", "created_at", "responseId", "item_id"}  # per reply: made up by the proxy or the engine


class Recorder:
    """An engine app that notes whether each chat request asked for a stream."""

    def __init__(self, app) -> None:
        self.app, self.streams = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.streams.append(bool(json.loads(body).get("stream")))
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def masked(x):
    if isinstance(x, dict):
        return {k: "*" if k in RANDOM and not str(v).startswith("chatcmpl-tool") else masked(v) for k, v in x.items()}
    if isinstance(x, list):
        return [masked(v) for v in x]
    return x


def recorded(turn) -> dict:
    """A turn as recorded, its request's transport fields and its wall time aside."""
    d = turn.model_dump()
    d.pop("wall_s")
    for key in ("request", "params"):
        if d[key] is not None:
            d[key] = {k: v for k, v in d[key].items() if k not in TRANSPORT}
    return d


def builtin_calls() -> list[tuple[str, dict]]:
    """Whole-reply calls in every dialect: chat (a tool call, its follow-up, a reply cut at max_tokens, a side call
    without tools) and Pi's recorded Responses / Messages / Gemini sessions (tools, thinking, length)."""
    task = bundled_tasks()[0]
    chat = {"model": "agent/x", "messages": [{"role": "user", "content": task.problem_statement}], "tools": PI_TOOLS}
    calls = [("/v1/chat/completions", chat), ("/v1/chat/completions", {**chat, "max_tokens": 5})]
    calls.append(("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Title this"}]}))
    for api in ("openai-responses", "anthropic-messages", "google-generative-ai"):
        for scenario in ("tools", "thinking", "length"):
            doc = json.loads((FIXTURES / f"pi-{PI_VERSION}-{api}-{scenario}.json").read_text())
            for call in doc["calls"]:
                path = call["path"].removeprefix("/capture")
                if api == "google-generative-ai":
                    calls.append((path.replace(":streamGenerateContent", ":generateContent"), call["body"]))
                else:
                    calls.append((path, {**call["body"], "stream": False}))
    return calls


async def run_whole(app, calls, *, collected: bool, follow_up: bool = False) -> tuple[list, list, Recorder]:
    """The calls, wanted whole, in one session; (turns, the agent's replies, what the engine was asked)."""
    engine = Recorder(app)
    proxy = CaptureProxy(upstream=HttpxUpstream(client=httpx.AsyncClient(transport=httpx.ASGITransport(app=engine))))
    session, key = proxy.open_session(
        EngineTarget("http://engine/v1", MODEL), max_calls=100, max_tokens=512, sampling={"seed": 3}
    )
    session.stream_through = collected  # False: the engine's whole reply, as every such call was served before
    replies = []
    transport = httpx.ASGITransport(app=proxy.app())
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://capture", headers=headers) as c:
        for path, body in calls:
            r = await c.post(path, json=body)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
            replies.append(r.json())
            if follow_up and path.endswith("/chat/completions") and body.get("tools") and "max_tokens" not in body:
                msg = r.json()["choices"][0]["message"]
                more = [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]
                r = await c.post(path, json={**body, "messages": body["messages"] + more})
                assert r.status_code == 200, r.text
                replies.append(r.json())
    proxy.close_session(session)
    await proxy.aclose()
    return full_turns(session), replies, engine


@pytest.fixture
def engine_ids(monkeypatch):
    """The built-in engine's reply and tool-call ids from a counter; calling it starts the counter again (the same
    calls, the same ids)."""

    def restart() -> None:
        n = itertools.count(1)
        monkeypatch.setattr(engine_module, "uuid", types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(n) << 64)))

    restart()
    return restart


def chat_usage_counts(reply: dict) -> dict:
    """A chat reply with only its usage's token counts (the engine's whole reply adds null `*_details` fields, its
    stream's usage chunk does not)."""
    if reply.get("object") != "chat.completion":
        return reply
    usage = {k: reply["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {**reply, "usage": usage}


async def test_a_call_wanted_whole_records_the_same_turn_collected_from_a_stream(engine_ids):
    calls = builtin_calls()
    before, replies_before, asked_before = await run_whole(engine_app(), calls, collected=False, follow_up=True)
    engine_ids()  # the second run gets the same engine ids as the first
    after, replies_after, asked_after = await run_whole(engine_app(), calls, collected=True, follow_up=True)
    assert asked_before.streams == [False] * len(before) and asked_after.streams == [True] * len(after)
    assert len(before) == len(after) == len(calls) + 1
    assert {t.dialect for t in after} == {"openai-chat", "openai-responses", "anthropic-messages", "gemini"}
    assert {t.finish_reason for t in after} == {"tool_calls", "stop", "length"}
    for b, a in zip(before, after, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids and a.completion_token_ids == b.completion_token_ids
        assert a.logprobs == b.logprobs and a.finish_reason == b.finish_reason  # float for float: the engine's
        assert a.response_message == b.response_message and not a.streamed and not b.streamed
        assert b.request["stream"] is False and a.request["stream"] is True
        assert a.request["stream_options"] == {"include_usage": True}
        assert recorded(a) == recorded(b), a.index
    assert [t.relation for t in after] == [t.relation for t in before] and after[1].relation == "extends"
    # the agent's reply: the same whole reply (its own ids aside)
    assert [masked(chat_usage_counts(r)) for r in replies_after] == [
        masked(chat_usage_counts(r)) for r in replies_before
    ]


async def test_a_chat_call_wanted_whole_gets_a_valid_whole_completion():
    task = bundled_tasks()[0]
    body = {"model": "agent/x", "messages": [{"role": "user", "content": task.problem_statement}], "tools": PI_TOOLS}
    (turn,), (reply,), engine = await run_whole(engine_app(), [("/v1/chat/completions", body)], collected=True)
    assert engine.streams == [True]
    assert reply["object"] == "chat.completion" and reply["model"] == "agent/x" and reply["id"].startswith("chatcmpl-")
    (choice,) = reply["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "tool_calls" == turn.finish_reason
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg == turn.response_message
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"] and call["function"]["name"] == "edit"
    assert json.loads(call["function"]["arguments"])["path"] == "batchtools/chunks.py"
    n, m = len(turn.prompt_token_ids), len(turn.completion_token_ids)
    assert reply["usage"] == {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}
    assert not any(k in json.dumps(reply) for k in ("token_ids", "logprobs", "token_id:"))  # capture stays with us


@pytest.mark.parametrize("dialect", ["openai-chat", "openai-responses", "anthropic-messages", "gemini"])
async def test_every_stop_reason_wanted_whole_is_the_same_from_a_whole_reply_and_a_stream(dialect):
    """The scripted engine of tests/test_dialects.py: reasoning, text, tool calls, every finish reason, a stop
    string."""

    def call_for(case: str) -> tuple[str, dict]:
        if dialect == "openai-chat":
            return "/v1/chat/completions", {"model": "agent-model", "messages": [{"role": "user", "content": case}]}
        return request_for(dialect, case, False)

    calls = [call_for(case) for case in SCRIPTS]
    before, replies_before, _ = await run_whole(stub_engine(lambda t: SCRIPTS[t]), calls, collected=False)
    after, replies_after, engine = await run_whole(stub_engine(lambda t: SCRIPTS[t]), calls, collected=True)
    assert engine.streams == [True] * len(calls)
    assert [recorded(t) for t in after] == [recorded(t) for t in before]
    assert [masked(r) for r in replies_after] == [masked(r) for r in replies_before]
    if dialect != "openai-chat":  # chat answers no reasoning; the translated dialects carry it
        assert after[0].response_message["reasoning"] == "Thinking."


def stalling_engine(after_first_chunk: bool) -> Starlette:
    """Sends the role chunk (with prompt ids) and then nothing, or nothing at all."""

    async def chat(request: Request):
        await request.json()

        async def body():
            if after_first_chunk:
                base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
                first = {**base, "prompt_token_ids": [1], "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
                yield "data: " + json.dumps(first) + "\n\n"
            await asyncio.sleep(30)

        if not after_first_chunk:
            await asyncio.sleep(30)
        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize("dialect", ["openai-chat", "openai-responses", "anthropic-messages", "gemini"])
@pytest.mark.parametrize("after_first_chunk", [True, False])
async def test_a_call_wanted_whole_fails_at_the_stall_timeout_not_the_call_timeout(dialect, after_first_chunk):
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=stalling_engine(after_first_chunk)))
    proxy = CaptureProxy(upstream=HttpxUpstream(client=client))
    session, key = proxy.open_session(
        EngineTarget("http://engine/v1", MODEL), max_calls=5, max_tokens=64, call_timeout_s=60, stall_timeout_s=0.5
    )
    if dialect == "openai-chat":
        path, body = "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    else:
        path, body = request_for(dialect, "hi", False)
    t0 = time.monotonic()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy.app()),
        base_url="http://capture",
        headers={"authorization": f"Bearer {key}"},
    ) as c:
        r = await c.post(path, json=body)
    assert time.monotonic() - t0 < 10
    assert r.status_code == 504 and "stalled: nothing for 0.5s" in r.text, r.text
    assert session.failed == 1 and not session.turns and "stall timeout" in session.errors[0]
    await asyncio.sleep(0)  # the finished pump's done callback
    assert not session.pumps  # nothing of the call is left running
    proxy.close_session(session)
