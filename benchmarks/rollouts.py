"""`swe-gym-env bench rollouts`: many rollouts at once (built-in engine, local sandbox, real agent CLIs).

Per level (8 / 32 / 64 concurrent Pi rollouts; OpenCode at 8 when installed): success rate, wall time p50/p95, time
outside the agent (rollout wall minus the agent phase: boot, diff, grading, queueing; goal ≤ 2 s on a demo task) and the
server's peak RSS. Baseline in the same run: one rollout alone, on the same server.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import ExitStack

from swe_gym_env.benchmarks import emit, pct
from swe_gym_env.benchmarks.stack import engine, rss_kib, server

LEVELS = (8, 32, 64)


async def _batch(url: str, n: int, harness: str) -> tuple[list, float]:
    from swe_gym_env.client.ws_client import SweGymWSClient

    async def one(i: int):
        async with SweGymWSClient(url) as c:
            return await c.run_rollout(harness=harness, index=i % 6, max_model_calls=20)

    t0 = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    return results, time.monotonic() - t0


def _stats(label: str, results: list, wall: float, peak_mib: float) -> dict:
    ok = [r for r in results if r.ok]
    walls = [r.wall_s for r in results]
    outside = [r.wall_s - r.timings.get("agent", 0.0) for r in ok]
    errors = sorted({(r.phase, (r.error or "")[:120]) for r in results if not r.ok})
    return {
        "level": label,
        "rollouts": len(results),
        "ok": len(ok),
        "success_rate": round(len(ok) / max(1, len(results)), 3),
        "wall_p50_s": round(pct(walls, 50), 2),
        "wall_p95_s": round(pct(walls, 95), 2),
        "outside_agent_p50_s": round(pct(outside, 50), 2) if outside else None,
        "outside_agent_p95_s": round(pct(outside, 95), 2) if outside else None,
        "batch_wall_s": round(wall, 1),
        "server_peak_rss_mib": round(peak_mib, 1),
        "errors": errors[:5],
    }


def run(as_json: bool, quick: bool = False) -> int:
    from swe_gym_env.server.agents.registry import HARNESSES

    levels = (8,) if quick else LEVELS
    rows_out = []
    with ExitStack() as stack:
        eng = engine(stack, "oracle")
        base, proc, _ = server(stack, eng, {"SWE_GYM_MAX_ROLLOUTS": "8", "SWE_GYM_UI": "0"})
        plan = [("pi", 1, "baseline: 1 alone")] + [("pi", n, f"pi x{n}") for n in levels]
        if "opencode" in HARNESSES:
            try:
                HARNESSES["opencode"]().mounts()
                plan.append(("opencode", 8, "opencode x8"))
            except Exception as e:  # not installed: say so in the output rather than fail the bench
                rows_out.append({"level": "opencode x8", "skipped": str(e)})
        for harness, n, label in plan:
            results, wall = asyncio.run(_batch(base, n, harness))
            rows_out.append(_stats(label, results, wall, rss_kib(proc.pid, "VmHWM") / 1024))
    doc = {
        "bench": "rollouts",
        "cpus": os.cpu_count(),
        "note": "server concurrency 8 per backend (SWE_GYM_MAX_ROLLOUTS): larger batches queue; peak RSS is the "
        "server process's high-water mark so far (sandboxes and agents are separate processes)",
        "results": rows_out,
    }
    header = ["level", "ok", "wall p50", "p95", "outside agent p50", "p95", "batch s", "server peak MiB"]
    rows = [
        [
            r["level"],
            f"{r.get('ok', '-')}/{r.get('rollouts', '-')}",
            r.get("wall_p50_s", "-"),
            r.get("wall_p95_s", "-"),
            r.get("outside_agent_p50_s", "-"),
            r.get("outside_agent_p95_s", "-"),
            r.get("batch_wall_s", "-"),
            r.get("server_peak_rss_mib", r.get("skipped", "-")),
        ]
        for r in rows_out
    ]
    emit(doc, as_json, rows, header)
    return 0
