"""`swe-gym-env bench server`: startup time (start → /health answers, then warm), the CPU it took, and idle memory.

Baselines in the same run: a bare Starlette app under uvicorn (what any Python web server costs here), and the server
without the Gradio UI (SWE_GYM_UI=0), so the table shows what the server and the UI each add. The UI is built on the
first request to /web (ui.LazyUI): its row also shows that request's time and CPU, and the RSS after it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import ExitStack

from swe_gym_env.benchmarks import emit
from swe_gym_env.benchmarks.stack import rss_kib, server, start
from swe_gym_env.procs import free_port

BARE = (
    "import sys, uvicorn\n"
    "from starlette.applications import Starlette\n"
    "from starlette.responses import PlainTextResponse\n"
    "from starlette.routing import Route\n"
    "app = Starlette(routes=[Route('/health', lambda r: PlainTextResponse('ok'))])\n"
    "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n"
)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and of its live descendants (the built-in engine, probes)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # its own and its reaped children's
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


def _bare(stack: ExitStack) -> dict:
    port = free_port()
    proc, took = start(stack, [sys.executable, "-c", BARE, str(port)], f"http://127.0.0.1:{port}/health")
    cpu = cpu_s(proc.pid)
    time.sleep(1.0)
    return {"startup_s": took, "startup_cpu_s": cpu, "rss_kib": rss_kib(proc.pid)}


def _ours(stack: ExitStack, ui: bool) -> dict:
    import httpx

    # no engine is needed to start; certification happens per rollout
    env = {"SWE_GYM_UI": "1" if ui else "0"}
    url, proc, took = server(stack, "http://127.0.0.1:9/v1", env)
    out = {"startup_s": took, "startup_cpu_s": cpu_s(proc.pid)}
    time.sleep(1.0)
    out["rss_kib"] = rss_kib(proc.pid)
    if ui:  # the first request builds the UI; a second one is the UI as it is served from then on
        before, t = cpu_s(proc.pid), time.monotonic()
        r = httpx.get(f"{url}/web/", timeout=120)
        r.raise_for_status()
        out["first_web_s"], out["first_web_cpu_s"] = time.monotonic() - t, cpu_s(proc.pid) - before
        t = time.monotonic()
        httpx.get(f"{url}/web/", timeout=120).raise_for_status()
        out["next_web_s"] = time.monotonic() - t
        out["rss_after_web_kib"] = rss_kib(proc.pid)
    return out


def run(as_json: bool, quick: bool = False) -> int:
    reps = 1 if quick else 3
    kinds = {"bare starlette (baseline)": _bare, "server, no UI": lambda s: _ours(s, False)}
    kinds["server with UI"] = lambda s: _ours(s, True)
    results = []
    for name, fn in kinds.items():
        runs = []
        for _ in range(reps):
            with ExitStack() as stack:
                runs.append(fn(stack))

        def med(key: str, scale: float = 1.0, runs: list[dict] = runs) -> float | None:
            values = [r[key] / scale for r in runs if key in r]
            return round(statistics.median(values), 3 if scale == 1.0 else 1) if values else None

        results.append(
            {
                "process": name,
                "startup_s_median": med("startup_s"),
                "startup_s_all": [round(r["startup_s"], 3) for r in runs],
                "startup_cpu_s_median": med("startup_cpu_s"),
                "idle_rss_mib": med("rss_kib", 1024),
                "first_web_s_median": med("first_web_s"),
                "first_web_cpu_s_median": med("first_web_cpu_s"),
                "next_web_s_median": med("next_web_s"),
                "rss_after_web_mib": med("rss_after_web_kib", 1024),
            }
        )
    doc = {"bench": "server", "cpus": os.cpu_count(), "repetitions": reps, "results": results}
    keys = ["startup_s_median", "startup_cpu_s_median", "idle_rss_mib", "first_web_s_median", "first_web_cpu_s_median"]
    rows = [[r["process"], *("" if r[k] is None else r[k] for k in keys)] for r in results]
    heads = ["process", "startup s", "startup CPU s", "idle RSS MiB", "first /web/ s", "its CPU s"]
    emit(doc, as_json, rows, heads)
    return 0
