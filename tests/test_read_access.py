"""Who may read rollouts (issue 34, item 3), against real `serve --host 0.0.0.0` processes (reached on 127.0.0.1).

With `SWE_GYM_ACCESS_TOKEN` set and no opt-in, every way to list or read a rollout needs the token: MCP
`list_rollouts` / `get_rollout`, the result resources, `GET /rollouts/{id}` and `/rollouts/{id}/result`, OpenEnv's
bare JSON-RPC on POST /mcp and its websocket, and the UI (its page for `/web/?rollout=ID`, in a real headless
Chromium). With `SWE_GYM_PUBLIC_READS=1` they are public and starting work still needs the token. `/health` says
which; it, the task list and the UI's shell stay public, and nothing refused ever carries the stored result (each
stored result carries a marker this test looks for in every answer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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

TOKEN = "tok-" + uuid.uuid4().hex
ME = [sys.executable, "-m", "swe_gym_env.cli"]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


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
        agent_log_tail=marker,
        timings={"boot": 0.5, "agent": 1.0, "grade": 0.5},
        wall_s=2.0,
    )


class Server:
    def __init__(self, tmp: Path, env: dict[str, str], ui: bool = False) -> None:
        self.rid = f"read-{uuid.uuid4().hex[:12]}"
        self.marker = f"SECRET-TRACE-{uuid.uuid4().hex}"
        results = tmp / "data" / "results"
        results.mkdir(parents=True)
        (results / f"{self.rid}.json").write_text(stored_result(self.rid, self.marker).model_dump_json())
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        full_env = {"SWE_GYM_DATA_DIR": str(tmp / "data"), "SWE_GYM_UI": "1" if ui else "0", **env}
        argv = [*ME, "serve", "--host", "0.0.0.0", "--port", str(self.port)]
        self.proc = procs.start(argv, f"{self.base}/health", env=full_env, timeout=180)

    def stop(self) -> None:
        procs.stop(self.proc)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("guarded"), {"SWE_GYM_ACCESS_TOKEN": TOKEN, "SWE_GYM_PUBLIC_READS": ""}, ui=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("public"), {"SWE_GYM_ACCESS_TOKEN": TOKEN, "SWE_GYM_PUBLIC_READS": "1"})
    yield s
    s.stop()


def mcp(server: Server, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(StreamableHttpTransport(f"{server.base}/mcp", headers=headers))


async def mcp_reads(server: Server, token: str | None) -> dict[str, str]:
    """What each MCP read answers: the JSON of a success, or `refused: <text>`."""
    out: dict[str, str] = {}
    async with mcp(server, token) as c:
        for name, args in (
            ("list_rollouts", {}),
            ("get_rollout", {"rollout_id": server.rid}),
            ("get_rollout", {"rollout_id": server.rid, "result_form": "compact"}),
        ):
            res = await c.call_tool(name, args, raise_on_error=False)
            text = " ".join(getattr(b, "text", "") for b in res.content)
            out[f"{name}{args.get('result_form', '')}"] = f"refused: {text}" if res.is_error else text
        try:
            read = await c.read_resource_mcp(f"swe-gym://rollouts/{server.rid}/result")
            out["resource"] = read.contents[0].text
        except Exception as e:  # the MCP error the server answered
            out["resource"] = f"refused: {e}"
        started = await c.call_tool("run_rollout", {"engine": "nope"}, raise_on_error=False)
        out["run_rollout"] = json.dumps(started.structured_content)
    return out


def http_reads(server: Server, token: str | None) -> dict[str, httpx.Response]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server.base, headers=headers, timeout=30) as http:
        return {
            "status": http.get(f"/rollouts/{server.rid}"),
            "result": http.get(f"/rollouts/{server.rid}/result"),
            "health": http.get("/health"),
            "tasks": http.post("/swe_gym_env/tasks", json={"split": "bundled"}),
        }


def openenv_reads(server: Server, token: str | None) -> list[dict]:
    """OpenEnv's reads over bare JSON-RPC: a session, then list and get; a refused session is the one reply (opening
    a session needs what reading needs, issue 43)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server.base, headers=headers, timeout=30) as http:
        sid = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).json()
        if "error" in sid:
            return [sid]
        sid = sid["result"]["session_id"]
        replies = []
        for name, args in (("list_rollouts", {}), ("get_rollout", {"rollout_id": server.rid})):
            params = {"session_id": sid, "name": name, "arguments": args}
            replies.append(
                http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}).json()
            )
        return replies


async def ws_read(server: Server, token: str | None) -> dict:
    """A get_rollout step on /ws; a refused session is its first message (before any step)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=headers) as ws:
        step = {"type": "call_tool", "tool_name": "get_rollout", "arguments": {"rollout_id": server.rid}}
        try:
            await ws.send(json.dumps({"type": "step", "data": step}))
        except websockets.ConnectionClosed:
            pass
        return json.loads(await ws.recv())


async def test_with_a_token_and_no_opt_in_every_read_needs_the_token(guarded):
    s = guarded
    anon = await mcp_reads(s, None)
    for name, got in anon.items():
        assert s.marker not in got, name
        if name != "run_rollout":
            assert got.startswith("refused:") and "access token required" in got, (name, got[:300])
    assert "access token required" in json.loads(anon["run_rollout"])["error"]
    wrong = await mcp_reads(s, "not-the-token")
    assert all(s.marker not in v for v in wrong.values()) and wrong["list_rollouts"].startswith("refused:")

    mine = await mcp_reads(s, TOKEN)
    assert s.rid in mine["list_rollouts"] and s.rid in mine["get_rollout"]
    assert s.marker in mine["get_rolloutcompact"] and s.marker in mine["resource"]

    http = http_reads(s, None)
    for name in ("status", "result"):
        assert http[name].status_code == 401 and s.marker not in http[name].text, name
    assert http["health"].status_code == 200 and http["health"].json()["access"]["reads"] == "token"
    assert http["tasks"].status_code == 200 and s.marker not in http["health"].text + http["tasks"].text
    ok = http_reads(s, TOKEN)
    assert ok["status"].status_code == 200 and s.marker in ok["status"].text
    assert (
        ok["result"].status_code == 200 and RolloutResult.model_validate_json(ok["result"].content).rollout_id == s.rid
    )

    for reply in openenv_reads(s, None):
        assert "error" in reply and s.marker not in json.dumps(reply), reply
        assert "access token required" in reply["error"]["message"]
    assert all("result" in r for r in openenv_reads(s, TOKEN))
    refused = await ws_read(s, None)
    assert s.marker not in json.dumps(refused)
    assert refused["type"] == "error" and "access token required" in refused["data"]["message"]
    allowed = await ws_read(s, TOKEN)
    assert s.marker in json.dumps(allowed)


def test_the_ui_shows_no_rollout_without_the_token(guarded):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if CI:
            pytest.fail("chromium not installed: bash scripts/setup_ui.sh")
        pytest.skip("chromium not installed: bash scripts/setup_ui.sh")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--dump-dom"]
    dom = subprocess.run(
        [chromium, *flags, f"{guarded.base}/web/?rollout={guarded.rid}"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "access token required to see rollouts" in dom, dom[-2000:]
    assert guarded.marker not in dom and 'id="phase-timeline"' not in dom


async def test_public_reads_opt_in(public):
    s = public
    anon = await mcp_reads(s, None)
    assert s.rid in anon["list_rollouts"] and s.marker in anon["get_rolloutcompact"] and s.marker in anon["resource"]
    assert "access token required" in json.loads(anon["run_rollout"])["error"]  # starting work still needs it
    http = http_reads(s, None)
    assert http["status"].status_code == 200 and http["result"].status_code == 200
    assert http["health"].json()["access"] == {"mode": "token", "reads": "public", "notice": None}
    assert all("result" in r for r in openenv_reads(s, None))
