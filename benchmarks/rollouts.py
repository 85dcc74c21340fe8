"""`swe-gym-env bench rollouts`: the time a rollout spends outside its agent, per phase, alone and 8 at once.

One server (built-in oracle engine, local sandbox, the real Pi CLI, whose agent part is a few scripted calls) runs,
in this order: a warm-up (one rollout per bundled task, 6 at once: each task's pristine tree is made here), rollouts
one at a time, then batches of 8 at once (the server's concurrency), and with the full run also 32 / 64 at once and
OpenCode at 8 when installed. Per level: success rate, wall p50/p95 and p50/p95 of every phase outside the agent from
the result's `timings` (boot: sandbox/workspace, agent config, env check, task setup; diff; close; grading: imports,
sandbox, env, tests, parse, close; server bookkeeping: the rest of the server's wall), the client's extra time
(transport, queueing, storing the result), the load average around it, and the headline: time outside the agent
(server wall minus the agent phase) p50, with the ratio 8-at-once ÷ alone. Goals (issue 19): alone ≤ 1.0 s,
8 at once ≤ 2x alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import ExitStack

from swe_gym_env.benchmarks import emit, pct
from swe_gym_env.benchmarks.stack import engine, rss_kib, server

TASKS = 6  # bundled tasks; rollout i runs task i % TASKS
PHASES = (
    "prepare",
    "boot.sandbox",
    "boot.config",
    "boot.env",
    "boot.setup",
    "boot",
    "after_agent",
    "diff",
    "close",
    "grade.imports",
    "grade.sandbox",
    "grade.env",
    "grade.tests",
    "grade.parse",
    "grade.close",
    "grade.baseline",
    "grade.canaries",
    "grade.prepare",
    "grade",
    "result",
)
# they tile the server's wall (grade.prepare: a task's first grading here, outside the rollout's deadline)
TOP = ("prepare", "boot", "agent", "after_agent", "diff", "close", "grade.prepare", "grade", "result")


async def _batch(url: str, n: int, harness: str, first: int = 0) -> tuple[list, list[float], float]:
    from swe_gym_env.client.ws_client import SweGymWSClient

    async def one(i: int):
        t = time.monotonic()
        async with SweGymWSClient(url) as c:
            r = await c.run_rollout(harness=harness, index=i % TASKS, max_model_calls=20)
        return r, time.monotonic() - t

    t0 = time.monotonic()
    pairs = await asyncio.gather(*(one(first + i) for i in range(n)))
    return [r for r, _ in pairs], [w for _, w in pairs], time.monotonic() - t0


def _phases(results: list, client_walls: list[float]) -> dict[str, dict[str, float]]:
    """p50/p95 (seconds) of each phase outside the agent, over the rollouts that finished ok."""
    ok = [(r, w) for r, w in zip(results, client_walls, strict=True) if r.ok]
    per: dict[str, list[float]] = {k: [] for k in (*PHASES, "bookkeeping", "client_extra", "outside_agent")}
    for r, w in ok:
        t = r.timings
        for k in PHASES:
            if k in t:
                per[k].append(t[k])
        per["bookkeeping"].append(max(0.0, r.wall_s - sum(t.get(k, 0.0) for k in TOP)))
        per["client_extra"].append(max(0.0, w - r.wall_s))
        per["outside_agent"].append(r.wall_s - t.get("agent", 0.0))
    return {k: {"p50": round(pct(v, 50), 3), "p95": round(pct(v, 95), 3)} for k, v in per.items() if v}


def _level(label: str, results: list, client_walls: list[float], wall: float, load: tuple, peak: float) -> dict:
    ok = [r for r in results if r.ok]
    walls = [r.wall_s for r in results]
    errors = sorted({(r.phase, (r.error or "")[:120]) for r in results if not r.ok})
    integrity: dict[str, int] = {}  # clean / tampered / patch_broke_run: what grading saw the code under test do
    for r in ok:
        kind = r.grading.integrity.split(":", 1)[0] if r.grading is not None else "not_graded"
        integrity[kind] = integrity.get(kind, 0) + 1
    phases = _phases(results, client_walls)
    outside = phases.get("outside_agent", {})
    return {
        "level": label,
        "rollouts": len(results),
        "ok": len(ok),
        "success_rate": round(len(ok) / max(1, len(results)), 3),
        "wall_p50_s": round(pct(walls, 50), 2),
        "wall_p95_s": round(pct(walls, 95), 2),
        "agent_p50_s": round(pct([r.timings.get("agent", 0.0) for r in ok], 50), 2) if ok else None,
        "outside_agent_p50_s": outside.get("p50"),
        "outside_agent_p95_s": outside.get("p95"),
        "phases_s": phases,
        "batch_wall_s": round(wall, 1),
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "server_peak_rss_mib": round(peak, 1),
        "integrity": integrity,
        "errors": errors[:5],
    }


def _run_level(base: str, pid: int, label: str, harness: str, n: int, repeat: int, first: int = 0) -> dict:
    """``repeat`` batches of ``n`` rollouts at once, pooled into one row."""
    load = os.getloadavg()
    results, walls, took = [], [], 0.0
    for b in range(repeat):
        r, w, t = asyncio.run(_batch(base, n, harness, first + b * n))
        results += r
        walls += w
        took += t
    return _level(label, results, walls, took, load, rss_kib(pid, "VmHWM") / 1024)


HEADER = [
    "level",
    "ok",
    "outside p50",
    "p95",
    "boot",
    "diff",
    "grade",
    "tests",
    "agent p50",
    "wall p50",
    "integrity",
    "load",
]
NOTE = (
    "outside the agent = the server's wall for the rollout minus its agent phase (queueing excluded: "
    "client_extra has it, with transport and storing); server concurrency 8 (SWE_GYM_MAX_ROLLOUTS): larger "
    "batches queue; phases in seconds over ok rollouts; peak RSS is the server process's high-water mark"
)


def _levels(quick: bool) -> list[dict]:
    """Every level's row, in order: the warm-up, one alone, 8 at once, and with the full run 32 / 64 and OpenCode."""
    from swe_gym_env.server.agents.registry import HARNESSES

    with ExitStack() as stack:
        context = str(max(8192, *(cls.min_context_tokens for cls in HARNESSES.values())))  # room for every harness
        eng = engine(stack, "oracle", ["--max-model-len", context])
        env = {"SWE_GYM_MAX_ROLLOUTS": "8", "SWE_GYM_UI": "0", "SWE_GYM_CONTEXT_WINDOW": context}
        base, proc, _ = server(stack, eng, env)
        rows_out = [_run_level(base, proc.pid, "warm-up: each task once", "pi", TASKS, 1)]
        rows_out.append(_run_level(base, proc.pid, "1 alone", "pi", 1, TASKS if quick else 2 * TASKS))
        rows_out.append(_run_level(base, proc.pid, "8 at once", "pi", 8, 1 if quick else 3))
        if not quick:
            rows_out += [_run_level(base, proc.pid, f"{n} at once", "pi", n, 1) for n in (32, 64)]
            if "opencode" in HARNESSES:
                try:
                    HARNESSES["opencode"]().mounts()
                    rows_out.append(_run_level(base, proc.pid, "opencode 8 at once", "opencode", 8, 1))
                except Exception as e:  # not installed: say so in the output rather than fail the bench
                    rows_out.append({"level": "opencode 8 at once", "skipped": str(e)})
    return rows_out


def _table_row(r: dict) -> list:
    def p50(k: str):
        return r.get("phases_s", {}).get(k, {}).get("p50", "-")

    return [
        r["level"],
        f"{r.get('ok', '-')}/{r.get('rollouts', '-')}",
        r.get("outside_agent_p50_s", "-"),
        r.get("outside_agent_p95_s", "-"),
        p50("boot"),
        p50("diff"),
        p50("grade"),
        p50("grade.tests"),
        r.get("agent_p50_s", "-"),
        r.get("wall_p50_s", r.get("skipped", "-")),
        " ".join(f"{k}={v}" for k, v in sorted(r.get("integrity", {}).items())) or "-",
        r.get("loadavg_before", ["-"])[0],
    ]


def run(as_json: bool, quick: bool = False) -> int:
    rows_out = _levels(quick)
    alone, eight = rows_out[1], rows_out[2]
    a, e = alone.get("outside_agent_p50_s"), eight.get("outside_agent_p50_s")
    ratio = round(e / a, 2) if a and e else None
    doc = {
        "bench": "rollouts",
        "cpus": os.cpu_count(),
        "outside_agent_p50_alone_s": a,
        "outside_agent_p50_8_at_once_s": e,
        "ratio_8_at_once_to_alone": ratio,
        "goals": {"alone_p50_le_1s": a is not None and a <= 1.0, "ratio_le_2": ratio is not None and ratio <= 2.0},
        "note": NOTE,
        "results": rows_out,
    }
    emit(doc, as_json, [_table_row(r) for r in rows_out], HEADER)
    if not as_json:
        print(f"outside the agent p50: alone {a} s, 8 at once {e} s, ratio {ratio} (goals: ≤ 1.0 s, ≤ 2)")
    return 0
