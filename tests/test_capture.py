"""The capture proxy against the built-in engine (in process) and hostile stub engines, over real HTTP where
streaming matters (httpx's ASGI transport buffers whole responses)."""

import asyncio
import contextlib
import json
import threading
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route

from swe_gym_env.server.capture import DIALECTS, CaptureProxy, EngineTarget, request_text
from swe_gym_env.server.capture.dialect import AgentRequest, DialectError, DialectRoute
from swe_gym_env.server.capture.dialects.openai_chat import ChatDialect
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.capture.upstream import HttpxUpstream
from swe_gym_env.tasks.catalog import bundled_tasks
from swe_gym_env.wire import Turn

from helpers import MODEL, PI_TOOLS, Served, engine_app, full_turns, sse_events

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]


def make_proxy(app, store: CaptureStore | None = None, dialects=None) -> CaptureProxy:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    return CaptureProxy(store, upstream=HttpxUpstream(client=client), dialects=dialects)


def agent(proxy: CaptureProxy, key: str | None, admin: bool = False, headers: dict | None = None) -> httpx.AsyncClient:
    h = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy.app(admin=admin)),
        base_url="http://capture",
        headers={**h, **(headers or {})},
    )


def agent_request(**extra):
    task = bundled_tasks()[0]
    return {
        "model": "whatever/the-agent-says",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [{"type": "text", "text": task.problem_statement}]}],
        "tools": PI_TOOLS,
        **extra,
    }


def open_session(proxy: CaptureProxy, **kw):
    kw.setdefault("max_calls", 5)
    kw.setdefault("max_tokens", 512)
    return proxy.open_session(EngineTarget("http://engine/v1", MODEL), **kw)


async def test_unknown_and_closed_keys_get_401():
    proxy = make_proxy(engine_app())
    session, key = open_session(proxy)
    async with agent(proxy, "sgk-wrong") as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    async with agent(proxy, None) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    async with agent(proxy, None, headers={"x-api-key": key}) as c:  # the Anthropic-style header works too
        assert (await c.post("/v1/chat/completions", json=agent_request(stream=False))).status_code == 200
    proxy.close_session(session)
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    assert len(session.turns) == 1


async def test_stream_through_equals_non_stream_and_prompt_ids_equal_tokenize():
    proxy = make_proxy(engine_app())
    session, key = open_session(proxy)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
        plain = await c.post("/v1/chat/completions", json=agent_request(stream=False))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] > 0
    assert all("token_ids" not in ch and "logprobs" not in ch for e in events[:-1] for ch in e["choices"])
    assert all("prompt_token_ids" not in e and e["model"] == "whatever/the-agent-says" for e in events[:-1])
    args = "".join(
        tc["function"].get("arguments", "")
        for e in events[:-1]
        for ch in e["choices"]
        for tc in ch["delta"].get("tool_calls", [])
    )
    assert '"path": "batchtools/chunks.py"' in args
    streamed, whole = full_turns(session)
    assert streamed.streamed and streamed.request["stream"] is True  # streamed through, not replayed
    assert not whole.streamed and whole.request["stream"] is True  # wanted whole, collected from the engine's stream
    assert streamed.request["model"] == MODEL  # the agent's model name is rewritten
    assert streamed.prompt_token_ids == whole.prompt_token_ids
    assert streamed.completion_token_ids == whole.completion_token_ids and streamed.logprobs == whole.logprobs
    assert streamed.response_message["tool_calls"][0]["function"]["arguments"] == args
    assert len(streamed.completion_token_ids) == len(streamed.logprobs) > 0
    assert plain.json()["choices"][0]["message"]["tool_calls"] == whole.response_message["tool_calls"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app()), base_url="http://e") as e:
        tok = await e.post("/tokenize", json={"messages": whole.request["messages"], "tools": whole.request["tools"]})
    assert tok.json()["tokens"] == whole.prompt_token_ids
    assert whole.relation == "root" and whole.retry_of == 0 and whole.parent is None  # a resample of a root


def gated_engine(gate: threading.Event) -> Starlette:
    """Streams a vLLM-shaped reply, but holds everything after the first chunk until ``gate`` is set."""

    async def chat(request):
        await request.json()

        async def gen():
            base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            first = {**base, "prompt_token_ids": [1, 2, 3]}
            first["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}]
            yield "data: " + json.dumps(first) + "\n\n"
            await asyncio.to_thread(gate.wait, 30)
            lp = {"content": [{"token": "token_id:7", "logprob": -0.5}]}
            body = {"index": 0, "delta": {"content": "hi"}, "token_ids": [7], "logprobs": lp, "finish_reason": None}
            yield "data: " + json.dumps({**base, "choices": [body]}) + "\n\n"
            lp = {"content": [{"token": "token_id:2", "logprob": -0.25}]}
            end = {"index": 0, "delta": {}, "token_ids": [2], "logprobs": lp, "finish_reason": "stop"}
            yield "data: " + json.dumps({**base, "choices": [end]}) + "\n\n"
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            yield "data: " + json.dumps({**base, "choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def test_first_chunk_arrives_before_the_engine_finishes_and_the_end_waits_for_the_store(tmp_path):
    gate = threading.Event()
    with Served(gated_engine(gate)) as engine_url:
        store = CaptureStore(tmp_path / "c.sqlite")
        proxy = CaptureProxy(store)
        session, key = proxy.open_session(EngineTarget(engine_url + "/v1", MODEL), max_calls=5, max_tokens=64)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            yield
            await proxy.aclose()  # in the server's own loop, where its client lives

        with Served(Starlette(routes=[Mount("/", proxy.app())], lifespan=lifespan)) as proxy_url:
            async with (
                httpx.AsyncClient(base_url=proxy_url, headers={"authorization": f"Bearer {key}"}) as c,
                c.stream("POST", "/v1/chat/completions", json=agent_request()) as r,
            ):
                lines = r.aiter_lines()
                first = await anext(lines)
                # the agent has its first chunk while the engine still holds the rest back
                assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
                assert session.turns == []
                gate.set()
                rest = [line async for line in lines if line]
            assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["usage"]["completion_tokens"] == 2
            (turn,) = full_turns(session)
            assert turn.prompt_token_ids == [1, 2, 3] and turn.completion_token_ids == [7, 2]
            assert turn.logprobs == [-0.5, -0.25]
            assert store.load_session(session.id)["calls"][0]["completion_token_ids"] == [7, 2]


class FailingStore(CaptureStore):
    def add_call(self, *a, **kw):
        raise OSError("disk full")


async def test_a_call_that_cannot_be_stored_is_never_answered_as_a_success(tmp_path):
    proxy = make_proxy(engine_app(), FailingStore(tmp_path / "c.sqlite"))
    session, key = open_session(proxy)
    async with agent(proxy, key) as c:
        plain = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        streamed = await c.post("/v1/chat/completions", json=agent_request())
    assert plain.status_code == 500 and "could not persist" in plain.json()["error"]["message"]
    events = sse_events(streamed.text)
    # the finish chunk and [DONE] were held back: the agent sees an error, not a completed reply
    assert "[DONE]" not in events and "could not persist" in events[-1]["error"]["message"]
    assert not any(ch.get("finish_reason") for e in events[:-1] for ch in e["choices"])
    assert session.turns == [] and len(session.errors) == 2


async def test_budget_exhausted_reply_is_not_a_turn():
    proxy = make_proxy(engine_app("noop"))
    session, key = open_session(proxy, max_calls=1, max_tokens=64)
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request(stream=False))).status_code == 200
        r = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        s = await c.post("/v1/chat/completions", json=agent_request())
    assert r.json()["choices"][0]["finish_reason"] == "stop" and sse_events(s.text)[-1] == "[DONE]"
    assert len(session.turns) == 1 and session.stop_reason == "budget_exhausted" and session.budget_replies == 2


def bad_engine(kind: str) -> Starlette:
    async def chat(request):
        if (await request.json()).get("stream") and kind in ("no-ids", "usage", "misaligned"):
            return StreamingResponse(bad_stream(kind), media_type="text/event-stream")
        if kind == "html":
            return HTMLResponse("<html>gateway</html>")
        if kind == "500":
            return JSONResponse({"error": "boom"}, 500)
        if kind == "usage":
            lp = {"content": [{"token": "token_id:5", "logprob": -1.0}]}
            return JSONResponse(
                {
                    "prompt_token_ids": [1, 2],
                    "usage": {"completion_tokens": 3},
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [5], "logprobs": lp}],
                }
            )
        if kind == "misaligned":
            lp = {"content": [{"token": "token_id:6", "logprob": -1.0}]}
            return JSONResponse({"prompt_token_ids": [1], "choices": [{"index": 0, "token_ids": [5], "logprobs": lp}]})
        return JSONResponse(
            {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def bad_stream(kind: str):
    base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    head = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    yield "data: " + json.dumps({**base, "choices": [head], **({} if kind == "no-ids" else {"prompt_token_ids": [1]})})
    yield "\n\n"
    tid = 6 if kind == "misaligned" else 5
    lp = {"content": [{"token": f"token_id:{tid}", "logprob": -1.0}]}
    end = {"index": 0, "delta": {"content": "x"}, "token_ids": [5], "logprobs": lp, "finish_reason": "stop"}
    yield "data: " + json.dumps({**base, "choices": [end]}) + "\n\n"
    yield "data: " + json.dumps({**base, "choices": [], "usage": {"completion_tokens": 3 if kind == "usage" else 1}})
    yield "\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    "kind,needle",
    [
        ("no-ids", "no prompt_token_ids"),
        ("html", "not JSON"),
        ("500", "HTTP 500"),
        ("usage", "reports 3 completion tokens"),
        ("misaligned", "does not name token 5"),
    ],
)
@pytest.mark.parametrize("how", ["whole", "collected", "streamed"])
async def test_engine_garbage_is_an_error_never_a_silent_success(kind, needle, how):
    """Streamed through, wanted whole (collected from the engine's stream), and whole from the engine (a session
    that does not stream through)."""
    proxy = make_proxy(bad_engine(kind))
    session, key = open_session(proxy, max_tokens=64)
    session.stream_through = how != "whole"
    stream = how == "streamed"
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request(stream=stream))
    if how != "whole" and kind == "html":
        needle = "with text/html; charset=utf-8, not a stream"
    if stream and kind in ("usage", "misaligned"):  # found at the end of a stream already under way
        events = sse_events(r.text)
        assert "[DONE]" not in events and needle in events[-1]["error"]["message"]
        assert not any(ch.get("finish_reason") for e in events[:-1] for ch in e["choices"])
    else:  # found before anything reached the agent: a plain HTTP error
        assert r.status_code == 502 and needle in r.json()["error"]["message"], r.text
    assert session.turns == [] and needle in session.errors[0]


async def test_unreachable_engine_is_reported():
    proxy = CaptureProxy()
    session, key = proxy.open_session(EngineTarget("http://127.0.0.1:9/v1", MODEL), max_calls=5, max_tokens=64)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
    await proxy.aclose()
    assert r.status_code == 502 and "unreachable" in session.errors[0]


async def test_rewrites_are_reported_as_findings():
    proxy = make_proxy(engine_app("noop"))
    session, key = open_session(proxy)
    tools = json.loads(json.dumps(PI_TOOLS))
    tools[0]["function"]["parameters"]["$schema"] = "http://json-schema.org/draft-07/schema#"
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request(tools=[], stream=False))).status_code == 200
        assert (await c.post("/v1/chat/completions", json=agent_request(tools=tools))).status_code == 200
    first, second = full_turns(session)
    assert "tools" not in first.request and "$schema" not in json.dumps(second.request)
    proxy.close_session(session)
    codes = {(f.code, f.message.split(" (")[0]) for f in session.findings}
    assert ("rewrite", "removed an empty tools array") in codes
    assert ("rewrite", "removed $schema keys from tool parameters") in codes


async def test_passthrough_forwards_unchanged_and_captures_nothing():
    seen: list[dict] = []

    async def chat(request):
        seen.append(await request.json())
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})

    proxy = make_proxy(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    session, key = open_session(proxy, passthrough=True)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request(stream=False))
    assert r.json()["choices"][0]["message"]["content"] == "ok"
    assert seen[0]["model"] == MODEL and "return_token_ids" not in seen[0] and "logprobs" not in seen[0]
    assert session.calls == 1 and session.turns == []
    proxy.close_session(session)
    assert not [f for f in session.findings if f.severity == "fatal"]


async def test_no_calls_is_a_fatal_finding():
    proxy = make_proxy(engine_app())
    session, _ = open_session(proxy)
    proxy.close_session(session)
    assert [f.code for f in session.findings if f.severity == "fatal"] == ["no_model_calls"]


async def test_session_is_durable_and_reads_back_after_a_restart(tmp_path):
    path = tmp_path / "capture.sqlite"
    proxy = make_proxy(engine_app(), CaptureStore(path))
    session, key = open_session(proxy, session_id="rollout-abc", sampling={"seed": 3})
    async with agent(proxy, key) as c:
        first = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        msg = first.json()["choices"][0]["message"]
        follow = agent_request(stream=False)
        follow["messages"] += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]
        assert (await c.post("/v1/chat/completions", json=follow)).status_code == 200
    # the server dies here: the session was never closed (and its store's owner lock goes with the process)
    proxy.store.owner.release()
    restarted = CaptureStore(path)
    assert restarted.abandon_open() == ["rollout-abc"]
    data = restarted.load_session("rollout-abc")
    assert data["state"] == "abandoned" and data["meta"]["sampling"] == {"seed": 3}
    assert "api_key" not in json.dumps(data["meta"])
    full = full_turns(session)
    assert len(data["calls"]) == len(full) == 2
    assert [c["completion_token_ids"] for c in data["calls"]] == [t.completion_token_ids for t in full]
    assert [c["logprobs"] for c in data["calls"]] == [t.logprobs for t in full]  # float64: the engine's values
    assert session.turns[1].parent == 0 and session.turns[1].relation in ("extends", "drift")
    tokens = sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for t in full)
    assert restarted.stored_bytes("rollout-abc") <= 10 * tokens
    doc = CaptureProxy(restarted).export("rollout-abc")
    assert [t["parent"] for t in doc["turns"]] == [None, 0] and doc["provenance"]["seed"] == 3
    assert doc["turns"] == proxy.export("rollout-abc")["turns"]  # rebuilt from the store: the same compact turns
    assert [t.prompt_token_ids for t in full_turns([Turn(**t) for t in doc["turns"]])] == [
        t.prompt_token_ids for t in full
    ]
    assert [t.request for t in full_turns([Turn(**t) for t in doc["turns"]])] == [t.request for t in full]
    assert doc["sequences"] and all(len(s["token_ids"]) == len(s["loss_mask"]) for s in doc["sequences"])


async def test_export_after_a_restart_is_the_same_document(tmp_path):
    """Roles, relations, retries, discards and the cross-check's demotions survive the server."""
    path = tmp_path / "capture.sqlite"
    proxy = make_proxy(engine_app(), CaptureStore(path))
    session, key = open_session(proxy, session_id="rollout-live")
    async with agent(proxy, key) as c:
        first = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        msg = first.json()["choices"][0]["message"]
        follow = agent_request(stream=False)
        follow["messages"] += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]
        for _ in range(3):  # call 2 retries call 1, call 3 retries call 2
            assert (await c.post("/v1/chat/completions", json=follow)).status_code == 200
        aux = {"model": "m", "messages": [{"role": "user", "content": "Title this chat in 3 words."}]}  # no tools
        assert (await c.post("/v1/chat/completions", json=aux)).status_code == 200
    session.demoted.add(0)  # as the cross-check would: the agent never used call 0
    proxy.close_session(session)
    live = proxy.export("rollout-live")
    assert [(t["retry_of"], t["discarded"], t["role"]) for t in live["turns"]] == [
        (None, True, "agent"),
        (None, True, "agent"),
        (1, True, "agent"),
        (2, True, "agent"),  # below the demoted call 0
        (None, False, "aux"),
    ]
    restarted = CaptureProxy(CaptureStore(path)).export("rollout-live")
    assert restarted == live


async def test_failed_calls_do_not_use_the_budget_and_a_run_of_them_stops_the_session():
    proxy = make_proxy(bad_engine("500"))
    session, key = open_session(proxy, max_calls=2, max_consecutive_failures=3)
    async with agent(proxy, key) as c:
        codes = [(await c.post("/v1/chat/completions", json=agent_request(stream=False))).status_code for _ in range(4)]
    assert codes == [502, 502, 502, 503]  # the 4th is refused at once: the session gave up on its engine
    assert session.failed == 3 and session.stop_reason == "engine_failures" and session.budget_replies == 0
    proxy.close_session(session)
    assert [f.code for f in session.findings].count("engine_failure") == 3


async def test_failures_followed_by_a_success_reset_the_run_and_keep_the_budget():
    calls = {"n": 0}
    honest = engine_app("noop")

    async def flaky(scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            calls["n"] += 1
            if calls["n"] <= 2:
                await JSONResponse({"error": "boom"}, 500)(scope, receive, send)
                return
        await honest(scope, receive, send)

    proxy = make_proxy(flaky)
    session, key = open_session(proxy, max_calls=1, max_consecutive_failures=3)
    async with agent(proxy, key) as c:
        codes = [(await c.post("/v1/chat/completions", json=agent_request(stream=False))).status_code for _ in range(3)]
    assert codes == [502, 502, 200]  # two failures did not use the one-call budget
    assert session.consecutive_failures == 0 and session.failed == 2 and len(session.turns) == 1


async def test_an_engine_that_stops_returning_ids_is_fatal():
    proxy = make_proxy(bad_engine("no-ids"))
    session, key = open_session(proxy)
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 502
    assert [f.code for f in session.findings if f.severity == "fatal"] == ["engine_stopped_ids"]


async def test_a_stream_that_stalls_ends_its_call_at_the_stall_timeout():
    async def stalling(request):
        async def body():
            base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            yield "data: " + json.dumps({**base, "prompt_token_ids": [1], "choices": [{"index": 0, "delta": {}}]})
            yield "\n\n"
            await asyncio.sleep(30)

        return StreamingResponse(body(), media_type="text/event-stream")

    proxy = make_proxy(Starlette(routes=[Route("/v1/chat/completions", stalling, methods=["POST"])]))
    session, key = open_session(proxy, stall_timeout_s=0.5)
    t0 = time.monotonic()
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
    assert time.monotonic() - t0 < 10
    assert "stalled: nothing for 0.5s" in r.text and "[DONE]" not in r.text
    assert session.failed == 1 and not session.turns


async def test_admin_api_needs_the_admin_key_and_pushes_calls(monkeypatch):
    monkeypatch.setenv("SWE_GYM_ADMIN_KEY", "adm-secret")
    proxy = make_proxy(engine_app())
    async with agent(proxy, None, admin=True) as c:
        assert (await c.get("/sessions")).status_code == 401
        spec = {"engine_url": "http://engine/v1", "served_model": MODEL, "engine_api_key": "sk-upstream"}
        assert (await c.post("/sessions", json=spec)).status_code == 401
        c.headers["authorization"] = "Bearer adm-secret"
        made = (await c.post("/sessions", json=spec)).json()
        sid, key = made["id"], made["key"]
        listing = await c.get("/sessions")
        assert sid in [s["id"] for s in listing.json()["sessions"]] and "sk-upstream" not in listing.text
        assert key not in listing.text
        session = proxy.get_session(sid)
        queue: asyncio.Queue = asyncio.Queue()
        session.subscribers.append(queue)
    async with agent(proxy, key) as a:
        assert (await a.post("/v1/chat/completions", json=agent_request(stream=False))).status_code == 200
    event = queue.get_nowait()
    assert event["type"] == "turn" and event["index"] == 0 and event["completion_tokens"] > 0
    async with agent(proxy, "adm-secret", admin=True) as c:
        detail = (await c.get(f"/sessions/{sid}")).json()
        assert detail["turns"] == 1 and detail["calls"][0]["prompt_tokens"] > 0
        assert (await c.delete(f"/sessions/{sid}")).json()["state"] == "closed"
        doc = (await c.get(f"/sessions/{sid}/export")).json()
        assert doc["turns"][0]["tool_calls"][0]["name"] == "edit" and doc["turns"][0]["role"] == "agent"
        assert "sk-upstream" not in json.dumps(doc)
    async with agent(proxy, key) as a:  # closed: the key is dead
        assert (await a.post("/v1/chat/completions", json=agent_request(stream=False))).status_code == 401


async def test_agent_facing_app_serves_no_admin_routes():
    proxy = make_proxy(engine_app())
    async with agent(proxy, None) as c:
        assert (await c.get("/sessions")).status_code == 404


@pytest.mark.parametrize("whole", [False, True])
async def test_closing_a_session_cancels_its_hung_upstream_calls(whole):
    release = asyncio.Event()

    async def hung(request):
        await release.wait()
        return JSONResponse({})

    proxy = make_proxy(Starlette(routes=[Route("/v1/chat/completions", hung, methods=["POST"])]))
    session, key = open_session(proxy)
    session.stream_through = not whole  # whole: one upstream POST; else the stream a whole reply is collected from
    async with agent(proxy, key) as c:
        call = asyncio.create_task(c.post("/v1/chat/completions", json=agent_request(stream=False)))
        for _ in range(100):
            if session.pumps:
                break
            await asyncio.sleep(0.01)
        assert len(session.pumps) == 1
        proxy.close_session(session)
        r = await asyncio.wait_for(call, 5)
    release.set()
    assert r.status_code == (502 if whole else 409) and "closed during this call" in r.json()["error"]["message"]
    assert not session.pumps and session.turns == []


class ToyDialect(ChatDialect):
    """A toy API on chat completions: ``{"prompt": ...}`` in, ``{"text": ..., "finish": ...}`` out."""

    name = "toy"
    routes = (DialectRoute("/v1/toy/complete", ("POST",)),)

    def parse_request(self, body) -> AgentRequest:
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise DialectError(400, "a toy request needs a prompt")
        chat = {"messages": [{"role": "user", "content": body["prompt"]}]}
        return AgentRequest(chat, stream=False, include_usage=False, model=None)

    def reply(self, request, message, finish, usage) -> dict:
        return {"text": message["content"], "finish": finish}

    def error_body(self, status, message) -> dict:
        return {"toy_error": message, "status": status}


async def test_agent_routes_come_from_the_dialect_registry():
    default = make_proxy(engine_app("noop"))
    assert [r.path for r in default.app().routes] == [r.path for d in DIALECTS.values() for r in d.routes]
    proxy = make_proxy(engine_app("noop"), dialects={**DIALECTS, "toy": ToyDialect()})
    assert {r.path for r in proxy.app().routes} == {r.path for d in DIALECTS.values() for r in d.routes} | {
        "/v1/toy/complete"
    }
    with pytest.raises(ValueError, match="both serve POST /v1/chat/completions"):
        CaptureProxy(dialects={**DIALECTS, "twin": ChatDialect()})
    session, key = open_session(proxy)
    async with agent(proxy, key) as c:
        toy = await c.post("/v1/toy/complete", json={"prompt": "say done"})
        bad = await c.post("/v1/toy/complete", json={"messages": []})
        chat = await c.post("/v1/chat/completions", json=agent_request(stream=False))
    async with agent(proxy, "sgk-wrong") as c:
        denied = await c.post("/v1/toy/complete", json={"prompt": "x"})
    async with agent(default, key) as c:
        assert (await c.post("/v1/toy/complete", json={"prompt": "x"})).status_code == 404
    assert toy.status_code == 200 and toy.json() == {"text": "done", "finish": "stop"}
    assert chat.json()["choices"][0]["message"]["content"] == "done"
    assert bad.status_code == 400 and bad.json() == {"toy_error": "a toy request needs a prompt", "status": 400}
    assert denied.status_code == 401 and denied.json()["toy_error"] == "unknown or closed capture key"
    toy_turn, chat_turn = full_turns(session)  # both dialects land in one session, captured alike
    assert toy_turn.request["model"] == MODEL and toy_turn.request["return_token_ids"] is True
    assert request_text(toy_turn.request) == "say done" and toy_turn.response_message["content"] == "done"
    assert len(toy_turn.completion_token_ids) == len(toy_turn.logprobs) > 0 and chat_turn.request["tools"]
