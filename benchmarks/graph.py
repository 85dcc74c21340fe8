"""`swe-gym-env bench graph`: rollout-graph ingest (link + durable store) as a rollout grows.

Two shapes, each timed per call and compared with itself (early calls vs late calls, the baseline in the same run):
- ``growing``: one conversation of TURNS calls whose prompt grows to ~50k tokens (each call extends the last);
  the cost per call may grow with the prompt (it must be read once) but not with the number of earlier calls, so
  it is also reported per 1k prompt tokens;
- ``fanout``: 1,000 calls sharing an 8k-token opening with different tails (retries, subagents): prompts stay the
  same size, so the cost per call must stay flat.
Bytes per stored token = bytes in the store / tokens the calls hold (prompt + completion, every call).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from swe_gym_env.benchmarks import emit
from swe_gym_env.server.capture.graph import RolloutGraph
from swe_gym_env.server.capture.store import CaptureStore

Calls = list[tuple[list[int], list[int]]]  # (prompt ids, completion ids) of each call
# what every call records besides its tokens and request (the bench times ingest, not these)
REPLY = {
    "finish_reason": "tool_calls",
    "streamed": True,
    "wall_s": 0.0,
    "response": {"role": "assistant", "content": None},
}


def _ingest(store: CaptureStore, sid: str, g: RolloutGraph, i: int, prompt: list[int], comp: list[int]) -> float:
    t0 = time.perf_counter()
    node, keys, _ = g.link(prompt, comp, [-0.5] * len(comp))
    store.add_call(sid, node, request={"messages": [{"role": "user", "content": f"call {i}"}]}, **REPLY)
    g.commit(node, keys)
    return time.perf_counter() - t0


def _shape(name: str, calls: Calls, store: CaptureStore) -> dict:
    g = RolloutGraph()
    store.open_session(name, {})
    times = [_ingest(store, name, g, i, p, c) for i, (p, c) in enumerate(calls)]
    tokens = sum(len(p) + len(c) for p, c in calls)
    tenth = max(1, len(calls) // 10)
    early, late = times[:tenth], times[-tenth:]
    early_k = [t / (len(calls[i][0]) / 1000) for i, t in enumerate(times[:tenth])]
    late_k = [t / (len(calls[-tenth + i][0]) / 1000) for i, t in enumerate(times[-tenth:])]
    return {
        "shape": name,
        "calls": len(calls),
        "max_prompt_tokens": max(len(p) for p, _ in calls),
        "first_tenth_ms_per_call": round(statistics.median(early) * 1000, 3),
        "last_tenth_ms_per_call": round(statistics.median(late) * 1000, 3),
        "first_tenth_us_per_1k_prompt_tokens": round(statistics.median(early_k) * 1e6, 2),
        "last_tenth_us_per_1k_prompt_tokens": round(statistics.median(late_k) * 1e6, 2),
        "total_s": round(sum(times), 3),
        "stored_bytes": store.stored_bytes(name),
        "tokens_held": tokens,
        "bytes_per_stored_token": round(store.stored_bytes(name) / tokens, 3),
        "graph_memory_bytes_per_token": round(g.stored_bytes() / tokens, 3),
        "roots": len(g.roots()),
    }


def _growing(rng: np.random.Generator, turns: int) -> Calls:
    """One conversation of ``turns`` calls whose prompt grows from 2k to ~50k tokens."""
    growing: Calls = []
    prompt = rng.integers(0, 49_000, 2_000).tolist()
    step = max(1, (50_000 - 2_000) // turns)
    for _ in range(turns):
        comp = rng.integers(0, 49_000, 50).tolist()
        growing.append((prompt, comp))
        prompt = prompt + comp + rng.integers(0, 49_000, max(1, step - 50)).tolist()
    return growing


def _fanout(rng: np.random.Generator, calls: int) -> Calls:
    """``calls`` calls sharing an 8k-token opening, each with its own 1k-token tail."""
    opening = rng.integers(0, 49_000, 8_000).tolist()
    return [
        (opening + rng.integers(0, 49_000, 1_000).tolist(), rng.integers(0, 49_000, 50).tolist()) for _ in range(calls)
    ]


HEADER = ["shape", "calls", "max prompt", "ms/call first 10%", "ms/call last 10%", "µs/1k tok first", "last", "B/tok"]
COLUMNS = (
    "shape",
    "calls",
    "max_prompt_tokens",
    "first_tenth_ms_per_call",
    "last_tenth_ms_per_call",
    "first_tenth_us_per_1k_prompt_tokens",
    "last_tenth_us_per_1k_prompt_tokens",
    "bytes_per_stored_token",
)


def run(as_json: bool, turns: int = 500, quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    growing = _growing(rng, 100 if quick else turns)
    fanout = _fanout(rng, 200 if quick else 1000)
    with tempfile.TemporaryDirectory() as tmp:
        store = CaptureStore(Path(tmp) / "bench.sqlite")
        results = [_shape("growing", growing, store), _shape("fanout", fanout, store)]
        store.close()
    doc = {"bench": "graph", "cpus": os.cpu_count(), "results": results}
    emit(doc, as_json, [[r[k] for k in COLUMNS] for r in results], HEADER)
    return 0
