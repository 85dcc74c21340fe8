"""What a grading costs with this tree's grader against another commit's, in one run (issue 40: the rebuilt grader).

Both versions grade every bundled task's gold patch (a 1.0, canaries on: the case a trainer pays most for) in the
local sandbox, each in its own process and its own fresh store, rounds interleaved (baseline, current, baseline, ...)
so that machine load falls on both alike. The first round warms each store (run times, baselines, base tree,
canaries) and is reported apart. The baseline is `git archive` of the commit, imported first on PYTHONPATH.
Run: `python -m swe_gym_env.benchmarks.grading_versions --baseline 5bd6e1c [--rounds 3]`; prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from swe_gym_env.benchmarks import pct

WORKER = r"""
import asyncio, json, os, sys, time
from pathlib import Path
import swe_gym_env
from swe_gym_env.server.grading import grade, load_swebench, store
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

async def main():
    store.STORE_DIR = Path(os.environ["BENCH_STORE"])
    load_swebench()
    walls = []
    for task in bundled_tasks():
        spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit)
        t = time.monotonic()
        g = await grade(task, task.patch, lambda: create_sandbox("local", spec), cache_key="local")
        walls.append(time.monotonic() - t)
        assert g.reward == 1.0, (task.instance_id, g.report.integrity)
    print(json.dumps({"walls": walls, "package": os.path.dirname(swe_gym_env.__spec__.origin)}))

asyncio.run(main())
"""


def _snapshot(commit: str, where: Path) -> Path:
    """The package at ``commit`` as an importable folder ``where/swe_gym_env``."""
    import swe_gym_env

    root = Path(str(swe_gym_env.__spec__.origin)).parent  # type: ignore[union-attr]
    dest = where / "swe_gym_env"
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return where


def _round(pythonpath: str | None, store: Path) -> dict:
    env = dict(os.environ, BENCH_STORE=str(store))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=3600, cwd=tempfile.gettempdir()
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker failed ({pythonpath or 'current'}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(baseline: str, rounds: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    snap = str(_snapshot(baseline, work / "baseline"))
    versions = {"baseline": snap, "current": None}
    stores = {name: work / f"store-{name}" for name in versions}
    first: dict[str, list[float]] = {}
    packages: dict[str, str] = {}
    walls: dict[str, list[float]] = {name: [] for name in versions}
    for r in range(rounds + 1):
        for name, path in versions.items():
            res = _round(path, stores[name])
            got, packages[name] = res["walls"], res["package"]
            if r == 0:
                first[name] = got
            else:
                walls[name] += got
    if packages["baseline"] == packages["current"]:
        raise RuntimeError(f"the baseline imported the current package ({packages['current']})")
    out: dict = {"baseline": baseline, "tasks": len(first["current"]), "rounds": rounds, "packages": packages}
    for name in versions:
        out[f"{name}_first_grading_s_p50"] = round(pct(first[name], 50), 2)
        out[f"{name}_grade_s_p50"] = round(pct(walls[name], 50), 2)
        out[f"{name}_grade_s_p95"] = round(pct(walls[name], 95), 2)
    out["added_s_p50"] = round(out["current_grade_s_p50"] - out["baseline_grade_s_p50"], 2)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="5bd6e1c", help="the commit to compare with (default: before issue 40)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(json.dumps(main(a.baseline, a.rounds), indent=2))
