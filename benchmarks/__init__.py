"""Benchmarks: `swe-gym-env bench {capture,graph,result,rollouts,server,…} [--json]`.

Each compares against a baseline measured in the same run (absolute times on a shared machine are noise) and prints
one JSON document (``--json``) or a short table. Not part of the runtime server: the CLI imports a bench lazily, and
nothing under `swe_gym_env.server` imports this package (import-linter checks it). The stub engine here
(`stub_engine.py`) is a bench fixture, not the built-in engine (`swe_gym_env.server.engine`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summary_ms(values: Sequence[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": round(pct(values, 50) * 1000, 3),
        "p99_ms": round(pct(values, 99) * 1000, 3),
        "mean_ms": round(statistics.fmean(values) * 1000, 3) if values else None,
    }


def emit(doc: dict, as_json: bool, rows: list[list] | None = None, header: list[str] | None = None) -> None:
    if as_json:
        print(json.dumps(doc, indent=1))
        return
    if rows and header:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for r in rows:
            print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))
    else:
        print(json.dumps(doc, indent=1))
