"""OpenEnv's wire protocol on our server: Task API, /metadata, /schema, bare JSON-RPC on POST /mcp, WS /ws, WS /mcp.

In-process suites run the real app (or a small app with test tools) under a real uvicorn on a free port and talk
to it with httpx, `websockets` and fastmcp's Client. The integration test runs OpenEnv's OWN client classes
(openenv 0.10, from .openenv-venv: MCPToolClient in production mode over HTTP /mcp, GenericEnvClient over /ws)
against the real server with the built-in engine, real Pi and real grading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import require
from fastapi import FastAPI
from fastmcp import Client, FastMCP
from websockets.asyncio.client import connect

from swe_gym_env.cli import free_port
from swe_gym_env.server.agents.registry import HARNESSES
from swe_gym_env.server.app import create_app
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.openenv import (
    ENV_NAME,
    OpenEnvCompat,
    Sessions,
    install_openenv_routes,
    wrap_mcp_app,
)
from swe_gym_env.server.openenv.http_bridge import _is_openenv_request
from swe_gym_env.server.rollout import RolloutService, ServerConfig
from swe_gym_env.tasks.catalog import split_names

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
OPENENV_PY = REPO / ".openenv-venv" / "bin" / "python"


# -- helpers ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def serving(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The real app (engine unreachable: these tests never run a rollout)."""
    config = ServerConfig(
        engines={"default": EngineTarget(base_url="http://127.0.0.1:9/v1", served_model="m")},
        results_dir=tmp_path_factory.mktemp("results"),
    )
    with serving(create_app(config)) as url:
        yield url


def rpc(base: str, method: str, params: dict | None = None, id_: int | str = 1, **kw) -> dict:
    r = httpx.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": method, "params": params or {}, "id": id_}, **kw)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    return r.json()


def new_session(base: str) -> str:
    reply = rpc(base, "openenv/session/create")
    assert set(reply) == {"jsonrpc", "id", "result"} and reply["id"] == 1
    return reply["result"]["session_id"]


async def ws_call(ws, message: dict | str) -> dict:
    await ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 30))


def ws_url(base: str, path: str = "/ws") -> str:
    return base.replace("http://", "ws://") + path


# -- Task API, /metadata, /schema, /health ---------------------------------------------------------------------------
def test_task_api_matches_openenv_and_never_exposes_patches(base):
    assert httpx.get(f"{base}/list_environments").json() == [ENV_NAME]
    assert httpx.get(f"{base}/{ENV_NAME}/splits").json() == [{"name": s, "type": "validation"} for s in split_names()]

    tasks = httpx.post(f"{base}/{ENV_NAME}/tasks", json={"split": "bundled"}).json()
    assert tasks["env_name"] == ENV_NAME and len(tasks["tasks"]) == 6
    for t in tasks["tasks"]:
        assert {"instance_id", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS"} <= set(t)
        assert not {"patch", "test_patch", "gold_patch"} & set(t)
        assert "diff --git" not in json.dumps(t)
    assert httpx.post(f"{base}/{ENV_NAME}/num_tasks", json={"split": "bundled"}).json() == {"num_tasks": 6}
    one = httpx.post(f"{base}/{ENV_NAME}/task", json={"split": "bundled", "index": 2}).json()
    assert one == {"task": tasks["tasks"][2]}
    rng = httpx.post(f"{base}/{ENV_NAME}/task_range", json={"split": "bundled", "start": 1, "stop": 3}).json()
    assert rng == {"tasks": tasks["tasks"][1:3]}
    assert httpx.post(f"{base}/{ENV_NAME}/task_range", json={"split": "bundled"}).json() == {"tasks": tasks["tasks"]}

    # OpenEnv's status codes: unknown env 404, bad index 400, request-model violations 422
    r = httpx.get(f"{base}/other_env/splits")
    assert r.status_code == 404 and r.json() == {"detail": "unknown environment 'other_env'"}
    assert httpx.post(f"{base}/other_env/num_tasks", json={"split": "bundled"}).status_code == 404
    for index in (6, -1):
        r = httpx.post(f"{base}/{ENV_NAME}/task", json={"split": "bundled", "index": index})
        assert r.status_code == 400 and r.json() == {"detail": "Invalid task index"}
    r = httpx.post(f"{base}/{ENV_NAME}/num_tasks", json={"split": "nope"})
    assert r.status_code == 400 and "unknown split 'nope'" in r.json()["detail"]
    assert httpx.post(f"{base}/{ENV_NAME}/task", json={"split": "bundled"}).status_code == 422
    assert httpx.post(f"{base}/{ENV_NAME}/tasks", json={"split": "bundled", "x": 1}).status_code == 422
    # the case of the env name does not matter (OpenEnv compares lower-cased)
    assert httpx.post(f"{base}/SWE_GYM_ENV/num_tasks", json={"split": "bundled"}).json() == {"num_tasks": 6}


def test_health_metadata_and_schema(base):
    health = httpx.get(f"{base}/health").json()
    assert health["status"] == "healthy"
    meta = httpx.get(f"{base}/metadata").json()
    assert set(meta) == {"name", "description", "readme_content", "version", "author", "documentation_url"}
    assert meta["name"] == ENV_NAME and meta["description"] and meta["version"]
    assert meta["readme_content"] and meta["readme_content"].startswith("# swe_gym_env")
    schema = httpx.get(f"{base}/schema").json()
    assert set(schema) == {"action", "observation", "state", "reset_observation"}
    assert schema["action"]["discriminator"]["propertyName"] == "type"
    assert {"CallToolAction", "ListToolsAction", "RolloutRequest"} <= set(schema["action"]["$defs"])
    assert {"RolloutResult", "TaskPage", "TaskView", "Turn"} <= set(schema["observation"]["$defs"])
    assert {"episode_id", "step_count"} <= set(schema["state"]["properties"])


# -- POST /mcp, OpenEnv's bare JSON-RPC -----------------------------------------------------------------------------
def test_bare_jsonrpc_session_flow(base):
    sid = new_session(base)
    tools = rpc(base, "tools/list", {"session_id": sid}, 2)
    assert tools["id"] == 2
    names = {t["name"] for t in tools["result"]["tools"]}
    assert {"run_rollout", "list_tasks", "get_task", "get_rollout", "capabilities"} <= names
    assert not names & {"reset", "step", "state", "close"}
    run = next(t for t in tools["result"]["tools"] if t["name"] == "run_rollout")
    assert {"name", "description", "inputSchema", "outputSchema"} <= set(run)
    assert "harness" in run["inputSchema"]["properties"]

    page = rpc(base, "tools/call", {"session_id": sid, "name": "list_tasks", "arguments": {"limit": 2}}, "three")
    assert page["id"] == "three"
    result = page["result"]
    assert set(result) == {"content", "structured_content", "meta", "data", "is_error"}
    assert result["is_error"] is False and result["content"][0]["type"] == "text"
    assert json.loads(result["content"][0]["text"]) == result["structured_content"] == result["data"]
    assert result["data"]["total"] == 6 and len(result["data"]["tasks"]) == 2
    # a non-object result is unwrapped into `data`, as fastmcp's client does
    flag = rpc(base, "tools/call", {"session_id": sid, "name": "cancel_rollout", "arguments": {"rollout_id": "x"}})
    assert flag["result"]["data"] is False and flag["result"]["structured_content"] == {"result": False}
    # one-off call without a session (OpenEnv serves those too)
    caps = rpc(base, "tools/call", {"name": "capabilities"})
    assert caps["result"]["data"]["harnesses"] == sorted(HARNESSES)

    def error(params, method="tools/call"):
        reply = rpc(base, method, params, 7)
        assert reply["id"] == 7 and "result" not in reply and reply["error"]["data"] is None
        return reply["error"]["code"], reply["error"]["message"]

    assert error({"session_id": sid, "name": "nope"}) == (-32603, "Unknown tool: 'nope'")
    code, msg = error({"session_id": sid, "name": "get_rollout", "arguments": {"rollout_id": "none"}})
    assert code == -32603 and "no rollout 'none'" in msg
    code, msg = error({"session_id": sid, "name": "list_tasks", "arguments": {"limit": "many"}})
    assert code == -32603 and "limit" in msg
    assert error({"session_id": sid}) == (-32602, "Missing 'name' in params")
    code, msg = error({"session_id": sid, "name": "reset"})
    assert code == -32602 and "reserved" in msg
    assert error({"session_id": sid}, "resources/list") == (-32601, "Method not found: resources/list")
    assert error({"session_id": "nope"}, "tools/list") == (-32602, "Unknown session_id: nope")
    assert error({}, "openenv/session/close") == (-32602, "Invalid params - 'session_id' is required")

    assert rpc(base, "openenv/session/close", {"session_id": sid})["result"] == {"session_id": sid, "closed": True}
    assert error({"session_id": sid}, "tools/list") == (-32602, f"Unknown session_id: {sid}")
    assert error({"session_id": sid}, "openenv/session/close") == (-32602, f"Unknown session_id: {sid}")


def test_bare_jsonrpc_malformed_requests_get_openenv_errors(base):
    r = httpx.post(f"{base}/mcp", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400  # a body nothing can parse: a 4xx with a one-line reason (issue 43)
    assert r.json()["id"] is None and r.json()["error"]["code"] == -32700
    assert r.json()["error"]["message"] == "Parse error: invalid JSON at line 1 column 2"
    for body in ({}, {"jsonrpc": "2.0", "method": "tools/list", "params": [], "id": 1}):
        r = httpx.post(f"{base}/mcp", json=body)  # `openenv validate` posts {} and expects JSON-RPC back
        assert r.status_code == 200 and r.json()["jsonrpc"] == "2.0" and r.json()["error"]["code"] == -32600


async def test_standard_mcp_client_still_works_on_the_same_path(base):
    async with Client(f"{base}/mcp") as c:
        assert "run_rollout" in {t.name for t in await c.list_tools()}
        page = await c.call_tool("list_tasks", {"limit": 1})
        assert page.structured_content["total"] == 6
        caps = await c.call_tool("capabilities", {})
        assert caps.structured_content["splits"] == split_names()


def test_which_posts_are_openenv_s():
    plain = {"type": "http", "headers": []}
    versioned = {"type": "http", "headers": [(b"mcp-protocol-version", b"2025-06-18")]}
    rpc_ = {"jsonrpc": "2.0", "id": 1}
    assert _is_openenv_request(plain, {**rpc_, "method": "openenv/session/create"})
    assert _is_openenv_request(versioned, {**rpc_, "method": "tools/call", "params": {"session_id": "s"}})
    assert _is_openenv_request(plain, {**rpc_, "method": "tools/list"})
    assert not _is_openenv_request(versioned, {**rpc_, "method": "tools/list"})  # a stateless MCP client
    assert not _is_openenv_request(plain, {**rpc_, "method": "initialize", "params": {}})
    assert not _is_openenv_request(plain, [{**rpc_, "method": "tools/list"}])  # batch
    assert not _is_openenv_request(versioned, {"jsonrpc": "2.0", "id": 1, "result": {}})  # a response to the server


# -- sessions --------------------------------------------------------------------------------------------------------
async def test_sessions_expire_when_idle_but_not_while_busy_or_attached():
    sessions = Sessions(idle_s=0.05, max_sessions=10)
    idle, busy, attached = sessions.create(), sessions.create(), sessions.create()
    attached.ws_attached = True
    with sessions.busy(busy, step=True):
        await asyncio.sleep(0.1)
        assert sessions.get(idle.session_id) is None
        assert sessions.get(busy.session_id) is busy and sessions.get(attached.session_id) is attached
    assert busy.step_count == 1 and sessions.get(busy.session_id) is busy  # activity just now
    await asyncio.sleep(0.1)
    assert len(sessions) == 1  # only the attached one is left


async def test_session_capacity_is_a_server_error_with_counts():
    compat = OpenEnvCompat(FastMCP("t"), None, idle_s=60, max_sessions=1)  # type: ignore[arg-type]
    first = await compat.handle_rpc_obj({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
    assert "session_id" in first["result"]
    second = await compat.handle_rpc_obj({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 2})
    assert second["error"]["code"] == -32000
    assert second["error"]["data"] == {"active_sessions": 1, "max_sessions": 1}


# -- WS /ws ------------------------------------------------------------------------------------------------------------
async def test_ws_protocol_messages(base):
    async with connect(ws_url(base)) as ws:
        reset = await ws_call(ws, {"type": "reset", "data": {"episode_id": "ep-1"}})
        assert reset["type"] == "observation" and "request_id" not in reset
        assert reset["data"]["done"] is False and reset["data"]["reward"] is None
        assert reset["data"]["observation"]["metadata"]["episode_id"] == "ep-1"

        tools = await ws_call(ws, {"type": "step", "data": {"type": "list_tools"}})
        specs = tools["data"]["observation"]["tools"]
        assert {"name", "description", "input_schema"} == set(specs[0])
        assert "run_rollout" in {t["name"] for t in specs}

        step = await ws_call(
            ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "list_tasks", "arguments": {"limit": 1}}}
        )
        obs = step["data"]["observation"]
        assert obs["tool_name"] == "list_tasks" and obs["error"] is None
        assert obs["result"]["data"]["total"] == 6 and obs["result"]["is_error"] is False

        bad = await ws_call(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "nope"}})
        assert bad["data"]["observation"]["error"] == {
            "error_type": "tool_not_found",
            "message": "Unknown tool: 'nope'",
        }
        bad = await ws_call(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "close"}})
        assert bad["data"]["observation"]["error"]["error_type"] == "tool_not_found"
        bad = await ws_call(
            ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "list_tasks", "arguments": {"limit": 0}}}
        )
        assert bad["data"]["observation"]["error"]["error_type"] == "invalid_args"

        state = await ws_call(ws, {"type": "state"})
        assert state["type"] == "state" and state["data"]["episode_id"] == "ep-1"
        assert state["data"]["step_count"] == 5

        mcp = await ws_call(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 9}})
        assert mcp["type"] == "mcp" and mcp["data"]["id"] == 9 and mcp["data"]["result"]["tools"]
        own = await ws_call(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "openenv/session/create"}})
        own_id = own["data"]["result"]["session_id"]
        assert state["data"]["session_id"] == own_id
        refused = await ws_call(
            ws,
            {
                "type": "mcp",
                "data": {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {"session_id": own_id}},
            },
        )
        assert refused["data"]["error"]["code"] == -32600

        for message, code in [
            ("{oops", "INVALID_JSON"),
            ({"type": "teleport"}, "UNKNOWN_TYPE"),
            ({"type": "step"}, "VALIDATION_ERROR"),
            ({"type": "step", "data": {"type": "fly"}}, "VALIDATION_ERROR"),
            ({"type": "state", "extra": 1}, "VALIDATION_ERROR"),
            ([1, 2], "VALIDATION_ERROR"),
        ]:
            reply = await ws_call(ws, message)
            assert reply["type"] == "error" and reply["data"]["code"] == code, reply

        echoed = await ws_call(ws, {"type": "state", "request_id": "r-1"})
        assert echoed["request_id"] == "r-1" and echoed["type"] == "state"
        echoed = await ws_call(ws, {"type": "teleport", "request_id": 42})
        assert echoed["request_id"] == 42 and echoed["data"]["code"] == "UNKNOWN_TYPE"

        await ws.send(json.dumps({"type": "close"}))
        await asyncio.wait_for(ws.wait_closed(), 10)
    # the websocket's own session went with it
    assert rpc(base, "tools/list", {"session_id": own_id})["error"]["message"] == f"Unknown session_id: {own_id}"


async def test_ws_attaches_to_an_http_session_and_closes_it_on_detach(base):
    sid = new_session(base)
    async with connect(ws_url(base, f"/ws?session_id={sid}")) as ws:
        assert (await ws_call(ws, {"type": "state"}))["data"]["session_id"] == sid
        async with connect(ws_url(base, f"/ws?session_id={sid}")) as second:
            reply = json.loads(await asyncio.wait_for(second.recv(), 10))
            assert reply["data"] == {
                "message": f"Session {sid} already has an attached WebSocket",
                "code": "SESSION_ERROR",
            }
        closing = rpc(base, "openenv/session/close", {"session_id": sid})
        assert closing["result"] == {"session_id": sid, "closed": False, "closing": True}
        assert "result" in rpc(base, "tools/list", {"session_id": sid})  # still usable until the socket goes
    await asyncio.sleep(0.2)
    assert rpc(base, "tools/list", {"session_id": sid})["error"]["message"] == f"Unknown session_id: {sid}"

    async with connect(ws_url(base, "/ws?session_id=nope")) as ws:
        reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert reply == {"type": "error", "data": {"message": "Unknown session_id: nope", "code": "SESSION_ERROR"}}
        await asyncio.wait_for(ws.wait_closed(), 10)


async def test_ws_mcp_jsonrpc_frames(base):
    async with connect(ws_url(base, "/mcp")) as ws:
        reply = await ws_call(
            ws, {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "capabilities"}, "id": 3}
        )
        assert reply["id"] == 3 and reply["result"]["data"]["splits"] == split_names()
        assert (await ws_call(ws, "nope"))["error"]["code"] == -32700


# -- a small app with test tools: concurrency, ordering, reserved names, disconnects ---------------------------------
@pytest.fixture(scope="module")
def toy():
    mcp = FastMCP("toy")
    started: list[str] = []

    async def slow(seconds: float, tag: str = "") -> str:
        """Sleep, then answer."""
        started.append(tag)
        await asyncio.sleep(seconds)
        return f"slept {tag}"

    async def state() -> str:  # a name OpenEnv reserves: never offered, never called
        return "should not run"

    mcp.tool(slow, name="slow")
    mcp.tool(state, name="state")
    mcp_app = mcp.http_app(path="/mcp")
    app = FastAPI(lifespan=lambda app: mcp_app.lifespan(app))
    service = RolloutService(ServerConfig(engines={}), CaptureProxy())
    install_openenv_routes(app, mcp, service, session_idle_s=60, max_sessions=3)
    app.mount("/", wrap_mcp_app(app, mcp_app))
    with serving(app) as url:
        yield url, app.state.openenv, started


def slow_step(seconds: float, tag: str, request_id: str | None = None) -> dict:
    msg = {
        "type": "step",
        "data": {"type": "call_tool", "tool_name": "slow", "arguments": {"seconds": seconds, "tag": tag}},
    }
    return msg if request_id is None else {**msg, "request_id": request_id}


async def test_ws_request_ids_run_concurrently_and_unnumbered_messages_keep_order(toy):
    url, _compat, _ = toy
    async with connect(ws_url(url)) as ws:
        await ws.send(json.dumps(slow_step(1.0, "long", "a")))
        await ws.send(json.dumps({"type": "state", "request_id": "b"}))
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["request_id"] == "b" and first["type"] == "state"  # not stuck behind the long call
        second = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert second["request_id"] == "a"
        assert second["data"]["observation"]["result"]["data"] == "slept long"

        # without request ids, replies come in the order the messages were sent (OpenEnv's clients rely on it)
        await ws.send(json.dumps(slow_step(0.3, "one")))
        await ws.send(json.dumps({"type": "state"}))
        one = json.loads(await asyncio.wait_for(ws.recv(), 10))
        two = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert one["type"] == "observation" and two["type"] == "state" and "request_id" not in two


async def test_reserved_tool_names_are_never_listed_or_called(toy):
    url, _, _started = toy
    listed = rpc(url, "tools/list")
    assert [t["name"] for t in listed["result"]["tools"]] == ["slow"]
    refused = rpc(url, "tools/call", {"name": "state"})
    assert refused["error"]["code"] == -32602 and "reserved" in refused["error"]["message"]
    async with connect(ws_url(url)) as ws:
        tools = await ws_call(ws, {"type": "step", "data": {"type": "list_tools"}})
        assert [t["name"] for t in tools["data"]["observation"]["tools"]] == ["slow"]
        step = await ws_call(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "state"}})
        assert step["data"]["observation"]["error"]["error_type"] == "tool_not_found"
        assert step["data"]["observation"]["result"] is None


async def test_disconnect_mid_call_frees_the_session_and_capacity_is_reported(toy):
    url, compat, started = toy
    async with connect(ws_url(url)) as ws:
        await ws.send(json.dumps(slow_step(30, "abandoned", "x")))
        for _ in range(100):
            if "abandoned" in started:
                break
            await asyncio.sleep(0.05)
        assert len(compat.sessions) == 1
    for _ in range(100):
        if len(compat.sessions) == 0:
            break
        await asyncio.sleep(0.05)
    assert len(compat.sessions) == 0

    held = [new_session(url) for _ in range(3)]  # max_sessions=3
    async with connect(ws_url(url)) as ws:
        reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"
        assert reply["data"]["active_sessions"] == 3 and reply["data"]["max_sessions"] == 3
    full = rpc(url, "openenv/session/create")
    assert full["error"]["code"] == -32000 and full["error"]["data"] == {"active_sessions": 3, "max_sessions": 3}
    for sid in held:
        assert rpc(url, "openenv/session/close", {"session_id": sid})["result"]["closed"] is True


async def test_http_caller_that_goes_away_does_not_hold_the_call(toy):
    url, compat, _started = toy
    sid = new_session(url)
    async with httpx.AsyncClient() as h:
        body = {"jsonrpc": "2.0", "method": "tools/call", "id": 1}
        body["params"] = {"session_id": sid, "name": "slow", "arguments": {"seconds": 30, "tag": "gone"}}
        with pytest.raises(httpx.ReadTimeout):
            await h.post(f"{url}/mcp", json=body, timeout=0.5)
    for _ in range(100):
        if compat.sessions.get(sid).in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert compat.sessions.get(sid).in_flight == 0
    rpc(url, "openenv/session/close", {"session_id": sid})


@pytest.mark.integration
def test_openenv_validate_passes_against_the_server(base):
    require(OPENENV_PY.is_file(), "OpenEnv's client missing: run `bash scripts/setup_openenv.sh`")
    cli = OPENENV_PY.parent / "openenv"
    proc = subprocess.run([str(cli), "validate", "--url", base, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["passed"] is True and report["mode"] == "production"


# -- OpenEnv's own clients against the real server, real rollouts ----------------------------------------------------
OPENENV_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys

    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient

    BASE = sys.argv[1]


    async def main():
        out = {}
        # MCPToolClient's default (production) mode: bare JSON-RPC to HTTP /mcp, plus /ws attached to its session
        async with MCPToolClient(base_url=BASE, message_timeout_s=600) as env:
            out["tools"] = sorted(t.name for t in await env.list_tools())
            out["page"] = await env.call_tool("list_tasks", limit=2)
            out["http_rollout"] = await env.call_tool("run_rollout", harness="pi")
            step = await env.step(CallToolAction(tool_name="list_tasks", arguments={"limit": 1}))
            out["ws_step_total"] = step.observation.result["data"]["total"]
            out["session_id"] = env._production_session_id
        # its websocket client: reset / step / state over /ws
        async with GenericEnvClient(base_url=BASE, message_timeout_s=600) as env:
            await env.reset()
            listed = await env.step({"type": "list_tools"})
            out["ws_tools"] = sorted(t["name"] for t in listed.observation["tools"])
            step = await env.step({"type": "call_tool", "tool_name": "run_rollout", "arguments": {"harness": "pi"}})
            out["ws_rollout"] = {"reward": step.reward, "done": step.done, "data": step.observation["result"]["data"]}
            out["ws_state"] = await env.state()
        print(json.dumps(out))


    asyncio.run(main())
    """
)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("need_pi")
async def test_openenv_own_clients_run_real_rollouts(tmp_path):
    require(OPENENV_PY.is_file(), "OpenEnv's client missing: run `bash scripts/setup_openenv.sh`")
    from test_e2e import Stack

    stack = Stack("oracle")
    try:
        base = stack.mcp_url.removesuffix("/mcp")
        script = tmp_path / "openenv_round_trip.py"
        script.write_text(OPENENV_SCRIPT)
        proc = await asyncio.to_thread(
            subprocess.run, [str(OPENENV_PY), str(script), base], capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])

        assert {"run_rollout", "list_tasks", "get_rollout"} <= set(out["tools"]) and "step" not in out["tools"]
        assert out["page"]["total"] == 6 and len(out["page"]["tasks"]) == 2
        http = out["http_rollout"]
        assert http["ok"] is True, http["error"]
        assert http["reward"] == 1.0 and http["grading"]["resolution"] == "RESOLVED_FULL"
        assert len(http["turns"]) >= 2 and all(t["prompt_len"] for t in http["turns"])
        assert out["ws_step_total"] == 6

        ws = out["ws_rollout"]
        assert ws["data"]["ok"] is True, ws["data"]["error"]
        assert ws["reward"] == 1.0 and ws["done"] is True and ws["data"]["reward"] == 1.0
        assert out["ws_tools"] == out["tools"]
        assert out["ws_state"]["step_count"] == 2

        # OpenEnv's client closed its HTTP session on exit
        sid = out["session_id"]
        assert rpc(base, "tools/list", {"session_id": sid})["error"]["message"] == f"Unknown session_id: {sid}"
        # a standard MCP client still works on the same /mcp path
        async with Client(stack.mcp_url) as c:
            assert "run_rollout" in {t.name for t in await c.list_tools()}
        assert stack.health()["capture_sessions"] == 0 and stack.health()["rollouts_in_flight"] == 0
    finally:
        stack.stop()
