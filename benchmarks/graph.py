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


def _ingest(store: CaptureStore, sid: str, g: RolloutGraph, i: int, prompt: list[int], comp: list[int]) -> float:
    t0 = time.perf_counter()
    node, keys, _ = g.link(prompt, comp, [-0.5] * len(comp))
    store.add_call(
        sid,
        node,
        finish_reason="tool_calls",
        streamed=True,
        wall_s=0.0,
        request={"messages": [{"role": "user", "content": f"call {i}"}]},
        response={"role": "assistant", "content": None},
    )
    g.commit(node, keys)
    return time.perf_counter() - t0


def _shape(name: str, calls: list[tuple[list[int], list[int]]], store: CaptureStore) -> dict:
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


def run(as_json: bool, turns: int = 500, quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    turns = 100 if quick else turns
    growing: list[tuple[list[int], list[int]]] = []
    prompt = rng.integers(0, 49_000, 2_000).tolist()
    step = max(1, (50_000 - 2_000) // turns)
    for _ in range(turns):
        comp = rng.integers(0, 49_000, 50).tolist()
        growing.append((prompt, comp))
        prompt = prompt + comp + rng.integers(0, 49_000, max(1, step - 50)).tolist()
    opening = rng.integers(0, 49_000, 8_000).tolist()
    fanout = [
        (opening + rng.integers(0, 49_000, 1_000).tolist(), rng.integers(0, 49_000, 50).tolist())
        for _ in range(200 if quick else 1000)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        store = CaptureStore(Path(tmp) / "bench.sqlite")
        results = [_shape("growing", growing, store), _shape("fanout", fanout, store)]
        store.close()
    doc = {"bench": "graph", "cpus": os.cpu_count(), "results": results}
    header = [
        "shape",
        "calls",
        "max prompt",
        "ms/call first 10%",
        "ms/call last 10%",
        "µs/1k tok first",
        "last",
        "B/tok",
    ]
    rows = [
        [
            r["shape"],
            r["calls"],
            r["max_prompt_tokens"],
            r["first_tenth_ms_per_call"],
            r["last_tenth_ms_per_call"],
            r["first_tenth_us_per_1k_prompt_tokens"],
            r["last_tenth_us_per_1k_prompt_tokens"],
            r["bytes_per_stored_token"],
        ]
        for r in results
    ]
    emit(doc, as_json, rows, header)
    return 0
