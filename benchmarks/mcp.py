"""`swe-gym-env bench mcp`: long results over MCP (issue 34): the summary's size, the page count, the fetch time,
and the server's RSS idle vs its peak while 8 clients fetch 8 results at once.

The results have the shape of `bench result` (one agent conversation, ~88 sampled tokens and ~7k tool-output tokens
a call: CALLS calls, the last prompt ~7k x CALLS tokens), recorded through the capture proxy's own recording and
assembled as the pipeline does, then stored (8 copies under their own ids) in the results dir of a real `serve`
process (no UI). Each client is the official MCP Python SDK (`mcp`) at its defaults: `get_rollout` (the summary),
then `resources/read` of every page, the whole checked against the summary's SHA-256. The server's RSS is sampled
every 10 ms from /proc while the fetches run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from swe_gym_env.benchmarks import emit, pct
from swe_gym_env.benchmarks.result import Agent
from swe_gym_env.core import procs
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.rollout.record import RunState
from swe_gym_env.wire import RolloutResult

CALLS = 100
CLIENTS = 8
MB = 1024 * 1024


def long_result(calls: int) -> RolloutResult:
    agent = Agent()
    proxy = CaptureProxy(None)
    session, _ = proxy.open_session(
        EngineTarget("http://engine/v1", "m"), max_calls=calls, max_tokens=1024, session_id="bench"
    )
    for k in range(calls):
        up, call = agent.call(k)
        proxy._record(session, DIALECTS["openai-chat"], up, call, streamed=True, wall=0.5)
    proxy.close_session(session)
    trace = RunState(session=session).trace()
    return RolloutResult(rollout_id="bench", ok=True, reward=1.0, harness="pi", sandbox="local", **trace)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _fetch(url: str, rid: str) -> dict:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import TextResourceContents

    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        t0 = time.perf_counter()
        res = await s.call_tool("get_rollout", {"rollout_id": rid})
        summary = (res.structured_content or {})["result_summary"]
        size = len(res.model_dump_json(by_alias=True, exclude_none=True))
        whole = bytearray()
        for uri in summary["page_uris"]:
            page = (await s.read_resource(uri)).contents[0]
            assert isinstance(page, TextResourceContents), uri
            whole += page.text.encode()
        took = time.perf_counter() - t0
    if hashlib.sha256(whole).hexdigest() != summary["sha256"]:
        raise AssertionError(f"{rid}: the pages do not make the result the summary names")
    return {"summary_bytes": size, "pages": summary["pages"], "bytes": len(whole), "s": took}


def _store_copies(result: RolloutResult, results: Path) -> list[str]:
    """CLIENTS copies of ``result`` under their own ids in the results dir; their ids."""
    results.mkdir(parents=True)
    ids = [f"bench-mcp-{k:02d}" for k in range(CLIENTS)]
    for rid in ids:
        (results / f"{rid}.json").write_text(result.model_copy(update={"rollout_id": rid}).model_dump_json())
    return ids


def _peak_rss_while(pid: int, fn):
    """``fn()``'s value, and the RSS samples of process ``pid`` taken every 10 ms while it ran."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(_rss(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        return fn(), samples
    finally:
        done.set()
        sampler.join()


def _fetches(url: str, pid: int, ids: list[str]) -> dict:
    """The server's idle RSS, one client's fetch alone, then every client's at once (its wall and RSS samples)."""
    time.sleep(2.0)
    idle = _rss(pid)
    one = asyncio.run(_fetch(url, ids[0]))  # alone (and the manifests of one file scanned)

    async def all_at_once() -> list[dict]:
        return await asyncio.gather(*(_fetch(url, rid) for rid in ids))

    def timed() -> tuple[list[dict], float]:
        t0 = time.perf_counter()
        many = asyncio.run(all_at_once())
        return many, time.perf_counter() - t0

    (many, wall), samples = _peak_rss_while(pid, timed)
    return {"idle": idle, "one": one, "many": many, "wall": wall, "samples": samples, "after": _rss(pid)}


def _served_fetches(data: Path, ids: list[str]) -> dict:
    """Measure the fetches (`_fetches`) from a fresh `serve` process over the data dir ``data``."""
    port = procs.free_port()
    env = {"SWE_GYM_DATA_DIR": str(data), "SWE_GYM_UI": "0"}
    argv = [sys.executable, "-m", "swe_gym_env.cli", "serve", "--port", str(port)]
    server = procs.start(argv, f"http://127.0.0.1:{port}/health", env=env, timeout=180)
    try:
        return _fetches(f"http://127.0.0.1:{port}/mcp", server.pid, ids)
    finally:
        procs.stop(server)


def run(as_json: bool, quick: bool = False, calls: int = CALLS) -> int:
    calls = 20 if quick else calls
    t0 = time.perf_counter()
    result = long_result(calls)
    build_s = time.perf_counter() - t0
    last_prompt = result.turns[-1].prompt_len
    with tempfile.TemporaryDirectory() as tmp:
        ids = _store_copies(result, Path(tmp) / "data" / "results")
        del result
        m = _served_fetches(Path(tmp) / "data", ids)
    one, wall, idle, after = m["one"], m["wall"], m["idle"], m["after"]
    peak = max(m["samples"], default=idle)
    fetch = [x["s"] for x in m["many"]]
    doc = {
        "calls": calls,
        "last_prompt_tokens": last_prompt,
        "result_bytes": one["bytes"],
        "summary_bytes": one["summary_bytes"],
        "pages": one["pages"],
        "fetch_one_s": round(one["s"], 3),
        "fetch_8_at_once": {"wall_s": round(wall, 3), "p50_s": round(pct(fetch, 50), 3), "max_s": round(max(fetch), 3)},
        "server_rss_mb": {
            "idle": round(idle / MB, 1),
            "peak_8_fetches": round(peak / MB, 1),
            "after": round(after / MB, 1),
        },
        "build_result_s": round(build_s, 1),
    }
    rows = [
        ["result", f"{calls} calls, last prompt {last_prompt:,} tokens, {one['bytes'] / MB:.2f} MB"],
        ["summary", f"{one['summary_bytes']:,} B (tools/call message)"],
        ["pages", one["pages"]],
        ["fetch, one client", f"{one['s']:.2f} s"],
        ["fetch, 8 clients at once", f"wall {wall:.2f} s, p50 {pct(fetch, 50):.2f} s, max {max(fetch):.2f} s"],
        ["server RSS", f"idle {idle / MB:.0f} MB, peak during 8 fetches {peak / MB:.0f} MB"],
    ]
    emit(doc, as_json, rows, ["what", "measured"])
    return 0
