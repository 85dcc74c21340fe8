"""Per-exec overhead and create→ready time per sandbox backend, as JSON: `python scripts/bench_sandboxes.py [N]`."""

import asyncio
import json
import statistics
import sys
import time

from swe_gym_env.names import SANDBOXES
from swe_gym_env.server.sandbox.base import SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.preflight import preflight
from swe_gym_env.server.sandbox.registry import backend_class, create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks


async def bench(backend: str, n: int) -> dict:
    t = bundled_tasks()[0]
    spec = SandboxSpec(repo_source=t.repo_source or "", base_commit=t.base_commit)
    creates, execs, closes = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = await create_sandbox(backend, spec)
        creates.append(time.perf_counter() - t0)
        for _ in range(5):
            t0 = time.perf_counter()
            await sbx.exec("true", timeout=30)
            execs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await sbx.close()
        closes.append(time.perf_counter() - t0)
    ms = lambda xs: {"p50_ms": round(statistics.median(xs) * 1000, 1), "max_ms": round(max(xs) * 1000, 1)}  # noqa: E731
    return {"create_to_ready": ms(creates), "exec_true": ms(execs), "close": ms(closes), "samples": n}


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = {}
    for backend in SANDBOXES:
        try:
            if not backend_class(backend).takes_repo_source:  # a bundled task is a repository on this host
                continue
        except SandboxUnavailable as e:
            out[backend] = {"skipped": str(e)}
            continue
        pf = preflight(backend)
        out[backend] = await bench(backend, n) if pf["available"] else {"skipped": pf.get("reason")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
