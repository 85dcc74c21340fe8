"""Shared test helpers: the built-in engine in process, and SSE parsing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from swe_gym_env.core import procs
from swe_gym_env.core.assets import tokenizer_file
from swe_gym_env.core.procs import free_port
from swe_gym_env.server.agents.base import jsonl_values
from swe_gym_env.server.engine.app import Engine, create_engine_app
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import make_policy

MODEL = "smollm2-135m-instruct"
STARTUP_S = 180.0  # a loaded 2-core machine can take a minute to start a server
ME = [sys.executable, "-m", "swe_gym_env.cli"]

PI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "strict": False,
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Edit a file",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "edits": {"type": "array", "items": {"type": "object"}}},
            },
        },
    },
]


def engine_app(policy: str = "oracle"):
    return create_engine_app(Engine(ChatRenderer(tokenizer_file()), make_policy(policy), MODEL))


def engine_client(policy: str = "oracle") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app(policy)), base_url="http://engine")


def sse_events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def listener_pids(port: int) -> set[int]:
    """The processes holding a listening TCP socket on ``port`` (any address, this network namespace)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fds = list((d / "fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:  # one fd closed between the listing and the read skips that fd, not the whole process
                    if os.readlink(fd) in inodes:
                        pids.add(int(d.name))
                        break
                except OSError:
                    continue
    return pids


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "gone"


def check_listener(proc: subprocess.Popen, port: int) -> None:
    """A port another test (another xdist worker) took between `free_port` and our server's bind must fail loudly,
    never let our health check pass on someone else's server: the listener on ``port`` is ``proc`` (or its child)."""
    for _ in range(20):  # the scan races with fds opening and closing: found nobody is no proof; ask again
        holders = listener_pids(port)
        if any(proc.pid in _ancestors(h) for h in holders):
            return
        if holders:
            break
        time.sleep(0.25)
    who = "; ".join(f"pid {h} ({_cmdline(h)})" for h in sorted(holders)) or "no process"
    procs.stop(proc)
    raise RuntimeError(f"port collision: port {port} is held by {who}, not by the server just started ({proc.args})")


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class Stack:
    """Built-in engine + server as real processes on free loopback ports."""

    def __init__(
        self,
        policy: str,
        engine_up: bool = True,
        env: dict[str, str] | None = None,
        server_engine_url: str | None = None,
        ui: bool = False,
    ) -> None:
        self.engine_port, self.server_port = free_port(), free_port()
        self.server_engine_url = server_engine_url
        self.procs: list[subprocess.Popen] = []
        # the Gradio UI costs seconds of CPU per server start: only the UI tests mount it
        self.env = {**os.environ, "SWE_GYM_UI": "1" if ui else "0", **(env or {})}
        for attempt in range(3):
            try:
                if engine_up:
                    self._start(
                        [*ME, "engine", "--port", str(self.engine_port), "--policy", policy], self.engine_url("/health")
                    )
                self.start_server()
                return
            except procs.NotReady as e:
                self.stop()  # never leave a half-started stack behind
                taken = [p for p in (self.engine_port, self.server_port) if _port_taken(p)]
                if not (e.exited and taken) or attempt == 2:
                    raise
                # free_port's race: another worker bound the port between free_port and our server's bind (the
                # server exited with "address already in use"); said, then new ports
                print(f"port(s) {taken} taken by another process before our server bound them: new ports")
                self.procs = []
                self.engine_port, self.server_port = free_port(), free_port()
            except BaseException:
                self.stop()
                raise

    def start_server(self) -> None:
        self.server = self._start(
            [
                *ME,
                "serve",
                "--port",
                str(self.server_port),
                "--engine-url",
                self.server_engine_url or self.engine_url("/v1"),
            ],
            f"http://127.0.0.1:{self.server_port}/health",
        )

    def engine_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.engine_port}{path}"

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/mcp"

    def _start(self, argv, health):
        p = procs.start(argv, health, env=self.env, timeout=STARTUP_S)  # stopped there if it never gets healthy
        self.procs.append(p)
        check_listener(p, int(health.split(":")[2].split("/")[0]))
        return p

    def health(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.server_port}/health").json()

    def stop(self):
        for p in self.procs:
            procs.stop(p)


def full_turns(source) -> list:
    """The turns of a result (or a session's turn list) in the full form: each with its whole prompt_token_ids and
    request (`result_form.expand_turns`)."""
    from swe_gym_env.trace.forms import expand_turns

    return expand_turns(getattr(source, "turns", source))


def audit_lines(text: str) -> list[list]:
    """The Python agents' socket log (the launcher's audit hook: one JSON array per line) from a tool's output that
    printed it; other lines (the probe's markers, a cut last line) are skipped."""
    return list(jsonl_values(text, list))


def reference_rows(result, roles=("agent", "aux")) -> list[tuple]:
    """Training rows the schema-1 way (every turn's whole prompt): the old `client.trainer.training_rows`, kept as
    the reference the compact form must reproduce. (turn indices, role, ids, mask, logprobs) per row."""
    from swe_gym_env.trace.compact import check_prefixes, materialize

    if not result.ok or result.reward is None:
        return []
    by_index = {t.index: t for t in result.turns}
    rows = []
    for seq in result.sequences:
        if seq.discarded or seq.role not in roles:
            continue
        chain = [by_index[i] for i in seq.turns]
        assert not any(t.discarded for t in chain)
        ids, mask, lps = materialize(
            chain[-1].prompt_token_ids,
            [(len(t.prompt_token_ids), t.completion_token_ids, t.logprobs) for t in chain],
        )
        check_prefixes([t.prompt_token_ids for t in chain], ids)
        rows.append((list(seq.turns), seq.role, ids, mask, lps))
    return rows


def check_result_form(result) -> None:
    """The golden check, for every rollout result a test gets: compact → expand → compact is identical; the compact
    fields rebuilt from the full form alone expand to the same full form; training rows from the compact form equal
    the rows built the old way from the full turns; a schema-1 dump of it reads back as the same compact result."""
    from swe_gym_env.client.trainer import training_rows
    from swe_gym_env.trace.forms import check_sequences, compact, expand, recompact
    from swe_gym_env.wire import RolloutResult

    assert result.schema_version == 2
    assert (
        all(t.prompt_token_ids is None and t.request is None for t in result.turns)
        or result.turns == expand(result).turns
    )  # compact, or full and consistent
    small = compact(result)
    full = expand(small)
    assert compact(full) == small
    again = expand(recompact(full))
    assert [(t.prompt_token_ids, t.request) for t in again.turns] == [
        (t.prompt_token_ids, t.request) for t in full.turns
    ]
    check_sequences(small)
    rows = [(r.turn_indices, r.role, r.input_ids, r.loss_mask, r.logprobs) for r in training_rows(small)]
    assert rows == reference_rows(full)
    v1 = full.model_dump(mode="json")
    v1["schema_version"] = 1
    for t in v1["turns"]:
        for k in ("prompt_len", "prompt_base", "prompt_shared", "prompt_new_ids", "sequence"):
            t.pop(k)
        for k in ("messages_base", "messages_kept", "new_messages", "params"):
            t.pop(k)
    for q in v1["sequences"]:
        q.pop("length")
    upgraded = RolloutResult.model_validate(v1)
    assert [(t.prompt_token_ids, t.request) for t in expand(upgraded).turns] == [
        (t.prompt_token_ids, t.request) for t in full.turns
    ]
    assert [r.input_ids for r in training_rows(upgraded)] == [r[2] for r in rows]


async def rows_match_export(stack: Stack, result) -> None:
    """The trainer's rows of a rollout equal the kept sequences of its capture session's export (the one derivation
    of training data): same turns, tokens, loss mask and logprobs, in the same order. The golden check of the result's
    compact form runs too (`check_result_form`)."""
    from swe_gym_env.client.trainer import training_rows

    check_result_form(result)
    assert result.capture_session_id, "no capture session"
    headers = {"authorization": f"Bearer {k}"} if (k := stack.env.get("SWE_GYM_ADMIN_KEY")) else {}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(
            f"http://127.0.0.1:{stack.server_port}/capture/sessions/{result.capture_session_id}/export", headers=headers
        )
    assert r.status_code == 200, r.text
    doc = r.json()
    kept = [(s["turns"], s["role"], s["token_ids"], s["loss_mask"], s["logprobs"]) for s in doc["sequences"]]
    kept = [k for k, s in zip(kept, doc["sequences"], strict=True) if not s["discarded"]]
    rows = [(r.turn_indices, r.role, r.input_ids, r.loss_mask, r.logprobs) for r in training_rows(result)]
    assert rows == (kept if result.ok and result.reward is not None else [])  # unscorable: no rows at all
    assert [(s.turns, s.role, s.discarded) for s in result.sequences] == [
        (s["turns"], s["role"], s["discarded"]) for s in doc["sequences"]
    ]


class Served:
    """A Starlette app on a real loopback port (uvicorn in a thread)."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
