"""`swe-gym-env bench server`: startup time (start → /health answers) and idle memory of the server.

Baselines in the same run: a bare Starlette app under uvicorn (what any Python web server costs here), and the server
without the Gradio UI (SWE_GYM_UI=0), so the table shows what the server and the UI each add.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import ExitStack

from swe_gym_env.benchmarks import emit
from swe_gym_env.benchmarks.stack import rss_kib, server, start
from swe_gym_env.core.procs import free_port

BARE = (
    "import sys, uvicorn\n"
    "from starlette.applications import Starlette\n"
    "from starlette.responses import PlainTextResponse\n"
    "from starlette.routing import Route\n"
    "app = Starlette(routes=[Route('/health', lambda r: PlainTextResponse('ok'))])\n"
    "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n"
)


def _bare(stack: ExitStack) -> tuple[float, int]:
    port = free_port()
    proc, took = start(stack, [sys.executable, "-c", BARE, str(port)], f"http://127.0.0.1:{port}/health")
    time.sleep(1.0)
    return took, rss_kib(proc.pid)


def _ours(stack: ExitStack, ui: bool) -> tuple[float, int]:
    # no engine is needed to start; certification happens per rollout
    env = {"SWE_GYM_UI": "1" if ui else "0"}
    _, proc, took = server(stack, "http://127.0.0.1:9/v1", env)
    time.sleep(1.0)
    return took, rss_kib(proc.pid)


def run(as_json: bool, quick: bool = False) -> int:
    reps = 1 if quick else 3
    kinds = {"bare starlette (baseline)": _bare, "server, no UI": lambda s: _ours(s, False)}
    kinds["server with UI"] = lambda s: _ours(s, True)
    results = []
    for name, fn in kinds.items():
        starts, rss = [], []
        for _ in range(reps):
            with ExitStack() as stack:
                took, kib = fn(stack)
            starts.append(took)
            rss.append(kib)
        results.append(
            {
                "process": name,
                "startup_s_median": round(statistics.median(starts), 3),
                "startup_s_all": [round(x, 3) for x in starts],
                "idle_rss_mib": round(statistics.median(rss) / 1024, 1),
            }
        )
    doc = {"bench": "server", "cpus": os.cpu_count(), "repetitions": reps, "results": results}
    rows = [[r["process"], r["startup_s_median"], r["idle_rss_mib"]] for r in results]
    emit(doc, as_json, rows, ["process", "startup s (median)", "idle RSS MiB"])
    return 0
