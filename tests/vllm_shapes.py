"""Requests and structural views shared by test_vllm_real.py (records/checks fixtures against a real vLLM) and
test_engine_shapes.py (compares the built-in engine with those fixtures, no vLLM needed).

A fixture file in tests/fixtures/vllm/ is `{"_meta": {...}, "request": ..., "status": int, "response": ...}` for a
plain reply, or `... "events": [chunk, ..., "[DONE]"]` for a stream. `shape_levels()` reduces either to the key sets
that matter (top level, choice, message, tool call, logprobs entry, usage; per stream chunk kind).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import MODEL, PI_TOOLS, sse_events

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm"
EOS_ID = 2  # <|im_end|>

# vLLM is made to produce exactly these texts with `structured_outputs: {"choice": [...]}` (the 135M model does not
# call tools unprompted); the hermes parser still runs on the output, so the reply looks like an agent's tool call.
TOOL_CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
TEXT_REPLY = "Done."
# The same replies as built-in engine scripts (`script:FILE` policy).
ENGINE_SCRIPTS = {
    "text": [{"content": TEXT_REPLY}],
    "tool_call": [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}],
}

PI_MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "List the files in the repository."}]}]
CAPTURE_FIELDS = {
    "return_token_ids": True,
    "logprobs": True,
    "top_logprobs": 1,
    "return_tokens_as_token_ids": True,
}


def chat_request(kind: str, stream: bool) -> dict[str, Any]:
    choice = TOOL_CALL_TEXT if kind == "tool_call" else TEXT_REPLY
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": PI_MESSAGES,
        "tools": PI_TOOLS,
        "store": False,
        "max_completion_tokens": 64,
        "seed": 7,
        "temperature": 1.0,
        **CAPTURE_FIELDS,
        "structured_outputs": {"choice": [choice]},
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# fixture name -> (path, request body, ENGINE_SCRIPTS key for the built-in engine's reply, or None)
RECORDINGS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "chat_text": ("/v1/chat/completions", chat_request("text", False), "text"),
    "chat_tool_call": ("/v1/chat/completions", chat_request("tool_call", False), "tool_call"),
    "stream_text": ("/v1/chat/completions", chat_request("text", True), "text"),
    "stream_tool_call": ("/v1/chat/completions", chat_request("tool_call", True), "tool_call"),
    "tokenize": ("/tokenize", {"model": MODEL, "messages": PI_MESSAGES, "tools": PI_TOOLS}, None),
    "error_empty_tools": ("/v1/chat/completions", {**chat_request("text", False), "tools": []}, "text"),
    "error_unknown_model": ("/v1/chat/completions", {**chat_request("text", False), "model": "no-such-model"}, "text"),
}


def record_of(status: int, body: dict, response_text: str, content_type: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"request": body, "status": status}
    if body.get("stream") and status == 200:
        rec["events"] = sse_events(response_text)
    else:
        rec["response"] = json.loads(response_text)
    rec["content_type"] = content_type.split(";")[0].strip()
    return rec


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


def _keys(x: Any) -> frozenset[str] | None:
    return frozenset(x) if isinstance(x, dict) else None


def _chat_levels(resp: dict) -> dict[str, frozenset | None]:
    choice = resp["choices"][0]
    msg = choice.get("message") or {}
    out = {"top": _keys(resp), "choice": _keys(choice), "message": _keys(msg), "usage": _keys(resp.get("usage"))}
    if msg.get("tool_calls"):
        call = msg["tool_calls"][0]
        out["tool_call"] = _keys(call)
        out["tool_call.function"] = _keys(call.get("function"))
    lp = choice.get("logprobs")
    if lp:
        out["logprobs"] = _keys(lp)
        entry = lp["content"][0]
        out["logprobs.entry"] = _keys(entry)
        if entry.get("top_logprobs"):
            out["logprobs.top_entry"] = _keys(entry["top_logprobs"][0])
    return out


def classify_chunks(events: list) -> dict[str, dict]:
    """First chunk, first content-token chunk, first tool-call chunk, finish chunk, usage chunk."""
    chunks = [e for e in events if isinstance(e, dict)]
    kinds: dict[str, dict] = {"first": chunks[0]}
    for ch in chunks[1:]:
        if not ch["choices"]:
            kinds.setdefault("usage", ch)
            continue
        c = ch["choices"][0]
        delta = c.get("delta") or {}
        if c.get("finish_reason") is not None:
            kinds.setdefault("finish", ch)
        elif delta.get("tool_calls"):
            kinds.setdefault("tool_call", ch)
        elif delta.get("content"):
            kinds.setdefault("content", ch)
    return kinds


def _stream_levels(events: list) -> dict[str, frozenset | None]:
    out: dict[str, frozenset | None] = {"done_marker": frozenset(["[DONE]"]) if events[-1] == "[DONE]" else None}
    for kind, ch in classify_chunks(events).items():
        out[f"{kind}.top"] = _keys(ch)
        if kind == "usage":
            out["usage.usage"] = _keys(ch.get("usage"))
            continue
        c = ch["choices"][0]
        out[f"{kind}.choice"] = _keys(c)
        out[f"{kind}.delta"] = _keys(c.get("delta"))
        if kind == "tool_call":
            out["tool_call.delta.tool_call"] = _keys(c["delta"]["tool_calls"][0])
        if c.get("logprobs"):
            out[f"{kind}.logprobs.entry"] = _keys(c["logprobs"]["content"][0])
    # The function keys a client sees over the whole stream (vLLM sends the name first, then argument pieces).
    fn_keys: set[str] = set()
    for ch in events:
        if isinstance(ch, dict):
            for c in ch.get("choices", []):
                for tc in (c.get("delta") or {}).get("tool_calls") or []:
                    fn_keys |= set(tc.get("function") or {})
    if fn_keys:
        out["tool_call.function(union)"] = frozenset(fn_keys)
    return out


def shape_levels(record: dict[str, Any]) -> dict[str, frozenset | None]:
    out: dict[str, frozenset | None] = {"status": frozenset([str(record["status"])])}
    if "events" in record:
        out.update(_stream_levels(record["events"]))
        return out
    resp = record["response"]
    if record["status"] != 200:
        out["error.top"] = _keys(resp)
        out["error.error"] = _keys(resp.get("error"))
    elif "choices" in resp:
        out.update(_chat_levels(resp))
    else:
        out["top"] = _keys(resp)
    return out


def stream_token_ids(events: list) -> list[int]:
    return [i for ch in events if isinstance(ch, dict) for c in ch["choices"] for i in c.get("token_ids") or []]


def stream_logprobs(events: list) -> list[dict]:
    return [
        e
        for ch in events
        if isinstance(ch, dict)
        for c in ch["choices"]
        for e in ((c.get("logprobs") or {}).get("content") or [])
    ]
