"""`swe-gym-env bench long` and `bench soak`: rollouts at real size, and many of them for a long time.

Both run the built-in engine in its own process (a `script:` policy: the agent — the real Pi CLI in a local sandbox —
runs a command that prints ~7 KB on every call until its call budget, so every call adds ~7k tokens of tool output
to the context) and one server (`serve`, on its own data dir), and sample the server process itself (VmRSS, open
fds) and its data dir's size while they run.

- `long` (issue 26 item 2): one warm-up rollout, then CONCURRENCY rollouts of CALLS calls at once. Reports the
  server's idle RSS (after the warm-up), its peak during the batch, (peak - idle) ÷ rollouts in flight, its RSS once
  they finished (and ÷ idle), every result's size as JSON and its longest training sequence. Goals: ≤ 64 MiB per
  in-flight 80-call rollout; back to idle ±10%; a result ≤ 5 MB.
- `soak` (item 6): rollouts of CALLS calls, CONCURRENCY at once, started for MINUTES. Reports server RSS, open fds and
  disk use over time, and the time each rollout spent outside its agent (`wall_s - timings.agent`) p50/p95 for the
  first and the last 10% of rollouts. Goal: every last-10% ÷ first-10% ratio ≤ 1.1 (nothing grows with time).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from swe_gym_env.benchmarks import emit, pct
from swe_gym_env.benchmarks.stack import engine, rss_kib, server
from swe_gym_env.wire import RolloutResult

OUTPUT_LINES = 1000  # `seq` lines per call: 7 digits + newline ≈ 8 KB, about 7k tokens (digits tokenise one by one)
CONTEXT = 1_000_000  # the engine's max model len and the agents' context window: the budget ends a rollout, not this


def _script(path: Path, calls: int) -> Path:
    """calls-1 bash calls (each printing OUTPUT_LINES different numbers), then the policy's "done"."""
    replies = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {
                        "command": f"seq {1_000_000 + k * OUTPUT_LINES} {1_000_000 + (k + 1) * OUTPUT_LINES - 1}"
                    },
                }
            ]
        }
        for k in range(calls - 1)
    ]
    path.write_text(json.dumps(replies))
    return path


def _du(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


class Sampler:
    """Samples the server's RSS and fds (every ``every`` s) and its data dir's size (every 10th sample)."""

    def __init__(self, pid: int, data: Path, every: float = 0.5) -> None:
        self.pid, self.data, self.every = pid, data, every
        self.samples: list[tuple[float, int, int, int]] = []  # (t, rss KiB, fds, disk bytes)
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        disk, n = 0, 0
        while not self._stop.is_set():
            rss = rss_kib(self.pid)
            self.peak_kib = max(self.peak_kib, rss)
            if n % 10 == 0:
                disk = _du(self.data)
            self.samples.append((time.monotonic(), rss, _fds(self.pid), disk))
            n += 1
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _settle(pid: int, seconds: float = 5.0) -> int:
    """The server's RSS once it has been quiet for a moment (the lowest of a few samples), in KiB."""
    end, low = time.monotonic() + seconds, rss_kib(pid)
    while time.monotonic() < end:
        time.sleep(0.5)
        low = min(low, rss_kib(pid))
    return low


async def _one(url: str, calls: int, index: int) -> tuple[RolloutResult, float, float]:
    from swe_gym_env.client.ws_client import SweGymWSClient

    t0 = time.monotonic()
    async with SweGymWSClient(url) as c:
        r = await c.run_rollout(index=index % 6, max_model_calls=calls, max_tokens=256, deadline_s=3600)
    return r, t0, time.monotonic()


def _stack(stack: ExitStack, calls: int, concurrency: int) -> tuple[str, int, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="swe-gym-soak-"))
    stack.callback(shutil.rmtree, tmp, True)
    eng = engine(stack, f"script:{_script(tmp / 'script.json', calls)}", ["--max-model-len", str(CONTEXT)])
    data = tmp / "data"
    env = {
        "SWE_GYM_MAX_ROLLOUTS": str(concurrency),
        "SWE_GYM_UI": "0",
        "SWE_GYM_CONTEXT_WINDOW": str(CONTEXT),
        "SWE_GYM_DATA_DIR": str(data),
    }
    url, proc, _ = server(stack, eng, env)
    return url, proc.pid, data


def _result_facts(results: list) -> dict:
    sizes = [len(r.model_dump_json()) for r in results]
    longest = [max((s.length for s in r.sequences), default=0) for r in results]
    return {
        "ok": sum(1 for r in results if r.ok),
        "errors": sorted({f"{r.phase}: {(r.error or '')[:100]}" for r in results if not r.ok})[:5],
        "turns_max": max((len(r.turns) for r in results), default=0),
        "longest_sequence_tokens": max(longest, default=0),
        "result_bytes_max": max(sizes, default=0),
        "result_bytes_p50": pct(sizes, 50) if sizes else 0,
    }


def run_long(as_json: bool, quick: bool = False, calls: int = 80, concurrency: int = 16) -> int:
    if quick:
        calls, concurrency = min(calls, 20), min(concurrency, 4)
    with ExitStack() as stack:
        url, pid, data = _stack(stack, calls, concurrency)
        asyncio.run(_one(url, 3, 0))  # warm-up: imports, the task's pristine tree, the engine's first render
        idle = _settle(pid)
        with Sampler(pid, data) as s:
            t0 = time.monotonic()

            async def batch() -> list:
                return list(await asyncio.gather(*(_one(url, calls, i) for i in range(concurrency))))

            triples = asyncio.run(batch())
            wall = time.monotonic() - t0
        after = _settle(pid, 10.0)
        results = [r for r, _, _ in triples]
        per = (s.peak_kib - idle) / 1024 / concurrency
        doc = {
            "bench": "long",
            "calls": calls,
            "concurrency": concurrency,
            "batch_wall_s": round(wall, 1),
            "server_idle_rss_mib": round(idle / 1024, 1),
            "server_peak_rss_mib": round(s.peak_kib / 1024, 1),
            "per_inflight_rollout_mib": round(per, 1),
            "server_rss_after_mib": round(after / 1024, 1),
            "after_over_idle": round(after / max(1, idle), 3),
            "fds_max": max((x[2] for x in s.samples), default=0),
            "disk_bytes_after": _du(data),
            **_result_facts(results),
            "goals": {"per_inflight_rollout_mib": 64, "after_over_idle_max": 1.1, "result_bytes_max": 5_000_000},
        }
    emit(doc, as_json, [[k, v] for k, v in doc.items() if k != "goals"], ["what", "value"])
    return 0 if doc["ok"] == concurrency else 1


def _ratio(first: list[float], last: list[float], q: float) -> float | None:
    if not first or not last:
        return None
    a, b = pct(first, q), pct(last, q)
    return round(b / a, 3) if a > 0 else None


def _soak(calls: int, concurrency: int, minutes: float) -> dict:
    """Rollouts, ``concurrency`` at once, started for ``minutes``: each (result, start, end) in order of start, the
    server's samples, its RSS idle and after, and the wall."""
    with ExitStack() as stack:
        url, pid, data = _stack(stack, calls, concurrency)
        asyncio.run(_one(url, 3, 0))
        idle = _settle(pid)
        stop_at = time.monotonic() + minutes * 60
        done: list[tuple[RolloutResult, float, float]] = []

        async def worker(w: int) -> None:
            i = w
            while time.monotonic() < stop_at:
                done.append(await _one(url, calls, i))
                i += concurrency

        with Sampler(pid, data, every=2.0) as s:
            t0 = time.monotonic()

            async def soak() -> None:
                await asyncio.gather(*(worker(w) for w in range(concurrency)))

            asyncio.run(soak())
            wall = time.monotonic() - t0
        after = _settle(pid, 10.0)
    done.sort(key=lambda x: x[1])
    return {"done": done, "samples": s.samples, "idle": idle, "after": after, "wall": wall}


def _tenths(values: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last 10% of ``values`` (one each at least)."""
    k = max(1, len(values) // 10)
    return values[:k], values[-k:]


def _drift(results: list[RolloutResult], samples: list[tuple[float, int, int, int]]) -> dict:
    """The first and last 10% of the rollouts' time outside the agent and of the server's RSS and fds, with their
    ratios."""
    first, last = _tenths([r.wall_s - r.timings.get("agent", 0.0) for r in results if r.ok])
    rss_first, rss_last = _tenths([x[1] / 1024 for x in samples])
    fds_first, fds_last = _tenths([float(x[2]) for x in samples])
    return {
        "rss_mib_first10_p50": round(pct(rss_first, 50), 1),
        "rss_mib_last10_p50": round(pct(rss_last, 50), 1),
        "fds_first10_p50": pct(fds_first, 50),
        "fds_last10_p50": pct(fds_last, 50),
        "disk_bytes_end": samples[-1][3] if samples else 0,
        "outside_agent_s_first10": {"p50": round(pct(first, 50), 3), "p95": round(pct(first, 95), 3)},
        "outside_agent_s_last10": {"p50": round(pct(last, 50), 3), "p95": round(pct(last, 95), 3)},
        "ratios_last_over_first": {
            "outside_agent_p50": _ratio(first, last, 50),
            "outside_agent_p95": _ratio(first, last, 95),
            "rss_p50": _ratio(rss_first, rss_last, 50),
            "fds_p50": _ratio(fds_first, fds_last, 50),
        },
    }


def run(as_json: bool, quick: bool = False, calls: int = 30, concurrency: int = 8, minutes: float = 30.0) -> int:
    """The soak (`bench soak`)."""
    if quick:
        calls, concurrency, minutes = min(calls, 10), min(concurrency, 4), min(minutes, 2.0)
    m = _soak(calls, concurrency, minutes)
    results = [r for r, _, _ in m["done"]]
    doc = {
        "bench": "soak",
        "calls": calls,
        "concurrency": concurrency,
        "minutes": minutes,
        "wall_s": round(m["wall"], 1),
        "rollouts": len(results),
        "server_idle_rss_mib": round(m["idle"] / 1024, 1),
        "server_rss_after_mib": round(m["after"] / 1024, 1),
        **_drift(results, m["samples"]),
        **_result_facts(results),
        "goal": "every ratio <= 1.1",
    }
    emit(doc, as_json, [[k, v] for k, v in doc.items()], ["what", "value"])
    return 0 if doc["ok"] == len(results) else 1
