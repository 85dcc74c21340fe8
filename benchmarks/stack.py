"""What the benches run against: the built-in engine and the server as processes on free loopback ports, stopped
when the bench's ExitStack closes (started with `swe_gym_env.core.procs`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack

from swe_gym_env.core import procs

ME = [sys.executable, "-m", "swe_gym_env.cli"]


def start(
    stack: ExitStack, argv: Sequence[str], health: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> tuple[subprocess.Popen, float]:
    """Start ``argv`` (output discarded), wait until ``health`` answers 200; returns (process, seconds to healthy)."""
    t0 = time.monotonic()
    proc = procs.start(
        argv,
        health,
        stack=stack,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout,
        grace=15,
    )
    return proc, time.monotonic() - t0


def engine(stack: ExitStack, policy: str = "oracle", extra: list[str] | None = None) -> str:
    port = procs.free_port()
    start(
        stack,
        [*ME, "engine", "--port", str(port), "--policy", policy, *(extra or [])],
        f"http://127.0.0.1:{port}/health",
    )
    return f"http://127.0.0.1:{port}/v1"


def server(
    stack: ExitStack, engine_url: str, env: Mapping[str, str] | None = None
) -> tuple[str, subprocess.Popen, float]:
    port = procs.free_port()
    argv = [*ME, "serve", "--port", str(port), "--engine-url", engine_url]
    proc, took = start(stack, argv, f"http://127.0.0.1:{port}/health", env)
    url = f"http://127.0.0.1:{port}"
    wait_warm(url)
    return url, proc, took


def wait_warm(url: str, timeout: float = 120) -> None:
    """Measure a warm server: the grading imports it loads in a thread at start take seconds of CPU."""
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end and not httpx.get(f"{url}/health", timeout=5).json().get("warm"):
        time.sleep(0.2)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """VmRSS (now) or VmHWM (peak) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0
