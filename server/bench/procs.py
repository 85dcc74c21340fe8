"""Processes the benches start: the built-in engine and the server, on free loopback ports, stopped on exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import ExitStack

ME = [sys.executable, "-m", "swe_gym_env.cli"]


def start(stack: ExitStack, argv: list[str], health: str, env: dict | None = None, timeout: float = 120) -> tuple:
    """Start ``argv``, wait until ``health`` answers 200; returns (process, seconds to healthy)."""
    from swe_gym_env.cli import _wait_healthy

    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    stack.callback(lambda: (proc.terminate(), proc.wait(15)))
    _wait_healthy(health, proc, timeout)
    return proc, time.monotonic() - t0


def engine(stack: ExitStack, policy: str = "oracle", extra: list[str] | None = None) -> str:
    from swe_gym_env.cli import free_port

    port = free_port()
    start(
        stack,
        [*ME, "engine", "--port", str(port), "--policy", policy, *(extra or [])],
        f"http://127.0.0.1:{port}/health",
    )
    return f"http://127.0.0.1:{port}/v1"


def server(stack: ExitStack, engine_url: str, env: dict | None = None) -> tuple[str, subprocess.Popen, float]:
    from swe_gym_env.cli import free_port

    port = free_port()
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
