"""`swe-gym-env bench long`: concurrent rollouts at real size (see `soak.py`, which runs both)."""

from __future__ import annotations

from swe_gym_env.benchmarks.soak import run_long


def run(as_json: bool, quick: bool = False, calls: int = 80, concurrency: int = 16) -> int:
    return run_long(as_json, quick, calls=calls, concurrency=concurrency)
