"""What the mutation canaries cost a grading (issue 32 item 1), before and after in one run.

Every bundled task's gold patch (a 1.0: the case the canary run is for) is graded in the local sandbox with the
canaries off and on, interleaved, after one warm-up grading per task (which measures the run time, the empty-patch
baseline and builds the canaries, kept in a fresh store). Prints the grade wall p50/p95 for each and the added time.
Run: `python -m swe_gym_env.benchmarks.canaries [--rounds N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from swe_gym_env.benchmarks import pct


async def main(rounds: int) -> dict:
    from swe_gym_env.server.grading import grade, load_swebench, store
    from swe_gym_env.server.sandbox.base import SandboxSpec
    from swe_gym_env.server.sandbox.registry import create_sandbox
    from swe_gym_env.tasks.catalog import bundled_tasks

    store.STORE_DIR = Path(tempfile.mkdtemp(prefix="canary-bench-"))
    load_swebench()
    tasks = bundled_tasks()

    def make(task):
        return lambda: create_sandbox("local", SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit))

    build: list[float] = []
    for task in tasks:  # warm-up: measurements and canaries built once per task
        t = time.monotonic()
        g = await grade(task, task.patch, make(task), cache_key="local")
        build.append(time.monotonic() - t)
        assert g.reward == 1.0, (task.instance_id, g.report.integrity)
    walls: dict[bool, list[float]] = {False: [], True: []}
    canary_s: list[float] = []
    for _ in range(rounds):
        for task in tasks:
            for on in (False, True):
                timings: dict[str, float] = {}
                t = time.monotonic()
                g = await grade(task, task.patch, make(task), timings=timings, cache_key="local", use_canaries=on)
                walls[on].append(time.monotonic() - t)
                assert g.reward == 1.0, (task.instance_id, g.report.integrity)
                if on:
                    canary_s.append(timings.get("grade.canaries", 0.0))
    out = {
        "tasks": len(tasks),
        "gradings_each": len(walls[True]),
        "first_grading_s_p50": round(pct(build, 50), 2),
        "grade_s_p50_canaries_off": round(pct(walls[False], 50), 2),
        "grade_s_p50_canaries_on": round(pct(walls[True], 50), 2),
        "grade_s_p95_canaries_off": round(pct(walls[False], 95), 2),
        "grade_s_p95_canaries_on": round(pct(walls[True], 95), 2),
        "canary_run_s_p50": round(pct(canary_s, 50), 2),
    }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    print(json.dumps(asyncio.run(main(ap.parse_args().rounds)), indent=2))
