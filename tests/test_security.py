"""Public-Space security: the access token on every path that starts work (real MCP, OpenEnv's bare JSON-RPC, /ws),
admin key semantics, the per-key rate limit, the engine-URL allow-list, request size limits, the capture proxy's
refusal of unknown keys, and read-only views that stay public without patches.

Unit tests use the functions directly; the integration tests run the real server as a process (no engine and no
sandbox needed: every call here is refused or fails before a sandbox would boot)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from test_ui import gradio_call
from websockets.asyncio.client import connect

from swe_gym_env.server import security
from swe_gym_env.server.security import BodySizeLimit, RateLimiter, engine_url_allowed

from helpers import Stack

TOKEN, ADMIN = "tok-test-3f9a", "adm-test-77c1"


# -- unit -----------------------------------------------------------------------------------------------------
@pytest.fixture
def clean_env(monkeypatch):
    for name in (
        security.ACCESS_ENV,
        security.ADMIN_ENV,
        security.RATE_ENV,
        security.ALLOWLIST_ENV,
        security.LEGACY_ALLOW_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_open_server_allows_everything(clean_env):
    assert security.access_ok(None) and security.admin_ok(None) and not security.access_required()
    assert security.start_refusal(None) is None and security.rate_per_minute() == 0


def test_access_token_and_admin_key(clean_env):
    clean_env.setenv(security.ACCESS_ENV, TOKEN)
    assert not security.access_ok(None) and not security.access_ok("wrong") and security.access_ok(TOKEN)
    assert not security.admin_ok(None) and not security.admin_ok(TOKEN)  # guarded server, no admin key: closed
    clean_env.setenv(security.ADMIN_ENV, ADMIN)
    assert security.access_ok(ADMIN) and security.admin_ok(ADMIN) and not security.admin_ok(TOKEN)
    assert security.start_refusal(None) == security.ACCESS_REFUSED
    assert security.rate_per_minute() == security.DEFAULT_RATE_WITH_TOKEN


def test_bearer_parsing():
    assert security.bearer("Bearer abc") == "abc" and security.bearer("bearer  abc ") == "abc"
    assert security.bearer("Basic abc") is None and security.bearer("Bearer ") is None and security.bearer(None) is None


def test_require_admin_raises_401(clean_env):
    from fastapi import HTTPException

    clean_env.setenv(security.ADMIN_ENV, ADMIN)
    security.require_admin(f"Bearer {ADMIN}")
    with pytest.raises(HTTPException) as e:
        security.require_admin("Bearer nope")
    assert e.value.status_code == 401


def test_rate_limiter_buckets_per_key_and_refills():
    now = [1000.0]
    lim = RateLimiter(3, clock=lambda: now[0])
    assert [lim.check("a") for _ in range(3)] == [None, None, None]
    wait = lim.check("a")
    assert wait is not None and 19.9 < wait <= 20.0  # 3/min: one call every 20 s
    assert lim.check("b") is None  # another key has its own bucket
    now[0] += 20.0
    assert lim.check("a") is None and lim.check("a") is not None


def test_rate_limiter_bounds_its_memory():
    lim = RateLimiter(2, max_keys=50, clock=lambda: 0.0)
    for i in range(500):
        lim.check(f"k{i}")
    assert len(lim._buckets) <= 51


def test_start_refusal_rate_limits_per_key(clean_env):
    clean_env.setenv(security.ACCESS_ENV, TOKEN)
    clean_env.setenv(security.ADMIN_ENV, ADMIN)
    clean_env.setenv(security.RATE_ENV, "2")
    assert security.start_refusal(TOKEN) is None and security.start_refusal(TOKEN) is None
    refused = security.start_refusal(TOKEN)
    assert refused is not None and refused.startswith("rate limit: at most 2 calls a minute per key")
    assert security.start_refusal(ADMIN) is None  # per key
    assert security.start_refusal("stranger") == security.ACCESS_REFUSED  # access first: no bucket for strangers


def test_start_refusal_refuses_other_sites_first(clean_env):
    clean_env.setenv(security.ACCESS_ENV, TOKEN)
    own = {"host": "space.example", "origin": "https://space.example"}
    evil = {"host": "space.example", "origin": "https://evil.example"}
    assert security.start_refusal(TOKEN, headers=own) is None
    assert security.start_refusal(TOKEN, headers=own, scheme="wss") is None  # a websocket handshake from our page
    assert security.start_refusal(TOKEN, headers=evil).startswith("cross-origin request refused")
    assert security.start_refusal(None, headers={"sec-fetch-site": "cross-site"}).startswith("cross-site request")
    assert security.start_refusal(None, headers={"host": "space.example"}) == security.ACCESS_REFUSED  # not a browser


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:8001/v1", True),
        ("http://127.0.0.1:8001/v1/", True),
        ("http://127.0.0.1:8001/v1/extra", True),
        ("http://127.0.0.1:8001/v10", False),  # segment boundary, not a string prefix
        ("http://127.0.0.1:80010/v1", False),
        ("http://127.0.0.1:8002/v1", False),
        ("https://127.0.0.1:8001/v1", False),
        ("https://api.example.com/v1", True),  # default port 443 on both sides
        ("https://api.example.com:443/openai/v1", True),
        ("https://api.example.com.evil.net/v1", False),
        ("https://user:pw@api.example.com/v1", False),
        ("https://API.EXAMPLE.COM/x", True),
        ("ftp://api.example.com/v1", False),
        ("not a url", False),
    ],
)
def test_engine_url_allow_list(url, ok):
    assert engine_url_allowed(url, ("http://127.0.0.1:8001/v1", "https://api.example.com")) is ok


def test_engine_url_allow_list_env(clean_env):
    assert security.engine_allowlist() == () and not engine_url_allowed("http://a/v1", ())
    clean_env.setenv(security.ALLOWLIST_ENV, " http://a:1/v1 , https://b ")
    assert security.engine_allowlist() == ("http://a:1/v1", "https://b")
    clean_env.setenv(security.LEGACY_ALLOW_ENV, "1")
    assert engine_url_allowed("http://anything:9/v1", security.engine_allowlist())


async def _echo_len(scope, receive, send):
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


@pytest.mark.anyio
async def test_body_size_limit_by_header_and_by_stream():
    app = BodySizeLimit(_echo_len, max_bytes=100)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.post("/", content=b"x" * 100)).text == "100"
        big = await c.post("/", content=b"x" * 101)
        assert big.status_code == 413 and "over 100 bytes" in big.json()["detail"]

        async def chunks():
            for _ in range(5):
                yield b"y" * 30

        streamed = await c.post("/", content=chunks())  # no Content-Length: counted as it arrives
        assert streamed.status_code == 413


# -- integration: the real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    s = Stack(
        "oracle",
        engine_up=False,
        server_engine_url="http://127.0.0.1:9/v1",
        env={
            "SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("data")),
            security.ACCESS_ENV: TOKEN,
            security.ADMIN_ENV: ADMIN,
            security.RATE_ENV: "8",
            security.ALLOWLIST_ENV: "http://127.0.0.1:9/v1",
            security.MAX_BODY_ENV: "200000",
        },
    )
    yield s
    s.stop()


def _mcp(stack: Stack, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(StreamableHttpTransport(stack.mcp_url, headers=headers))


@pytest.mark.anyio
@pytest.mark.integration
async def test_mcp_run_rollout_needs_the_access_token(guarded):
    for token in (None, "wrong"):
        async with _mcp(guarded, token) as c:
            res = (await c.call_tool("run_rollout", {"engine": "nope"})).structured_content
            assert res["ok"] is False and res["phase"] == "validate" and res["error"] == security.ACCESS_REFUSED
            cancel = await c.call_tool("cancel_rollout", {"rollout_id": "x"}, raise_on_error=False)
            assert cancel.is_error and "access token required" in cancel.content[0].text
            # read-only views stay public and show no patches
            page = (await c.call_tool("list_tasks", {})).structured_content
            assert page["total"] >= 1 and "diff --git" not in json.dumps(page)
    async with _mcp(guarded, TOKEN) as c:
        res = (await c.call_tool("run_rollout", {"engine": "nope"})).structured_content
        assert res["ok"] is False and "unknown engine 'nope'" in res["error"]  # past the gate
        assert (await c.call_tool("cancel_rollout", {"rollout_id": "x"})).structured_content == {"result": False}


@pytest.mark.anyio
@pytest.mark.integration
async def test_openenv_bare_jsonrpc_and_ws_need_the_access_token(guarded):
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_rollout"}}
    call["params"]["arguments"] = {"engine": "nope"}
    url = f"http://127.0.0.1:{guarded.server_port}"
    async with httpx.AsyncClient(timeout=30) as http:
        anon = (await http.post(f"{url}/mcp", json=call)).json()
        ok = (await http.post(f"{url}/mcp", json=call, headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert anon["result"]["data"]["error"] == security.ACCESS_REFUSED
    assert "unknown engine" in ok["result"]["data"]["error"]

    step = {"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": {"engine": "x"}}}
    ws_url = f"ws://127.0.0.1:{guarded.server_port}/ws"
    async with connect(ws_url) as ws:  # no token: no session (issue 43), the refusal is the first message
        reply = json.loads(await ws.recv())
    assert reply["type"] == "error" and reply["data"]["message"] == security.SESSION_REFUSED, reply
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send(json.dumps(step))
        reply = json.loads(await ws.recv())
    assert reply["type"] == "observation", reply
    assert "unknown engine" in reply["data"]["observation"]["result"]["data"]["error"]


@pytest.mark.anyio
@pytest.mark.integration
async def test_engine_url_allow_list_on_the_server(guarded):
    async with _mcp(guarded, TOKEN) as c:
        off = (await c.call_tool("run_rollout", {"engine_url": "http://127.0.0.1:10/v1"})).structured_content
        on = (await c.call_tool("run_rollout", {"engine_url": "http://127.0.0.1:9/v1"})).structured_content
    assert off["ok"] is False and "not on this server's allow-list" in off["error"]
    assert on["ok"] is False and "engine unreachable" in on["error"]  # allowed, and port 9 is dead


@pytest.mark.anyio
@pytest.mark.integration
async def test_rate_limit_per_key(guarded):
    """A bucket of 8 that refills at 8 a minute (one every 7.5 s): the first 8 calls pass, then the key is refused
    after at most one more pass per 7.5 s the calls took (a loaded machine, e.g. the suite in parallel)."""
    errors = []
    t0 = time.monotonic()
    async with _mcp(guarded, ADMIN) as c:  # its own bucket of 8
        while len(errors) < 20 and not any(e.startswith("rate limit:") for e in errors):
            errors.append((await c.call_tool("run_rollout", {"engine": "nope"})).structured_content["error"])
    took = time.monotonic() - t0
    assert all("unknown engine" in e for e in errors[:8]), errors
    assert errors[-1].startswith("rate limit: at most 8 calls a minute per key"), (took, errors)
    assert len(errors) - 1 <= 8 + took * 8 / 60, (took, errors)  # passes beyond the burst: only the refill


@pytest.mark.anyio
@pytest.mark.integration
async def test_size_limit_capture_refusal_and_public_views(guarded):
    url = f"http://127.0.0.1:{guarded.server_port}"
    async with httpx.AsyncClient(timeout=30) as http:
        big = await http.post(f"{url}/mcp", content=b"{" + b" " * 300_000 + b"}")
        relay = await http.post(
            f"{url}/capture/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": "Bearer sgk-not-a-session"},
        )
        nokey = await http.post(f"{url}/capture/v1/chat/completions", json={"messages": []})
        health = await http.get(f"{url}/health")
        task = await http.post(f"{url}/swe_gym_env/task", json={"split": "bundled", "index": 0})
    assert big.status_code == 413
    assert relay.status_code == 401 and nokey.status_code == 401  # no open relay
    assert health.status_code == 200 and health.json()["status"] == "healthy"
    dump = json.dumps(task.json())
    assert task.status_code == 200 and "diff --git" not in dump and '"patch"' not in dump
    assert TOKEN not in health.text + dump and ADMIN not in health.text + dump


# -- one guard on every entry point that starts work -------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """An open server (no access token: any key may start work) limited to one start a minute per key, UI on."""
    s = Stack(
        "oracle",
        engine_up=False,
        server_engine_url="http://127.0.0.1:9/v1",
        env={"SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("data")), security.RATE_ENV: "1"},
        ui=True,
    )
    yield s
    s.stop()


RATE_REFUSED = "rate limit: at most 1 calls a minute per key"
GUARD_REFUSALS = ("rate limit:", "request refused", "access token required")


@pytest.mark.anyio
@pytest.mark.integration
async def test_every_entry_point_applies_the_rate_limit(limited):
    """Real MCP, bare JSON-RPC on /mcp, /ws and the UI each start work through the same guard: a key's second start
    within the minute is refused on each, and a key spent on one entry point is refused on another."""
    url = f"http://127.0.0.1:{limited.server_port}"
    args = {"engine": "nope"}  # fails right after the guard: unknown engine

    async def mcp(key: str) -> str:
        async with _mcp(limited, key) as c:
            return (await c.call_tool("run_rollout", args)).structured_content["error"]

    async def bare(key: str, headers: dict | None = None) -> str:
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_rollout", "arguments": args}}
        async with httpx.AsyncClient(timeout=30) as http:
            reply = await http.post(
                f"{url}/mcp", json=call, headers={"Authorization": f"Bearer {key}", **(headers or {})}
            )
        return reply.json()["result"]["data"]["error"]

    async def ws(key: str, headers: dict | None = None) -> str:
        step = {"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": args}}
        async with connect(
            f"ws://127.0.0.1:{limited.server_port}/ws",
            additional_headers={"Authorization": f"Bearer {key}", **(headers or {})},
        ) as sock:
            await sock.send(json.dumps(step))
            reply = json.loads(await sock.recv())
        return reply["data"]["observation"]["result"]["data"]["error"]

    async def ui(key: str) -> str:
        data = ["bundled", None, "pi", "local", "default", 3, key]  # the default engine is down: fails fast
        messages = await asyncio.to_thread(gradio_call, url, "start_run", data, {"origin": url})
        return json.dumps([m.get("output") for m in messages if m.get("output")])

    for name, start in (("mcp", mcp), ("bare", bare), ("ws", ws), ("ui", ui)):
        key = f"key-{name}"
        first, second = await start(key), await start(key)
        assert not any(why in first for why in GUARD_REFUSALS), (name, first)  # past the guard
        assert RATE_REFUSED in second, (name, second)
    assert (await mcp("key-ui")).startswith(RATE_REFUSED)  # one bucket per key, whichever entry point spent it
    assert RATE_REFUSED in await ui("key-mcp")

    # the cross-site check, once the UI's alone, applies on the in-process paths too (before the rate limit)
    evil = {"Origin": "http://evil.example"}
    assert (await bare("key-fresh", evil)).startswith("cross-origin request refused")
    assert (await ws("key-fresh", evil)).startswith("cross-origin request refused")
    assert "unknown engine" in await bare("key-fresh")  # refusals above took nothing from its bucket
