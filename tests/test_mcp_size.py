"""A rollout at real size over MCP with the clients users pick, at their default settings (issue 34).

One real rollout shared by the module: Pi on the bundled task against the built-in engine (`script:`: 99 bash calls
printing `seq 1 360`, then done: 100 model calls, the last prompt over 128k tokens), through a real `serve` process.
It is started by the official MCP Python SDK (`examples/mcp_client.py`, defaults untouched: its 1 MiB SSE event limit
applies), and then read back by every other client:

- the Python SDK: the call returns the summary (≤ 256 KB), the resource pages rebuild the stored result byte for
  byte, and rows from it equal the websocket client's rows;
- plain HTTP: `GET /rollouts/{id}/result` whole, gzip and in ranges, equal to the file;
- the TypeScript SDK (`@modelcontextprotocol/sdk` 1.32.2 from npm, installed once into a cache dir; `examples/
  mcp_client.mjs`) and the MCP Inspector's CLI (`mcp-inspector --cli` of `@modelcontextprotocol/inspector` 0.21.1:
  `@modelcontextprotocol/inspector-cli` 1.0.3 installed alone does not start), both run by Node;
- `SweGymClient` (whole result; and through a proxy that cuts its connection mid-fetch: it recovers);
- OpenEnv's own client (from .openenv-venv, unchanged: the websocket path keeps the compact result);
- the UI: `/web/?rollout=ID` in a real headless Chromium shows the finished rollout's phase timeline.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest

from swe_gym_env.client import SweGymClient, SweGymWSClient
from swe_gym_env.client.trainer import training_rows
from swe_gym_env.wire import RolloutResult

from helpers import Stack

REPO = Path(__file__).resolve().parent.parent
CALLS = 100
SEQ = 360  # `seq 1 360`: ~1.36k tokens of tool output a call (SmolLM2's tokenizer: a token per digit)
SDK = "@modelcontextprotocol/sdk@1.32.2"
INSPECTOR = (
    "@modelcontextprotocol/inspector@0.21.1"  # inspector-cli 1.0.3 alone cannot start (reads a parent package.json)
)
NPM_CACHE = Path(os.environ.get("SWE_GYM_CACHE_DIR", Path.home() / ".cache" / "swe_gym_env")) / "test-npm"
OPENENV_PY = REPO / ".openenv-venv" / "bin" / "python"
LIMIT_SUMMARY = 256 * 1024
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.anyio]


def require(ok: bool, why: str) -> None:
    if not ok:
        if CI:
            pytest.fail(why)
        pytest.skip(why)


def npm_package(spec: str) -> Path:
    """An npm package installed once into a cache dir the tests own (`<cache>/test-npm/<name@version>`)."""
    require(shutil.which("npm") is not None and shutil.which("node") is not None, "node/npm not installed")
    where = NPM_CACHE / spec.replace("/", "+")
    name = spec.rsplit("@", 1)[0]
    if not (where / "node_modules" / name / "package.json").is_file():
        tmp = where.with_name(where.name + f".{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        (tmp / "package.json").write_text('{"private": true}')
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", spec],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            require(False, f"npm install {spec} failed (no registry?): {proc.stderr[-500:]}")
        shutil.rmtree(where, ignore_errors=True)
        tmp.rename(where)
    return where


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    from swe_gym_env.server.agents.harnesses.pi import PiHarness

    require(shutil.which("node") is not None and shutil.which("bwrap") is not None, "node or bubblewrap missing")
    require(PiHarness().cli_js(PiHarness().install_dir()).is_file(), "Pi not installed: run `swe-gym-env setup`")
    tmp = tmp_path_factory.mktemp("mcp-size")
    script = tmp / "script.json"
    steps = [{"tool_calls": [{"name": "bash", "arguments": {"command": f"seq 1 {SEQ}"}}]}] * (CALLS - 1)
    script.write_text(json.dumps([*steps, {"content": "done"}]))
    data = tmp / "data"
    env = {"SWE_GYM_DATA_DIR": str(data), "SWE_GYM_ENGINE_MAX_MODEL_LEN": "200000"}
    stack = Stack(f"script:{script}", env=env, ui=True)
    try:
        rid = f"long-{uuid.uuid4().hex[:12]}"
        args = {"harness": "pi", "max_model_calls": CALLS + 5, "deadline_s": 1200, "rollout_id": rid}
        out = tmp / "python-sdk.json"
        example = [sys.executable, str(REPO / "examples" / "mcp_client.py"), stack.mcp_url]
        proc = subprocess.run(
            [*example, "--args", json.dumps(args), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        stored = (data / "results" / f"{rid}.json").read_bytes()
        yield {"stack": stack, "rid": rid, "report": report, "fetched": out.read_bytes(), "stored": stored}
    finally:
        stack.stop()


def test_python_sdk_gets_the_summary_and_rebuilds_the_result_from_pages(long):
    r, stored = long["report"], long["stored"]
    assert r["ok"] is True and r["sha256_ok"] is True, r
    assert r["summary_bytes"] <= LIMIT_SUMMARY and r["pages"] >= 2, r
    assert long["fetched"] == stored  # byte for byte
    result = RolloutResult.model_validate_json(stored)
    assert len(result.turns) == CALLS and result.turns[-1].prompt_len >= 128_000, (
        len(result.turns),
        result.turns[-1].prompt_len,
    )
    print(f"\nsummary {r['summary_bytes']} B, {r['pages']} pages of {len(stored)} B, fetched in {r['fetch_s']} s")


async def test_rows_from_the_pages_equal_the_websocket_clients(long):
    mine = training_rows(RolloutResult.model_validate_json(long["fetched"]))
    async with SweGymWSClient(long["stack"].mcp_url.removesuffix("/mcp")) as ws:
        status = await ws.get_rollout(long["rid"])
    assert status.result is not None
    theirs = training_rows(status.result)
    assert mine and [r.model_dump() for r in mine] == [r.model_dump() for r in theirs]


def test_http_streams_the_stored_json_whole_gzipped_and_in_ranges(long):
    base = long["stack"].mcp_url.removesuffix("/mcp")
    url, stored = f"{base}/rollouts/{long['rid']}/result", long["stored"]
    with httpx.Client(timeout=60) as http:
        with http.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as r:
            assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
            raw = b"".join(r.iter_raw())
        assert gzip.decompress(raw) == stored and len(raw) < len(stored)
        plain = http.get(url, headers={"Accept-Encoding": "identity"})
        assert plain.content == stored and plain.headers["x-content-sha256"] == plain.headers["etag"].strip('"')
        parts, step = [], 700_001
        for start in range(0, len(stored), step):
            got = http.get(url, headers={"Range": f"bytes={start}-{start + step - 1}"})
            assert got.status_code == 206, got.status_code
            parts.append(got.content)
        assert b"".join(parts) == stored
        assert http.get(url, headers={"Range": "bytes=-10"}).content == stored[-10:]
        assert http.get(url, headers={"Range": f"bytes={len(stored)}-"}).status_code == 416


def test_typescript_sdk_at_its_defaults(long, tmp_path):
    where = npm_package(SDK)
    runner = where / "mcp_client.mjs"
    shutil.copy(REPO / "examples" / "mcp_client.mjs", runner)  # resolved against the package's node_modules
    out = tmp_path / "ts.json"
    args = json.dumps({"rollout_id": long["rid"], "harness": "pi"})
    proc = subprocess.run(
        ["node", str(runner), long["stack"].mcp_url, args, "", str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["ok"] is True and r["sha256_ok"] is True and r["pages"] >= 2 and r["links"] >= 2, r
    assert r["summary_bytes"] <= LIMIT_SUMMARY, r
    assert out.read_bytes() == long["stored"]


def test_inspector_cli_calls_the_tool_and_reads_a_page(long):
    where = npm_package(INSPECTOR)
    cli = where / "node_modules" / ".bin" / "mcp-inspector"
    base = [str(cli), "--cli", long["stack"].mcp_url, "--transport", "http"]
    call = subprocess.run(
        [*base, "--method", "tools/call", "--tool-name", "get_rollout", "--tool-arg", f"rollout_id={long['rid']}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    require(call.returncode == 0 or "fetch failed" not in call.stderr, f"inspector CLI offline: {call.stderr[-300:]}")
    assert call.returncode == 0, call.stderr[-2000:]
    status = json.loads(call.stdout)["structuredContent"]
    summary = status["result_summary"]
    assert status["state"] == "finished" and summary["pages"] >= 2 and len(call.stdout) <= LIMIT_SUMMARY
    page = subprocess.run(
        [*base, "--method", "resources/read", "--uri", summary["page_uris"][1]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert page.returncode == 0, page.stderr[-2000:]
    content = json.loads(page.stdout)["contents"][0]
    start, end = content["_meta"]["start"], content["_meta"]["end"]
    assert content["text"].encode() == long["stored"][start:end]


async def test_swe_gym_client_returns_it_whole(long):
    async with SweGymClient(long["stack"].mcp_url) as c:
        result = await c.run_rollout(rollout_id=long["rid"])
        status = await c.get_rollout(long["rid"])
    assert result.ok and result.model_dump_json().encode() == long["stored"]
    assert status.result is not None and status.result.model_dump_json().encode() == long["stored"]


class CuttingProxy:
    """A TCP proxy that closes its first `cuts` connections once `after` bytes have come back through them."""

    def __init__(self, port: int, after: int, cuts: int = 1) -> None:
        self.port, self.after, self.cuts = port, after, cuts
        self.cut = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port)
        cutting = self.cut < self.cuts
        seen = 0

        async def pipe(src, dst, count: bool) -> None:
            nonlocal seen
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                    if count and cutting:
                        seen += len(data)
                        if seen > self.after and self.cut < self.cuts:
                            self.cut += 1
                            raise ConnectionResetError("cut by the test")
            except (OSError, ConnectionError):
                pass
            finally:
                for w in (writer, up_w):
                    w.close()

        await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))


async def test_swe_gym_client_recovers_when_the_connection_drops_mid_fetch(long):
    port = int(long["stack"].mcp_url.split(":")[-1].split("/")[0])
    proxy = CuttingProxy(port, after=len(long["stored"]) // 2, cuts=2)
    front = await proxy.start()
    try:
        async with SweGymClient(f"http://127.0.0.1:{front}/mcp", timeout_s=300) as c:
            result = await c.run_rollout(rollout_id=long["rid"])
    finally:
        proxy.server.close()
    assert proxy.cut >= 1, "the proxy never cut a connection"
    assert result.ok and result.model_dump_json().encode() == long["stored"], result.error


OPENENV_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from openenv.core.generic_client import GenericEnvClient

    async def main():
        async with GenericEnvClient(base_url=sys.argv[1], message_timeout_s=600) as env:
            await env.reset()
            step = await env.step(
                {"type": "call_tool", "tool_name": "get_rollout", "arguments": {"rollout_id": sys.argv[2]}}
            )
            print(json.dumps(step.observation["result"]["data"]["result"]))

    asyncio.run(main())
    """
)


def test_openenv_client_unchanged_gets_the_compact_result(long, tmp_path):
    require(OPENENV_PY.is_file(), "OpenEnv's client missing: run `bash scripts/setup_openenv.sh`")
    script = tmp_path / "openenv_get.py"
    script.write_text(OPENENV_SCRIPT)
    base = long["stack"].mcp_url.removesuffix("/mcp")
    proc = subprocess.run(
        [str(OPENENV_PY), str(script), base, long["rid"]], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = RolloutResult.model_validate_json(proc.stdout.strip().splitlines()[-1])
    assert got.model_dump_json().encode() == long["stored"]


def test_ui_shows_the_finished_rollouts_phase_timeline(long):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    require(chromium is not None, "chromium not installed: bash scripts/setup_ui.sh")
    base = long["stack"].mcp_url.removesuffix("/mcp")
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=20000",
            "--dump-dom",
            f"{base}/web/?rollout={long['rid']}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = proc.stdout
    assert 'id="phase-timeline"' in dom, dom[-2000:]
    for phase in ("boot", "agent", "grade"):
        assert f'data-phase="{phase}"' in dom, phase
    assert "done: ok" in dom and f"{CALLS} calls" in dom
