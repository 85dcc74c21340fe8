"""`swe-gym-env bench capture`: what /capture costs an agent, paired with direct engine calls in one run, beside a peer.

Processes: a fast stub engine (vLLM's reply shape), the real server (`swe-gym-env serve`, durable capture store on),
with ``--peers openenv`` OpenEnv 0.10's capture proxy started from its own venv (``.openenv-venv``, as the test
setup makes it; run as a subprocess, never imported) against the same stub, and this load generator.

Paired A/B: per cell (prompt size, streaming, concurrency N) the N agents run phases of 16 calls each, a direct phase
(the engine's own URL) before every proxied phase, in rounds: direct, ours, direct, peer, … Each proxied call is
paired with the same agent's call at the same position in the direct phase just before it, so the machine's drift
hits both sides of a pair; added latency (and, streaming, added time to first chunk) is the pair's difference.
A proxied phase is one session per agent, minted before it and retired (closed) after it, as a trainer's rollouts
would; the kept fraction is proxied ÷ direct calls/s over the paired phases. A last cell runs one session of
``FLAT_CALLS`` calls per proxy (the added latency of its last 10% against its first 10%: per-call cost flat).

``dialects`` (``--dialects chat,responses,anthropic,gemini``): the same call in each API dialect /capture speaks (the
same system prompt, user text and token cap), so the added latency includes the dialect's translation both ways;
direct is always the engine's own chat call. The stub sizes its prompt ids from the chat request's
``metadata.prompt_tokens``, which translated dialects do not carry: they answer with STUB_PROMPT_TOKENS ids, so
translated dialects are measured at that prompt size only. ``clients`` compares our upstream HTTP clients.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

import orjson

from swe_gym_env.benchmarks import emit, pct, stack
from swe_gym_env.core import procs

CONCURRENCY = (1, 64, 256)
SIZES = (1000, 8000)
SESSION_CALLS = 16  # calls per session (one phase); sessions rotate and are retired after
CELL_CALLS = {1: 192, 64: 2048, 256: 4096}  # proxied calls per side and cell (whole rounds of phases)
FLAT_CALLS = 1000
STUB_PROMPT_TOKENS = 1000  # the stub engine's prompt length when the request does not say (translated dialects)
DIALECTS = ("chat", "responses", "anthropic", "gemini")
PEERS = ("openenv",)
SYSTEM = "You are a coding agent."


def _request(size: int, stream: bool) -> dict:
    body = {
        "model": "agent-model",
        "messages": [
            {"role": "system", "content": SYSTEM},
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


@dataclass
class Side:
    """One proxy as the load generator sees it: where its calls go and how its sessions are minted and retired."""

    name: str
    kind: str  # "ours" | "openenv"
    base: str  # the server's root URL
    path: str  # the agent's call path under the proxy's mount
    dialect: str = "chat"
    admin: str = field(default="", repr=False)
    engine: str = ""

    @property
    def mount(self) -> str:
        return f"{self.base}/capture" if self.kind == "ours" else self.base

    async def mint(self, http, n: int) -> list[tuple[str, str]]:
        """``n`` fresh sessions: (id, the agent's key)."""
        auth = {"authorization": f"Bearer {self.admin}"}
        if self.kind == "ours":
            spec = {"engine_url": self.engine, "served_model": "stub", "max_calls": 10_000, "max_tokens": 64}
        else:
            spec = {"max_model_calls": 0}
        out = []
        for _ in range(n):
            async with http.post(f"{self.mount}/sessions", json=spec, headers=auth) as r:
                doc = await r.json()
                if r.status not in (200, 201):
                    raise RuntimeError(f"{self.name}: minting a session answered HTTP {r.status}: {doc}")
            out.append((doc["id"], doc["key"]) if self.kind == "ours" else (doc["session_id"], doc["session_id"]))
        return out

    async def retire(self, http, sessions: Sequence[tuple[str, str]]) -> None:
        auth = {"authorization": f"Bearer {self.admin}"}
        for sid, _ in sessions:
            async with http.delete(f"{self.mount}/sessions/{sid}", headers=auth) as r:
                if r.status != 200:
                    raise RuntimeError(f"{self.name}: retiring session {sid} answered HTTP {r.status}")


Result = tuple[float, float | None, str | None]  # latency s, time to first chunk s (streams), error


async def _call(http, url: str, key: str | None, body: bytes, stream: bool) -> Result:
    import aiohttp

    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    ttft = None
    try:
        async with http.post(url, data=body, headers=headers) as r:
            if r.status != 200:
                return time.perf_counter() - t0, None, f"HTTP {r.status}: {(await r.text())[:200]}"
            if not stream:
                await r.read()
                return time.perf_counter() - t0, None, None
            error = None
            async for line in r.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if line.startswith(b'data: {"error"'):
                    error = f"error in stream: {line[:200].decode('utf-8', 'replace')}"
            return time.perf_counter() - t0, ttft, error
    except (aiohttp.ClientError, TimeoutError) as e:
        return time.perf_counter() - t0, None, f"{type(e).__name__}: {e}"


async def _phase(http, url: str, keys: Sequence[str | None], body: bytes, stream: bool, calls: int):
    """Every agent makes ``calls`` calls one after another, all agents at once: (results per agent, wall s)."""

    async def agent(key: str | None) -> list[Result]:
        return [await _call(http, url, key, body, stream) for _ in range(calls)]

    t0 = time.perf_counter()
    out = await asyncio.gather(*(agent(k) for k in keys))
    return out, time.perf_counter() - t0


@dataclass
class _Acc:
    added: list[float] = field(default_factory=list)
    added_ttft: list[float] = field(default_factory=list)
    calls: int = 0
    wall: float = 0.0
    direct_calls: int = 0
    direct_wall: float = 0.0
    errors: int = 0
    direct_errors: int = 0
    first_errors: list[str] = field(default_factory=list)

    def add(self, direct: list[list[Result]], dwall: float, through: list[list[Result]], wall: float) -> None:
        self.direct_calls += sum(map(len, direct))
        self.direct_wall += dwall
        self.calls += sum(map(len, through))
        self.wall += wall
        for drow, prow in zip(direct, through, strict=True):
            for (dl, dt, derr), (pl, pt, perr) in zip(drow, prow, strict=True):
                self.direct_errors += derr is not None
                if perr is not None:
                    self.errors += 1
                    if len(self.first_errors) < 3:
                        self.first_errors.append(perr)
                    continue
                if derr is None:
                    self.added.append(pl - dl)
                    if dt is not None and pt is not None:
                        self.added_ttft.append(pt - dt)

    def doc(self) -> dict:
        calls_s = self.calls / self.wall if self.wall else 0.0
        direct_s = self.direct_calls / self.direct_wall if self.direct_wall else 0.0
        out = {
            "pairs": len(self.added),
            "added_p50_ms": round(pct(self.added, 50) * 1000, 3),
            "added_p99_ms": round(pct(self.added, 99) * 1000, 3),
            "calls_per_s": round(calls_s, 1),
            "direct_calls_per_s": round(direct_s, 1),
            "kept": round(calls_s / direct_s, 3) if direct_s else None,
            "errors": self.errors,
            "direct_errors": self.direct_errors,
        }
        if self.added_ttft:
            out["added_ttft_p50_ms"] = round(pct(self.added_ttft, 50) * 1000, 3)
            out["added_ttft_p99_ms"] = round(pct(self.added_ttft, 99) * 1000, 3)
        if self.first_errors:
            out["first_errors"] = self.first_errors
        return out


async def _cell(direct: str, sides: Sequence[Side], size: int, stream: bool, conc: int, rounds: int) -> dict:
    import aiohttp

    bodies = {s.name: orjson.dumps(_dialect_request(s.dialect, size, stream)[1]) for s in sides}
    direct_body = orjson.dumps(_request(size, stream))
    accs = {s.name: _Acc() for s in sides}
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)  # below the servers' 5 s, like Node's 4 s
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as http:
        for r in range(rounds + 1):  # round 0: one call per agent and side (connections, caches), not measured
            calls = 1 if r == 0 else SESSION_CALLS
            for side in sides:
                d, dwall = await _phase(http, direct, [None] * conc, direct_body, stream, calls)
                sessions = await side.mint(http, conc)
                url = side.mount + side.path
                p, wall = await _phase(http, url, [k for _, k in sessions], bodies[side.name], stream, calls)
                await side.retire(http, sessions)
                if r:
                    accs[side.name].add(d, dwall, p, wall)
    return {name: acc.doc() for name, acc in accs.items()}


async def _flat(direct: str, sides: Sequence[Side], calls: int) -> dict:
    """One session of ``calls`` calls per side, each paired with a direct call just before it."""
    import aiohttp

    body = orjson.dumps(_request(STUB_PROMPT_TOKENS, False))
    added: dict[str, list[float]] = {s.name: [] for s in sides}
    errors = dict.fromkeys(added, 0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        sessions = {s.name: (await s.mint(http, 1))[0] for s in sides}
        for _ in range(calls):
            for s in sides:
                dl, _, derr = await _call(http, direct, None, body, False)
                pl, _, perr = await _call(http, s.mount + s.path, sessions[s.name][1], body, False)
                errors[s.name] += perr is not None
                added[s.name].append(pl - dl if derr is None and perr is None else float("nan"))
        for s in sides:
            await s.retire(http, [sessions[s.name]])
    out = {}
    tenth = max(1, calls // 10)
    for name, values in added.items():
        first = [v for v in values[:tenth] if v == v]
        last = [v for v in values[-tenth:] if v == v]
        f50, l50 = pct(first, 50) * 1000, pct(last, 50) * 1000
        out[name] = {
            "calls": calls,
            "first_10pct_added_p50_ms": round(f50, 3),
            "last_10pct_added_p50_ms": round(l50, 3),
            "last_over_first": round(l50 / f50, 3) if f50 > 0 else None,
            "errors": errors[name],
        }
    return out


def cpu_layout() -> tuple[set[int], set[int]] | None:
    """(cores for the stub engine and this load generator, cores for the proxy under test), or None on one core.
    Pinned as in the issue's measurement: direct calls are bound by the stub's core, proxied ones by the proxy's, so
    the machine's other work cannot decide which side wins."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


def _pin(pid: int, cpus: set[int] | None) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it makes later inherit it)."""
    if cpus:
        cores = ",".join(map(str, sorted(cpus)))
        subprocess.run(["taskset", "-a", "-cp", cores, str(pid)], check=True, capture_output=True, timeout=30)


def _start_ours(exits: ExitStack, tmp: str, engine: str, admin: str, upstream: str, cpus: set[int] | None) -> str:
    env = {
        "SWE_GYM_ADMIN_KEY": admin,
        "SWE_GYM_DATA_DIR": os.path.join(tmp, f"data-{upstream}"),
        "SWE_GYM_UPSTREAM": upstream,
        "SWE_GYM_UI": "0",
    }
    url, proc, _ = stack.server(exits, engine, env)
    _pin(proc.pid, cpus)
    return url


def _start_openenv(exits: ExitStack, engine: str, admin: str, cpus: set[int] | None) -> str:
    python = procs.side_python(".openenv-venv")
    if python is None:
        raise RuntimeError("--peers openenv needs the checkout's .openenv-venv (OpenEnv 0.10; the test setup makes it)")
    port = procs.free_port()
    mod = "openenv.core.harness.capture.server"
    argv = [str(python), "-m", mod, "--llm-url", engine, "--model", "stub", "--capture-level", "tokens"]
    # the admin key through the environment, never argv; its own defaults otherwise (INFO logs, to /dev/null)
    proc, _ = stack.start(
        exits, [*argv, "--port", str(port)], f"http://127.0.0.1:{port}/health", {"OPENENV_CAPTURE_ADMIN_KEY": admin}
    )
    _pin(proc.pid, cpus)
    return f"http://127.0.0.1:{port}"


def _sides(exits: ExitStack, tmp: str, engine: str, admin: str, clients, dialects, peers, cpus) -> list[Side]:
    sides = []
    for client in clients:
        base = _start_ours(exits, tmp, engine, admin, client, cpus)
        for d in dialects:
            name = "ours" + (f"-{client}" if len(clients) > 1 else "") + (f"-{d}" if d != "chat" else "")
            sides.append(Side(name, "ours", base, _dialect_request(d, 1, False)[0], d, admin, engine))
    for peer in peers:
        sides.append(
            Side(peer, peer, _start_openenv(exits, engine, admin, cpus), "/v1/chat/completions", "chat", admin)
        )
    return sides


def _ratios(row: dict, ours: str, peers: Sequence[str]) -> dict:
    out = {}
    for peer in peers:
        a, b = row[ours], row[peer]
        out[peer] = {
            "kept_ours_over_peer": round(a["kept"] / b["kept"], 3) if a["kept"] and b["kept"] else None,
            "added_p50_ours_over_peer": round(a["added_p50_ms"] / b["added_p50_ms"], 3) if b["added_p50_ms"] else None,
        }
    return out


def _cell_row(direct: str, sides: list[Side], peers: Sequence[str], size: int, stream: bool, conc: int, quick: bool):
    """One cell (prompt size, streaming, concurrency) over the sides that speak its size; said on stderr too."""
    here = [s for s in sides if s.dialect == "chat" or size == STUB_PROMPT_TOKENS]
    rounds = max(1, CELL_CALLS[conc] // (conc * SESSION_CALLS) // (4 if quick else 1))
    load = round(os.getloadavg()[0], 2)
    row = {"prompt_tokens": size, "stream": stream, "sessions": conc, "load_avg_1m": load}
    row |= asyncio.run(_cell(direct, here, size, stream, conc, rounds))
    row["ratios"] = _ratios(row, sides[0].name, peers)
    done = ", ".join(f"{s.name} +p50 {row[s.name]['added_p50_ms']} kept {row[s.name]['kept']}" for s in here)
    print(f"capture bench: {size} stream={stream} sessions={conc}: {done}", file=sys.stderr)
    return row


def _stub_engine(exits: ExitStack) -> str:
    """Start the stub engine; its OpenAI base URL."""
    eport = procs.free_port()
    engine_root = f"http://127.0.0.1:{eport}"
    stack.start(
        exits, [sys.executable, "-m", "swe_gym_env.benchmarks.stub_engine", str(eport)], f"{engine_root}/health"
    )
    return engine_root + "/v1"


def _pin_self(exits: ExitStack, layout: tuple[set[int], set[int]] | None) -> None:
    """This load generator and the stub (it inherits it) on the layout's first core, until ``exits`` closes."""
    if layout is not None:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, layout[0])
        exits.callback(os.sched_setaffinity, 0, before)


def _note() -> str:
    return (
        "paired A/B: each proxied call minus the same agent's call at the same position in the direct phase "
        "just before it; kept = proxied ÷ direct calls/s over the paired phases; sessions of "
        f"{SESSION_CALLS} calls, minted before and retired after each phase; all processes share this machine's "
        "cores (load_avg_1m per cell); cpu_layout: the stub engine and the load generator on one core, every proxy "
        "on the others"
    )


def run(
    as_json: bool,
    quick: bool = False,
    clients: tuple[str, ...] = ("aiohttp",),
    dialects: tuple[str, ...] = ("chat",),
    peers: tuple[str, ...] = (),
    flat_calls: int | None = None,
) -> int:
    for d in dialects:
        _dialect_request(d, 1, False)  # unknown names fail before anything starts
    if unknown := set(peers) - set(PEERS):
        raise ValueError(f"unknown peer(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    admin = secrets.token_urlsafe(16)
    sizes, concs = ((1000,), (1, 64)) if quick else (SIZES, CONCURRENCY)
    flat_n = flat_calls if flat_calls is not None else (100 if quick else FLAT_CALLS)
    layout = cpu_layout()
    with ExitStack() as exits, tempfile.TemporaryDirectory() as tmp:
        _pin_self(exits, layout)
        engine = _stub_engine(exits)
        direct = f"{engine}/chat/completions"
        sides = _sides(exits, tmp, engine, admin, clients, dialects, peers, layout[1] if layout else None)
        cells = [(size, stream, conc) for size in sizes for stream in (False, True) for conc in concs]
        results = [_cell_row(direct, sides, peers, *cell, quick) for cell in cells]
        flat: dict = {}
        if flat_n:
            flat_sides = [sides[0], *(s for s in sides if s.kind != "ours")]
            flat = {"load_avg_1m": round(os.getloadavg()[0], 2)} | asyncio.run(_flat(direct, flat_sides, flat_n))
    doc = {
        "bench": "capture",
        "cpus": os.cpu_count(),
        "note": _note(),
        "cpu_layout": {"stub_and_load": sorted(layout[0]), "proxies": sorted(layout[1])} if layout else None,
        "sides": {s.name: {"kind": s.kind, "path": s.path} for s in sides},
        "results": results,
        "flat": flat,
    }
    emit(doc, as_json, *_table(results, flat, sides))
    return 0


def _table(results: list[dict], flat: dict, sides: Sequence[Side]) -> tuple[list[list], list[str]]:
    header = ["prompt", "stream", "sessions", "side", "+p50 ms", "+p99 ms", "+ttft p50", "calls/s", "direct/s"]
    header += ["kept", "errors", "kept ours÷this", "load"]
    rows = []
    for r in results:
        for s in (s for s in sides if s.name in r):
            x = r[s.name]
            ratio = r["ratios"].get(s.name, {}).get("kept_ours_over_peer", "")
            cell = [r["prompt_tokens"], r["stream"], r["sessions"], s.name, x["added_p50_ms"], x["added_p99_ms"]]
            speed = [x.get("added_ttft_p50_ms", ""), x["calls_per_s"], x["direct_calls_per_s"], x["kept"]]
            rows.append([*cell, *speed, x["errors"], ratio, r["load_avg_1m"]])
    for name, f in flat.items():
        if isinstance(f, dict):
            first, last = f["first_10pct_added_p50_ms"], f["last_10pct_added_p50_ms"]
            flatness = f"last/first {f['last_over_first']}"
            rows.append(
                ["flat", False, 1, name, first, last, "", "", "", flatness, f["errors"], "", flat["load_avg_1m"]]
            )
    return rows, header
