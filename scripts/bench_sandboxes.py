"""Per-exec overhead and create→ready time per sandbox backend, as JSON:
`python scripts/bench_sandboxes.py [N] [BACKEND ...]` (default: every backend that takes a host repository).

`create_to_ready`: create (clone of a bundled task at its base commit) until the first command may run; `exec_true`:
one `exec("true")`; `exec_relay`: one `exec("true", relay=True)` with a capture endpoint as the server offers it (for
`local` the in-sandbox relay starts, for `landlock` the launcher supervises connect()); `close`. The `baseline` row
is a plain `/bin/sh -c true` subprocess on this host: the floor every backend's exec pays on top of.
"""

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from swe_gym_env.core.names import SANDBOXES
from swe_gym_env.server.sandbox.base import SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.landlock import CAPTURE_PORT_FILE
from swe_gym_env.server.sandbox.preflight import preflight
from swe_gym_env.server.sandbox.registry import backend_class, create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks


def ms(xs: list[float]) -> dict:
    return {"p50_ms": round(statistics.median(xs) * 1000, 1), "max_ms": round(max(xs) * 1000, 1)}


async def capture_endpoint(folder: Path) -> tuple[Path, list]:
    """An idle stand-in for the server's capture listeners: its unix socket and the TCP port file beside it."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    sock = folder / "capture.sock"
    servers = [await asyncio.start_unix_server(handle, str(sock)), await asyncio.start_server(handle, "127.0.0.1", 0)]
    (folder / CAPTURE_PORT_FILE).write_text(str(servers[1].sockets[0].getsockname()[1]))
    return sock, servers


async def baseline(n: int) -> dict:
    runs = []
    for _ in range(n * 5):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", "true")
        await proc.wait()
        runs.append(time.perf_counter() - t0)
    return {"exec_true": ms(runs), "samples": n * 5}


async def bench(backend: str, n: int, sock: Path) -> dict:
    t = bundled_tasks()[0]
    spec = SandboxSpec(repo_source=t.repo_source or "", base_commit=t.base_commit, capture_socket=sock)
    creates, execs, relays, closes = [], [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sbx = await create_sandbox(backend, spec)
        creates.append(time.perf_counter() - t0)
        for _ in range(5):
            t0 = time.perf_counter()
            await sbx.exec("true", timeout=30)
            execs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await sbx.exec("true", timeout=30, relay=True)
        relays.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await sbx.close()
        closes.append(time.perf_counter() - t0)
    return {
        "create_to_ready": ms(creates),
        "exec_true": ms(execs),
        "exec_relay": ms(relays),
        "close": ms(closes),
        "samples": n,
    }


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    wanted = sys.argv[2:] or list(SANDBOXES)
    out: dict[str, dict] = {"baseline": await baseline(n)}
    with tempfile.TemporaryDirectory() as d:
        sock, servers = await capture_endpoint(Path(d))
        try:
            for backend in wanted:
                try:
                    if not backend_class(backend).takes_repo_source:  # a bundled task is a repository on this host
                        continue
                except SandboxUnavailable as e:
                    out[backend] = {"skipped": str(e)}
                    continue
                pf = preflight(backend)
                out[backend] = await bench(backend, n, sock) if pf["usable"] else {"skipped": pf["reason"]}
        finally:
            for s in servers:
                s.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
