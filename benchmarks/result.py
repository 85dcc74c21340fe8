"""`swe-gym-env bench result`: the size of a long rollout's result and the capture session's memory, compact vs full.

The shape of issue 26's 80-call case: one agent conversation of CALLS model calls; every call's reply is ~88 sampled
tokens (a tool call) and the tool's ~7 KB output adds ~7,080 prompt tokens, so the last prompt is ~568k tokens. The
calls go through the capture proxy's own recording (`CaptureProxy._record`: rollout graph, request digests, durable
store), each with a freshly parsed request (as the agent's HTTP body gives it) and the engine's ids as arrays; the
result is assembled as the pipeline assembles it (`RunState.trace`).

Measured in the same run:
- result: the JSON (what `--out` writes) in the compact form (schema 2) and in the full form (every turn's whole
  prompt and request: what schema 1 wrote, built one turn at a time so the old form never sits in memory whole);
- memory: Python heap the session keeps once its calls are recorded (tracemalloc, the whole session freed to see
  what it held), the peak while recording, and the process RSS; the old proxy's per-call state (a list of the whole
  prompt, the request parsed whole, a full int32 prompt + completion in the graph) measured per call and summed;
- the training row: its length, and that it equals the row laid out from the full form.
Token ids follow a log-uniform law over a 49,152-token vocabulary (SmolLM2's, the built-in engine's), so their JSON
length is like a real tokenizer's (most ids are short).
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import tempfile
import time
import tracemalloc
from array import array
from pathlib import Path

import numpy as np
import orjson

from swe_gym_env.benchmarks import emit
from swe_gym_env.client.trainer import training_rows
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.capture.dialect import CapturedCall
from swe_gym_env.server.capture.graph import _PrefixHasher
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.rollout.record import RunState
from swe_gym_env.trace.forms import TurnsView
from swe_gym_env.wire import RolloutResult

CALLS = 80
FIRST_PROMPT = 1_972  # system prompt, tools and the task
TOOL_TOKENS = 7_080  # one tool output (~7 KB of text)
COMPLETION = 88
VOCAB = 49_152
MB = 1024 * 1024
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {}}}]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Agent:
    """The conversation as an agent grows it: the true prompt ids and messages of every call."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.prompt = array("q", self.ids(FIRST_PROMPT))
        self.messages: list[dict] = [
            {"role": "system", "content": "You are a coding agent. " * 80},
            {"role": "user", "content": "Fix the failing test in the repository. " * 25},
        ]

    def ids(self, n: int) -> list[int]:
        top = math.log(VOCAB)
        return [int(math.exp(self.rng.random() * top)) - 1 for _ in range(n)]

    def call(self, k: int) -> tuple[dict, CapturedCall]:
        """The k-th call's request (freshly parsed, as the proxy gets it) and the engine's reply."""
        completion = self.ids(COMPLETION)
        up = orjson.loads(orjson.dumps({"model": "m", "tools": TOOLS, "max_tokens": 1024, "messages": self.messages}))
        call = CapturedCall(
            prompt_token_ids=array("q", self.prompt),
            completion_token_ids=array("q", completion),
            logprobs=array("d", [-0.05 - 1e-3 * (i % 97) for i in range(COMPLETION)]),
            message={"role": "assistant", "content": None, "tool_calls": [self.tool_call(k)]},
            finish_reason="tool_calls",
            usage=None,
        )
        self.prompt.extend(completion)
        self.prompt.extend(self.ids(TOOL_TOKENS))
        out = "".join(self.rng.choice("abcdefghij klmnop\n") for _ in range(7_000))
        self.messages = [
            *self.messages,
            {"role": "assistant", "content": None, "tool_calls": [self.tool_call(k)]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": out},
        ]
        return up, call

    @staticmethod
    def tool_call(k: int) -> dict:
        args = json.dumps({"command": f"python -m pytest -x tests/ -k case_{k}"})
        return {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": args}}


def _old_turn_bytes(prompt: list[int], completion: list[int], up: dict) -> int:
    """What the old proxy kept for one call: the Turn's whole prompt list and request (parsed whole, its own
    objects), and the graph node's int32 prompt + completion."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    fresh = array("q", prompt).tolist()  # its own int objects, as the old proxy parsed them
    held = (fresh, orjson.loads(orjson.dumps(up)), np.asarray([*prompt, *completion], dtype=np.int32))
    size = tracemalloc.get_traced_memory()[0] - before
    del held
    return size


def _agent_heap(calls: int) -> int:
    """The Python heap the agent side alone holds after ``calls`` calls (its prompt and messages), to subtract."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    agent = Agent()
    for k in range(calls):
        agent.call(k)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del agent
    return held


def _rss_run(calls: int) -> dict:
    """Process RSS (no tracemalloc, whose own bookkeeping would inflate it) as one session records its calls: after
    the last call, after it closes, and after it is dropped (includes the agent side and the allocator's keep)."""
    agent = Agent(seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        proxy = CaptureProxy(CaptureStore(Path(tmp) / "capture.sqlite"))
        gc.collect()
        rss0 = _rss()
        session, _ = proxy.open_session(
            EngineTarget("http://engine/v1", "m"), max_calls=calls, max_tokens=1024, session_id="rss"
        )
        peak = 0
        for k in range(calls):
            up, call = agent.call(k)
            proxy._record(session, DIALECTS["openai-chat"], up, call, streamed=True, wall=0.5)
            del up, call
            peak = max(peak, _rss())
        gc.collect()
        open_rss = _rss()
        proxy.close_session(session)
        gc.collect()
        closed_rss = _rss()
        proxy.sessions.clear()
        del session, proxy
        gc.collect()
        dropped = _rss()
    return {
        "rss_peak_growth_mb": round((peak - rss0) / MB, 1),
        "rss_growth_open_mb": round((open_rss - rss0) / MB, 1),
        "rss_growth_closed_mb": round((closed_rss - rss0) / MB, 1),
        "rss_growth_after_drop_mb": round((dropped - rss0) / MB, 1),
    }


NOTES = (
    "rss_*: the process RSS (a run without tracemalloc) minus before the session, including the agent "
    "side (agent_side_heap_mb) and what the allocator keeps; "
    "session_heap_mb: Python heap freed when the closed session (turns, graph, digests) and its result "
    "are dropped; open_session_heap_mb: the session in flight after its last call (heap minus the agent side's "
    "own state, measured alone); recording_peak_heap_mb includes the agent side's own growing prompt and messages "
    "(agent_side_heap_mb) and each call's transient request and arrays; old_proxy_heap_mb: what the old "
    "proxy kept per call (whole prompt list + request + graph int32 copy), measured per call and summed."
)
HEADER = ["form", "result MB", "prompt ids in result", "session heap MB"]


def _record_calls(proxy: CaptureProxy, session, agent: Agent, calls: int) -> tuple[list[float], int]:
    """Record ``calls`` calls of the agent's conversation: each call's recording time, and the last prompt's length."""
    record_s = []
    last_prompt = 0
    for k in range(calls):
        up, call = agent.call(k)
        last_prompt = len(call.prompt_token_ids)
        t0 = time.perf_counter()
        proxy._record(session, DIALECTS["openai-chat"], up, call, streamed=True, wall=0.5)
        record_s.append(time.perf_counter() - t0)
        del up, call
    return record_s, last_prompt


def _full_form(result: RolloutResult) -> dict:
    """The old form, one turn at a time: its JSON and what the old proxy kept per call."""
    view = TurnsView(result.turns)
    old_json = len(result.model_dump_json(exclude={"turns"})) + 2
    old_memory = 0
    for t in result.turns:
        full = t.model_copy(update={"prompt_token_ids": view.prompt(t.index), "request": view.request(t.index)})
        old_json += len(full.model_dump_json()) + 1
        old_memory += _old_turn_bytes(full.prompt_token_ids or [], t.completion_token_ids, full.request or {})
        del full
    return {"old_json": old_json, "old_memory": old_memory, "prompt_ids_old": sum(t.prompt_len for t in result.turns)}


def _session_run(calls: int) -> dict:
    """One session recorded under tracemalloc: its result in the compact form (JSON) and in the full form, and the
    heap it held open, at its peak and once dropped."""
    agent = Agent()
    with tempfile.TemporaryDirectory() as tmp:
        store = CaptureStore(Path(tmp) / "capture.sqlite")
        proxy = CaptureProxy(store)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        session, _ = proxy.open_session(
            EngineTarget("http://engine/v1", "m"), max_calls=calls, max_tokens=1024, session_id="bench"
        )
        record_s, last_prompt = _record_calls(proxy, session, agent, calls)
        gc.collect()
        open_heap = tracemalloc.get_traced_memory()[0] - base  # the session in flight, plus the agent side
        proxy.close_session(session)
        gc.collect()
        peak = tracemalloc.get_traced_memory()[1] - base
        state = RunState(session=session)
        result = RolloutResult(rollout_id="bench", ok=True, reward=1.0, harness="pi", sandbox="local", **state.trace())
        with_session = tracemalloc.get_traced_memory()[0]
        compact_json = result.model_dump_json()
        (row,) = training_rows(result)
        full = _full_form(result)
        del result, state, row
        store.close()
        proxy.sessions.clear()
        del session, proxy, store
        gc.collect()
        freed = with_session - tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    measured = {"record_s": record_s, "last_prompt": last_prompt, "open_heap": open_heap, "peak": peak}
    return {**measured, "freed": freed, "compact_json": compact_json, **full}


def _compact(m: dict, check: RolloutResult, again, rss: dict, agent_bytes: int, shared_table: int) -> dict:
    """The compact form's part of the document (``check``: its result read back; ``again``: that result's row)."""
    compact_bytes = len(m["compact_json"].encode())
    return {
        "result_bytes": compact_bytes,
        "result_mb": round(compact_bytes / MB, 2),
        "prompt_ids_in_result": sum(len(t.prompt_new_ids) for t in check.turns),
        "messages_in_result": sum(len(t.new_messages) for t in check.turns),
        "json_bytes_per_id": round(len(orjson.dumps(again.input_ids)) / len(again.input_ids), 2),
        "session_heap_mb": round(m["freed"] / MB, 1),
        "open_session_heap_mb": round((m["open_heap"] - agent_bytes) / MB, 1),
        "recording_peak_heap_mb": round(m["peak"] / MB, 1),
        "agent_side_heap_mb": round(agent_bytes / MB, 1),
        "process_shared_hash_table_mb": round(shared_table / MB, 1),
        **rss,
        "record_ms_first_call": round(m["record_s"][0] * 1000, 2),
        "record_ms_last_call": round(m["record_s"][-1] * 1000, 2),
    }


def run(as_json: bool, quick: bool = False, calls: int = CALLS) -> int:
    calls = 12 if quick else calls
    rss = _rss_run(calls)  # first, on a fresh process heap
    agent_bytes = _agent_heap(calls)
    longest = FIRST_PROMPT + calls * (COMPLETION + TOOL_TOKENS)
    shared_table = _PrefixHasher._powers(longest).nbytes  # one per process, shared by every session: not counted
    m = _session_run(calls)
    check = RolloutResult.model_validate_json(m["compact_json"])
    (again,) = training_rows(check)
    compact = _compact(m, check, again, rss, agent_bytes, shared_table)
    full = {
        "result_bytes": m["old_json"],
        "result_mb": round(m["old_json"] / MB, 2),
        "prompt_ids_in_result": m["prompt_ids_old"],
        "old_proxy_heap_mb": round(m["old_memory"] / MB, 1),
    }
    doc = {
        "bench": "result",
        "calls": calls,
        "last_prompt_tokens": m["last_prompt"],
        "row_tokens": len(again.input_ids),
        "sampled_tokens": sum(again.loss_mask),
        "compact": compact,
        "full": full,
        "goals": {"result_mb_max": 5, "session_mb_max": 64},
        "notes": NOTES,
        "ratio_result_full_over_compact": round(m["old_json"] / compact["result_bytes"], 1),
    }
    rows = [
        [form, doc[key]["result_mb"], doc[key]["prompt_ids_in_result"], doc[key][heap]]
        for form, key, heap in (
            ("compact", "compact", "session_heap_mb"),
            ("full (schema 1)", "full", "old_proxy_heap_mb"),
        )
    ]
    emit(doc, as_json, rows, HEADER)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(run("--json" in sys.argv, quick="--quick" in sys.argv))
