"""`swe-gym-env bench capture`: direct engine calls vs the same calls through /capture, in one run.

Three processes: a fast stub engine (vLLM's reply shape), the real server (`swe-gym-env serve`, durable capture
store on), and this load generator. Sessions are minted through the admin API; each simulated agent makes its calls
one after another, N agents at once. Reported per configuration (dialect, prompt size, streaming, concurrency):
latency p50/p99 direct and through, the difference, calls/s, and for streams the time to first chunk.

``dialects`` (``--dialects chat,responses,anthropic,gemini``): the same call in each API dialect /capture speaks
(the same system prompt, user text and token cap), so the added latency includes the dialect's translation both ways;
direct is always the engine's own chat call. The stub engine sizes its prompt ids from the chat request's
``metadata.prompt_tokens``, which the translated dialects do not carry (a parameter they report as ignored): it then
answers with its default of STUB_PROMPT_TOKENS ids, so translated dialects are measured at that prompt size only.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack

from swe_gym_env.benchmarks import emit, pct, stack, summary_ms
from swe_gym_env.procs import free_port

CONCURRENCY = (1, 64, 256)
SIZES = (1000, 8000)
CALLS = {1: 100, 64: 512, 256: 1024}
STUB_PROMPT_TOKENS = 1000  # the stub engine's prompt length when the request does not say (translated dialects)
DIALECTS = ("chat", "responses", "anthropic", "gemini")
SYSTEM = "You are a coding agent."


def _request(size: int, stream: bool) -> dict:
    body = {
        "model": "agent-model",
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "word " * size},  # ~the prompt's size in bytes, as an agent would send
        ],
        "metadata": {"prompt_tokens": size},  # tells the stub how many prompt ids to return
        "max_tokens": 64,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _dialect_request(dialect: str, size: int, stream: bool) -> tuple[str, dict]:
    """The same call in ``dialect``: its path under /capture and its body."""
    words = "word " * size
    if dialect == "chat":
        return "/v1/chat/completions", _request(size, stream)
    if dialect == "responses":
        user = [{"role": "user", "content": [{"type": "input_text", "text": words}]}]
        body = {"model": "agent-model", "instructions": SYSTEM, "input": user, "max_output_tokens": 64}
        return "/v1/responses", {**body, "stream": stream, "store": False}
    if dialect == "anthropic":
        messages = [{"role": "user", "content": words}]
        body = {"model": "agent-model", "system": SYSTEM, "messages": messages, "max_tokens": 64}
        return "/v1/messages", {**body, "stream": stream}
    if dialect == "gemini":
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body = {
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "contents": [{"role": "user", "parts": [{"text": words}]}],
            "generationConfig": {"maxOutputTokens": 64},
        }
        return f"/v1beta/models/agent-model:{method}", body
    raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")


async def _agent(session, url: str, headers: dict, body: dict, stream: bool, calls: int, lat: list, ttft: list) -> None:
    for _ in range(calls):
        t0 = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
            if stream:
                first = True
                async for _line in r.content:
                    if first:
                        ttft.append(time.perf_counter() - t0)
                        first = False
            else:
                await r.read()
        lat.append(time.perf_counter() - t0)


async def _run(url: str, keys: Sequence[str | None], body: dict, total: int, stream: bool) -> dict:
    import aiohttp

    lat: list[float] = []
    ttft: list[float] = []
    per = max(1, total // len(keys))
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)  # below the server's 5 s, like Node's 4 s
    async with aiohttp.ClientSession(connector=conn) as s:
        # one warm-up call per agent (connections, caches), not measured
        await asyncio.gather(*(_agent(s, url, _auth(k), body, stream, 1, [], []) for k in keys))
        t0 = time.perf_counter()
        await asyncio.gather(*(_agent(s, url, _auth(k), body, stream, per, lat, ttft) for k in keys))
        wall = time.perf_counter() - t0
    out = {**summary_ms(lat), "calls_per_s": round(len(lat) / wall, 1)}
    if ttft:
        out["ttft_p50_ms"] = round(pct(ttft, 50) * 1000, 3)
    return out


def _auth(key: str | None) -> dict:
    return {"authorization": f"Bearer {key}"} if key else {}


async def _mint(server: str, admin: str, engine: str, n: int) -> list[str]:
    import httpx

    spec = {"engine_url": engine, "served_model": "stub", "max_calls": 10_000, "max_tokens": 64}
    async with httpx.AsyncClient(base_url=server, headers={"authorization": f"Bearer {admin}"}, timeout=30) as c:
        keys = []
        for _ in range(n):
            r = await c.post("/capture/sessions", json=spec)
            r.raise_for_status()
            keys.append(r.json()["key"])
        return keys


def _start_server(exits: ExitStack, tmp: str, engine: str, admin: str, upstream: str) -> str:
    env = {
        "SWE_GYM_ADMIN_KEY": admin,
        "SWE_GYM_DATA_DIR": os.path.join(tmp, f"data-{upstream}"),
        "SWE_GYM_UPSTREAM": upstream,
        "SWE_GYM_UI": "0",
    }
    return stack.server(exits, engine, env)[0]


def run(
    as_json: bool, quick: bool = False, clients: tuple[str, ...] = ("aiohttp",), dialects: tuple[str, ...] = ("chat",)
) -> int:
    for d in dialects:
        _dialect_request(d, 1, False)  # unknown names fail before anything starts
    admin = secrets.token_urlsafe(16)
    sizes, concs = ((1000,), (1, 64)) if quick else (SIZES, CONCURRENCY)
    results = []
    with ExitStack() as exits, tempfile.TemporaryDirectory() as tmp:
        eport = free_port()
        engine = f"http://127.0.0.1:{eport}"
        stub = [sys.executable, "-m", "swe_gym_env.benchmarks.stub_engine", str(eport)]
        stack.start(exits, stub, f"{engine}/health")
        servers = {name: _start_server(exits, tmp, engine + "/v1", admin, name) for name in clients}
        for size in sizes:
            for stream in (False, True):
                for conc in concs:
                    total = CALLS[conc] // (4 if quick else 1)
                    body = _request(size, stream)
                    direct = asyncio.run(_run(f"{engine}/v1/chat/completions", [None] * conc, body, total, stream))
                    for dialect in dialects:
                        if dialect != "chat" and size != STUB_PROMPT_TOKENS:
                            continue  # the stub cannot size a translated dialect's prompt (see the module doc)
                        path, dbody = _dialect_request(dialect, size, stream)
                        row = {"dialect": dialect, "prompt_tokens": size, "stream": stream, "sessions": conc}
                        row["direct"] = direct
                        for name, server in servers.items():
                            keys = asyncio.run(_mint(server, admin, engine + "/v1", conc))
                            through = asyncio.run(_run(f"{server}/capture{path}", keys, dbody, total, stream))
                            row[f"through_{name}"] = through
                            row[f"added_p50_ms_{name}"] = round(through["p50_ms"] - direct["p50_ms"], 3)
                            row[f"added_p99_ms_{name}"] = round(through["p99_ms"] - direct["p99_ms"], 3)
                            if stream:
                                added = through["ttft_p50_ms"] - direct["ttft_p50_ms"]
                                row[f"added_ttft_p50_ms_{name}"] = round(added, 3)
                        results.append(row)
    doc = {
        "bench": "capture",
        "cpus": os.cpu_count(),
        "note": "direct = the stub engine called by the same load generator; through = via the server's /capture "
        "with a durable SQLite store; all three processes share this machine's cores",
        "results": results,
    }
    first = clients[0]
    header = ["dialect", "prompt", "stream", "sessions", "direct p50", "through p50", "+p50 ms", "+p99 ms", "calls/s"]
    header += ["direct calls/s", "+ttft"]
    rows = [
        [
            r["dialect"],
            r["prompt_tokens"],
            r["stream"],
            r["sessions"],
            r["direct"]["p50_ms"],
            r[f"through_{first}"]["p50_ms"],
            r[f"added_p50_ms_{first}"],
            r[f"added_p99_ms_{first}"],
            r[f"through_{first}"]["calls_per_s"],
            r["direct"]["calls_per_s"],
            r.get(f"added_ttft_p50_ms_{first}", ""),
        ]
        for r in results
    ]
    emit(doc, as_json, rows, header)
    return 0
