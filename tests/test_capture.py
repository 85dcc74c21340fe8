import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import MODEL, PI_TOOLS, engine_app, sse_events

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]


def make_proxy(app) -> CaptureProxy:
    return CaptureProxy(client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)))


def agent(proxy: CaptureProxy, key: str | None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy.app()), base_url="http://capture", headers=headers)


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


async def test_unknown_and_closed_keys_get_401():
    proxy = make_proxy(engine_app())
    session, key = proxy.open_session(EngineTarget("http://engine/v1", MODEL), max_calls=5, max_tokens=512)
    async with agent(proxy, "sgk-wrong") as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    async with agent(proxy, None) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    proxy.close_session(session)
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request())).status_code == 401
    assert session.turns == []


async def test_streamed_call_is_captured_and_replayed():
    proxy = make_proxy(engine_app())
    session, key = proxy.open_session(EngineTarget("http://engine/v1", MODEL), max_calls=5, max_tokens=512)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] > 0
    args = "".join(
        tc["function"].get("arguments", "")
        for e in events[:-1]
        for ch in e["choices"]
        for tc in ch["delta"].get("tool_calls", [])
    )
    assert '"path": "batchtools/chunks.py"' in args
    assert [e["choices"][0]["finish_reason"] for e in events[:-2]][-1] == "tool_calls"
    (turn,) = session.turns
    assert turn.streamed and turn.request["model"] == MODEL  # the agent's model name is rewritten
    assert turn.request["return_token_ids"] and turn.request["logprobs"] and turn.request["stream"] is False
    assert len(turn.completion_token_ids) == len(turn.logprobs) > 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app()), base_url="http://e") as e:
        tok = await e.post("/tokenize", json={"messages": turn.request["messages"], "tools": turn.request["tools"]})
    assert tok.json()["tokens"] == turn.prompt_token_ids


async def test_budget_exhausted_reply_is_not_a_turn():
    proxy = make_proxy(engine_app("noop"))
    session, key = proxy.open_session(EngineTarget("http://engine/v1", MODEL), max_calls=1, max_tokens=64)
    async with agent(proxy, key) as c:
        assert (await c.post("/v1/chat/completions", json=agent_request(stream=False))).status_code == 200
        r = await c.post("/v1/chat/completions", json=agent_request(stream=False))
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert len(session.turns) == 1 and session.stop_reason == "budget_exhausted"


def bad_engine(kind: str) -> Starlette:
    async def chat(request):
        if kind == "html":
            return HTMLResponse("<html>gateway</html>")
        if kind == "500":
            return JSONResponse({"error": "boom"}, 500)
        return JSONResponse(
            {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize(
    "kind,status,needle", [("no-ids", 502, "no prompt_token_ids"), ("html", 502, "not JSON"), ("500", 502, "HTTP 500")]
)
async def test_engine_garbage_is_an_error_never_a_silent_success(kind, status, needle):
    proxy = make_proxy(bad_engine(kind))
    session, key = proxy.open_session(EngineTarget("http://engine/v1", MODEL), max_calls=5, max_tokens=64)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
    assert r.status_code == status and needle in r.json()["error"]["message"]
    assert session.turns == [] and needle in session.errors[0]


async def test_unreachable_engine_is_reported():
    proxy = CaptureProxy()
    session, key = proxy.open_session(EngineTarget("http://127.0.0.1:9/v1", MODEL), max_calls=5, max_tokens=64)
    async with agent(proxy, key) as c:
        r = await c.post("/v1/chat/completions", json=agent_request())
    await proxy.aclose()
    assert r.status_code == 502 and "unreachable" in session.errors[0]
