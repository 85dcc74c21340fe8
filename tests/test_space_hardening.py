"""A public Space strangers cannot wear down (issue 43), against real `serve --host 0.0.0.0` processes with a token.

- uploads: Gradio's upload and file routes answer 403 (the UI takes no files); nothing lands in Gradio's folder;
- OpenEnv sessions: opening one needs the token on every path (bare JSON-RPC on POST /mcp, /ws, WS /mcp); where
  strangers may open them (public reads), 21 at a cap of 20 leave a token holder served on /ws and WS /mcp, and
  those that never did anything expire after the short idle timeout;
- a body nothing can parse (nested 50,000 deep, invalid, not UTF-8) is a 4xx with a one-line reason on HTTP, JSON-RPC
  and both websockets, and the server logs no traceback;
- trickled headers are cut at the header timeout, a silent body gets 408, connections over the cap get 503;
- the UI's paging (earlier / later / go to call) shows nothing to a request without the token, even one naming a
  viewer's Gradio session;
- each refused request logs one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest
import websockets
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from swe_gym_env.core import procs
from swe_gym_env.core.procs import free_port
from swe_gym_env.wire import RolloutResult, SequenceRef, Turn

from helpers import ME, STARTUP_S

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKEN = "tok-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CAP = 20
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
# long enough that 21 session openings and a /ws connect finish inside it on a loaded machine (at 3 s, a 4-worker
# suite on 2 cores let the first strangers' sessions expire before the /ws check, which then got a session)
UNUSED_IDLE_S = 8.0
MAX_CONNECTIONS = 24
DEEP = "[" * 50_000 + "]" * 50_000


def stored_result(rid: str, marker: str) -> RolloutResult:
    turn = Turn(
        index=0,
        prompt_len=3,
        prompt_new_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        finish_reason="stop",
        streamed=False,
        wall_s=0.1,
        new_messages=[{"role": "user", "content": marker}],
        params={"model": "m"},
        response_message={"role": "assistant", "content": marker},
        sequence=0,
    )
    return RolloutResult(
        rollout_id=rid,
        ok=True,
        reward=1.0,
        harness="pi",
        sandbox="local",
        turns=[turn],
        sequences=[SequenceRef(turns=[0], length=5)],
        model_patch=f"diff --git a/x b/x\n+{marker}\n",
        timings={"agent": 1.0},
        wall_s=2.0,
    )


class Server:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.rid = f"hard-{uuid.uuid4().hex[:12]}"
        self.marker = f"SECRET-TRACE-{uuid.uuid4().hex}"
        results = tmp / "data" / "results"
        results.mkdir(parents=True)
        (results / f"{self.rid}.json").write_text(stored_result(self.rid, self.marker).model_dump_json())
        self.gradio_dir = tmp / "gradio"
        self.gradio_dir.mkdir()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "serve.log"
        full_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SWE_GYM_") and k != "SPACE_ID"},
            "SWE_GYM_DATA_DIR": str(tmp / "data"),
            "SWE_GYM_ACCESS_TOKEN": TOKEN,
            "SWE_GYM_OPENENV_MAX_SESSIONS": str(CAP),
            "SWE_GYM_OPENENV_UNUSED_SESSION_IDLE_S": str(UNUSED_IDLE_S),
            "SWE_GYM_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "SWE_GYM_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "SWE_GYM_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
            "GRADIO_TEMP_DIR": str(self.gradio_dir),
            **env,
        }
        argv = [*ME, "serve", "--host", "0.0.0.0", "--port", str(self.port), "--engine-url", "http://127.0.0.1:9/v1"]
        with open(self.log, "w") as out:
            self.proc = procs.start(
                argv, f"{self.base}/health", env=full_env, timeout=STARTUP_S, stdout=out, stderr=out
            )

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        procs.stop(self.proc)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("guarded"), {"SWE_GYM_UI": "1"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("public"), {"SWE_GYM_UI": "0", "SWE_GYM_PUBLIC_READS": "1"})
    yield s
    s.stop()


def rpc(method: str, params: dict | None = None, rid: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})}


def create_session(server: Server, headers: dict[str, str]) -> dict:
    return httpx.post(f"{server.base}/mcp", json=rpc("openenv/session/create"), headers=headers, timeout=30).json()


async def ws_served(server: Server, headers: dict[str, str]) -> tuple[dict, dict]:
    """What a caller gets on /ws (a reset) and on WS /mcp (tools/list): each first reply."""
    ws_url = f"ws://127.0.0.1:{server.port}"
    async with websockets.connect(f"{ws_url}/ws", additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        on_ws = json.loads(await asyncio.wait_for(ws.recv(), 30))
    async with websockets.connect(f"{ws_url}/mcp", additional_headers=headers) as ws:
        await ws.send(json.dumps(rpc("tools/list")))
        on_mcp = json.loads(await asyncio.wait_for(ws.recv(), 30))
    return on_ws, on_mcp


def assert_served(on_ws: dict, on_mcp: dict) -> None:
    assert on_ws["type"] == "observation" and on_ws["data"]["observation"]["metadata"]["status"] == "ready", on_ws
    assert any(t["name"] == "run_rollout" for t in on_mcp["result"]["tools"]), on_mcp


# -- uploads ----------------------------------------------------------------------------------------------------------
def test_uploads_are_off_and_nothing_is_served_back(guarded):
    s = guarded
    payload = f"STRANGER-FILE-{uuid.uuid4().hex}".encode()
    with httpx.Client(base_url=s.base, timeout=30) as http:
        for headers in ({}, AUTH):  # the UI takes no files: nobody uploads, token or not
            for path in ("/web/gradio_api/upload", "/web/gradio_api/upload?upload_id=x", "/web/upload"):
                r = http.post(path, files={"files": ("a.txt", payload, "text/plain")}, headers=headers)
                assert r.status_code == 403 and "takes no files" in r.json()["detail"], (path, r.status_code, r.text)
        for path in ("/web/gradio_api/file=/etc/hostname", "/web/gradio_api/file=http://127.0.0.1:9/x"):
            r = http.get(path)
            assert r.status_code == 403, (path, r.status_code)
        assert http.get("/web/").status_code == 200  # the UI itself is still there
        assert http.get("/web/config").status_code == 200
    stored = [p for p in s.gradio_dir.rglob("*") if p.is_file() and payload in p.read_bytes()]
    assert stored == []
    assert s.logged().count("refused POST /web/gradio_api/upload") >= 2


# -- OpenEnv sessions -------------------------------------------------------------------------------------------------
async def test_sessions_need_the_token_on_every_path(guarded):
    s = guarded
    for _ in range(CAP + 1):  # strangers: every creation refused, none counted
        reply = create_session(s, {})
        assert "access token required" in reply["error"]["message"] and "result" not in reply, reply
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws") as ws:
        refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert refused["data"]["code"] == "ACCESS_DENIED" and "access token required" in refused["data"]["message"]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/mcp") as ws:
        refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert "access token required" in refused["error"]["message"], refused
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{s.base}/health")).json()["openenv_sessions"] == 0
    # the token holder: served on every path
    assert "session_id" in create_session(s, AUTH)["result"]
    assert_served(*await ws_served(s, AUTH))
    assert s.logged().count("refused POST /mcp openenv/session/create") >= CAP + 1
    assert "refused WS /ws" in s.logged() and "refused WS /mcp" in s.logged()


async def test_strangers_at_the_cap_never_lock_out_a_token_holder(public):
    """Public reads: strangers may open sessions. 21 at a cap of 20: the 21st is refused; the token holder is
    served on /ws, WS /mcp and POST /mcp; the strangers' unused sessions expire after the short idle timeout."""
    s = public
    t0 = time.monotonic()
    replies = [create_session(s, {}) for _ in range(CAP + 1)]
    assert all("result" in r for r in replies[:CAP]), replies[:CAP]
    assert replies[CAP]["error"]["data"]["max_sessions"] == CAP and "capacity" in replies[CAP]["error"]["message"]
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws") as ws:  # a stranger's /ws: at capacity too
        first = json.loads(await asyncio.wait_for(ws.recv(), 30))
    took = time.monotonic() - t0
    assert took < UNUSED_IDLE_S, f"opening the sessions took {took:.1f} s: the first ones may have expired already"
    assert first["data"]["code"] == "CAPACITY_REACHED", first
    assert_served(*await ws_served(s, AUTH))
    assert "session_id" in create_session(s, AUTH)["result"]
    await asyncio.sleep(UNUSED_IDLE_S + 1)  # the strangers' sessions never did anything: gone
    assert "result" in create_session(s, {})
    # a websocket that asked for something is past the short timeout, however long it then stays silent
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws", additional_headers=AUTH) as ws:
        await ws.send(json.dumps({"type": "state"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "state"
        await asyncio.sleep(UNUSED_IDLE_S + 1.5)
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "observation"
    # a stranger's websocket that never sends anything is closed after the same short timeout
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws") as ws:
        t0 = time.monotonic()
        closing = json.loads(await asyncio.wait_for(ws.recv(), UNUSED_IDLE_S + 10))
        assert closing["data"]["code"] == "SESSION_ERROR" and "nothing sent" in closing["data"]["message"]
        assert time.monotonic() - t0 < UNUSED_IDLE_S + 5


# -- bodies nothing can parse -----------------------------------------------------------------------------------------
async def test_unparseable_bodies_are_a_4xx_with_one_line_everywhere(guarded):
    s = guarded
    mcp_headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    cases = [
        ("bare JSON-RPC", "/mcp", DEEP, {}),
        ("MCP", "/mcp", DEEP, {**mcp_headers, "mcp-protocol-version": "2025-06-18"}),
        ("MCP session", "/mcp", DEEP, {**mcp_headers, "mcp-session-id": "x"}),
        ("invalid", "/mcp", "{nope", {}),
        ("not UTF-8", "/mcp", b"\xff\xfe{}", {}),
        ("task API", "/swe_gym_env/tasks", DEEP, {"content-type": "application/json"}),
        ("UI queue", "/web/gradio_api/queue/join", DEEP, {"content-type": "application/json"}),
    ]
    async with httpx.AsyncClient(base_url=s.base, timeout=30) as http:
        for name, path, body, headers in cases:
            r = await http.post(path, content=body, headers={**AUTH, **headers})
            assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
            assert "\n" not in r.text.strip() and "recursion" not in r.text.lower(), (name, r.text[:300])
            if path == "/mcp":
                message = r.json()["error"]["message"]
                assert message.startswith("Parse error: "), (name, message)
        deep = await http.post("/mcp", content=DEEP, headers=AUTH)
        assert "nested deeper than" in deep.json()["error"]["message"]
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/ws", additional_headers=AUTH, max_size=None) as ws:
        for body in (DEEP, "{nope"):
            await ws.send(body)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert reply["data"]["code"] == "INVALID_JSON" and "recursion" not in reply["data"]["message"], reply
        await ws.send(json.dumps({"type": "reset", "data": {}}))  # the socket still serves
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "observation"
    async with websockets.connect(f"ws://127.0.0.1:{s.port}/mcp", additional_headers=AUTH, max_size=None) as ws:
        await ws.send(DEEP)
        reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert reply["error"]["code"] == -32700 and "nested deeper than" in reply["error"]["message"], reply
        await ws.send(json.dumps(rpc("tools/list")))
        assert "tools" in json.loads(await asyncio.wait_for(ws.recv(), 30))["result"]
    assert "Traceback" not in s.logged() and "RecursionError" not in s.logged()


# -- connections ------------------------------------------------------------------------------------------------------
def test_trickled_headers_are_cut_at_the_timeout(guarded):
    s = guarded
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        cut_after = None
        for i in range(40):  # one header byte every 0.25 s, for up to 10 s: never finishing the headers
            try:
                sock.sendall(b"X-Slow: " if i == 0 else b"a")
                sock.settimeout(0.25)
                if sock.recv(1024) == b"":
                    cut_after = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except OSError:  # reset by the server
                cut_after = time.monotonic() - t0
                break
    assert cut_after is not None, "trickled headers held the connection for 10 s"
    assert HEADER_TIMEOUT_S - 0.5 <= cut_after <= HEADER_TIMEOUT_S + 2.5, cut_after
    assert "request headers not complete within" in s.logged()
    # a prompt request on a connection is unaffected, and a keep-alive connection serves a second one
    with httpx.Client(base_url=s.base) as http:
        assert http.get("/health").status_code == 200
        time.sleep(HEADER_TIMEOUT_S / 2)
        assert http.get("/health").status_code == 200


def test_a_silent_body_gets_408(guarded):
    s = guarded
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        t0 = time.monotonic()
        head = "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head.encode() + b'{"jsonrpc": ')
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        took = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert BODY_TIMEOUT_S - 0.5 <= took <= BODY_TIMEOUT_S + 3, took


def test_connections_over_the_cap_get_503(guarded):
    s = guarded
    socks = []
    try:
        for _ in range(MAX_CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert extra.recv(4096).startswith(b"HTTP/1.1 503"), "a connection over the cap was served"
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.5)
    assert httpx.get(f"{s.base}/health").status_code == 200  # below the cap again
    assert "too many open connections" in s.logged()


# -- logging ----------------------------------------------------------------------------------------------------------
async def test_each_refused_request_logs_one_line(guarded):
    s = guarded
    before = s.logged().splitlines()
    async with Client(StreamableHttpTransport(f"{s.base}/mcp")) as c:
        with pytest.raises(Exception, match="access token required"):
            await c.read_resource_mcp(f"swe-gym://rollouts/{s.rid}/result")
        for name, args in (("list_rollouts", {}), ("get_rollout", {"rollout_id": s.rid}), ("cancel_rollout", {})):
            res = await c.call_tool(
                name, {"rollout_id": s.rid, **args} if name != "list_rollouts" else args, raise_on_error=False
            )
            assert res.is_error and "access token required" in res.content[0].text, (name, res)
    async with httpx.AsyncClient(base_url=s.base) as http:
        assert (await http.get(f"/rollouts/{s.rid}")).status_code == 401
        assert (await http.post("/capture/sessions", json={}, headers=AUTH)).status_code == 401  # not the admin key
    await asyncio.sleep(0.5)
    new = s.logged().splitlines()[len(before) :]
    assert len(new) == 6 and all(line.startswith("refused ") for line in new), new
    assert [line.split(":")[0].split(" from ")[0] for line in new] == [
        "refused resources/read",
        "refused list_rollouts",
        "refused get_rollout",
        "refused cancel_rollout",
        f"refused GET /rollouts/{s.rid}",
        "refused POST /capture/sessions",
    ]
    assert TOKEN not in s.logged()


# -- the UI's paging --------------------------------------------------------------------------------------------------
def gradio_call(server: Server, fn_name: str, data: list, session_hash: str) -> str:
    """Call the UI's event handler ``fn_name`` as a browser would (queue/join, then the session's event stream) and
    return everything it answered, as text."""
    base = f"{server.base}/web/gradio_api"
    with httpx.Client(timeout=60) as http:
        config = http.get(f"{server.base}/web/config").json()
        dep = next(d for d in config["dependencies"] if d["api_name"] == fn_name)
        body = {"data": data, "fn_index": dep["id"], "session_hash": session_hash, "event_data": None}
        body["trigger_id"] = dep["targets"][0][0]
        joined = http.post(f"{base}/queue/join", json=body)
        assert joined.status_code == 200, joined.text
        event_id = joined.json()["event_id"]
        seen = []
        with http.stream("GET", f"{base}/queue/data", params={"session_hash": session_hash}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("event_id") != event_id:
                    continue
                seen.append(json.dumps(msg))
                if msg.get("msg") == "process_completed":
                    break
    return "\n".join(seen)


def test_ui_paging_shows_nothing_without_the_token(guarded):
    s = guarded
    viewer = uuid.uuid4().hex[:11]
    shown = gradio_call(s, "show_rollout", [s.rid, TOKEN], viewer)  # the viewer opens the rollout with the token
    assert s.marker in shown
    allowed = gradio_call(s, "go_to_1", [1, TOKEN, ""], viewer)  # and may page it
    assert s.marker in allowed
    for fn, data in (("earlier_1", ["", ""]), ("later_1", ["", ""]), ("go_to_1", [1, "", ""])):
        got = gradio_call(s, fn, data, viewer)  # a stranger naming the viewer's Gradio session, no token
        assert s.marker not in got and "access token required" in got, (fn, got[:500])
    wrong = gradio_call(s, "go_to_1", [1, "not-the-token", "nor-this"], viewer)
    assert s.marker not in wrong
    assert "refused UI paging" in s.logged()


# -- the parser every surface uses ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("[" * 128 + "]" * 128, None),
        ('{"a":' * 128 + "1" + "}" * 128, None),
        ('["' + "[" * 500 + '", {"k": "{{{{"}]', None),  # brackets inside strings do not nest
        ("[" * 129 + "]" * 129, "JSON nested deeper than 128 levels"),
        (b"[" * 50_000 + b"]" * 50_000, "JSON nested deeper than 128 levels"),
        ("{nope", "invalid JSON at line 1 column 2"),
        (b'{"a": "\xff"}', "body is not UTF-8 text"),
    ],
)
def test_parse_json_refuses_in_one_line(body, why):
    from swe_gym_env.server.security import BodyError, parse_json

    if why is None:
        assert parse_json(body) is not None
    else:
        with pytest.raises(BodyError) as e:
            parse_json(body)
        assert str(e.value) == why
