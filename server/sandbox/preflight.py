"""Which sandbox backends are usable in this process, from a real probe of each, and the default one.

A backend is usable only after it has been tried here: `local` starts a trivial bubblewrap sandbox (its namespaces
created, `true` run inside), `landlock` confines `true` under a ruleset and checks the denials hold, `docker` asks
the daemon and finds the default image, `hf` / `e2b` find their SDK, credentials and the server's public URL (no
network call). Probes run once per process (cached: they cost milliseconds to seconds), concurrently, each bounded
by PROBE_TIMEOUT_S; `probe_all` runs them off the event loop.

The default sandbox (a request that names none) is the first usable backend in ORDER: the host backends first
(isolation without a network hop or a bill), then the daemon, then the remote services. When none is usable the
error says, per backend, why not and what to configure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

from swe_gym_env.server.sandbox.base import SandboxUnavailable
from swe_gym_env.server.sandbox.registry import BACKENDS, backend_class

ORDER = ("local", "landlock", "docker", "hf", "hf-pool", "e2b")  # default-sandbox preference; others follow
PROBE_TIMEOUT_S = 20.0
CONFIGURE = {  # what makes each backend usable, for the "none is usable" error
    "local": "bubblewrap able to create namespaces (a host or VM; not an unprivileged container) + `swe-gym-env setup`",
    "landlock": "Linux >= 6.12 with Landlock enabled and allowed by the seccomp profile + `swe-gym-env setup`",
    "docker": "a reachable docker daemon with the default image (scripts/setup_docker.sh)",
    "hf": "set HF_TOKEN and SWE_GYM_PUBLIC_URL (this server's public URL, e.g. the Space's https://…hf.space)",
    "hf-pool": "set HF_TOKEN and SWE_GYM_PUBLIC_URL (this server's public URL, e.g. the Space's https://…hf.space)",
    "e2b": "pip install 'swe_gym_env[sandboxes]', set E2B_API_KEY and SWE_GYM_PUBLIC_URL",
}

_cache: dict[str, dict] = {}
_cache_env: tuple[tuple[str, str], ...] = ()  # what the cached probes read: another environment probes again
_lock = threading.Lock()


def _probe_env() -> tuple[tuple[str, str], ...]:
    """The variables a probe's answer depends on (the cache root, credentials, PATH for npm and bwrap)."""
    keep = ("PATH", "HOME", "XDG_CACHE_HOME")
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k in keep or k.startswith(("SWE_GYM_", "HF_", "E2B_")))
    )


def _probe(name: str) -> dict:
    try:
        cls = backend_class(name)
    except SandboxUnavailable as e:
        return {"usable": False, "reason": str(e)}
    try:
        ok, detail = cls.preflight()
    except Exception as e:  # a probe that breaks is a reason, not a crash of `info` or /health
        ok, detail = False, f"probe failed: {type(e).__name__}: {e}"
    return {"usable": bool(ok), "reason": detail}


def ordered() -> list[str]:
    """Every registered backend, in default-sandbox preference order."""
    return [n for n in ORDER if n in BACKENDS] + [n for n in BACKENDS if n not in ORDER]


def _run(names: list[str], fresh: bool) -> None:
    global _cache_env
    with _lock:  # one round of probes at a time; later callers read its results
        if (env := _probe_env()) != _cache_env:
            _cache.clear()
            _cache_env = env
        todo = [n for n in names if fresh or n not in _cache]
        if not todo:
            return
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="sbx-probe")
        futures = {n: pool.submit(_probe, n) for n in todo}
        concurrent.futures.wait(futures.values(), timeout=PROBE_TIMEOUT_S)
        for n, f in futures.items():
            late = {"usable": False, "reason": f"probe did not finish within {PROBE_TIMEOUT_S:.0f} s"}
            _cache[n] = f.result() if f.done() else late
        pool.shutdown(wait=False, cancel_futures=True)  # a hung probe is abandoned, never waited for


def preflight_all(fresh: bool = False) -> dict[str, dict]:
    """Per backend (in ORDER): {"usable": bool, "reason": what the probe found}. Blocking on first call (or with
    `fresh`); cached for the process after that. Probes run concurrently, each bounded by PROBE_TIMEOUT_S."""
    _run(ordered(), fresh)
    return {n: dict(_cache[n]) for n in ordered()}


def preflight(name: str, fresh: bool = False) -> dict:
    """One backend's probe result (cached like `preflight_all`); an unknown name is a SandboxError."""
    if name not in BACKENDS:
        backend_class(name)  # raises, naming the known backends
    _run([name], fresh)
    return dict(_cache[name])


async def probe_all() -> dict[str, dict]:
    """`preflight_all` without blocking the event loop (immediate once the probes have run)."""
    if _probe_env() == _cache_env and all(n in _cache for n in ordered()):
        return preflight_all()
    return await asyncio.to_thread(preflight_all)


def default_sandbox(results: dict[str, dict] | None = None) -> str:
    """The first usable backend in ORDER; SandboxUnavailable naming, per backend, why not and what to configure."""
    results = results if results is not None else preflight_all()
    for name, r in results.items():
        if r["usable"]:
            return name
    why = "; ".join(f"{n}: {r['reason']}" for n, r in results.items())
    todo = "; ".join(f"for `{n}`: {CONFIGURE[n]}" for n in results if n in CONFIGURE)
    raise SandboxUnavailable(f"no sandbox backend is usable here ({why}). To run rollouts, configure one: {todo}")


def resolved(results: dict[str, dict]) -> str | None:
    """`default_sandbox`, or None when no backend is usable."""
    try:
        return default_sandbox(results)
    except SandboxUnavailable:
        return None


def summary_lines(results: dict[str, dict]) -> list[str]:
    """For a startup log: each backend's probe, then the default sandbox, or that none is usable and what to do."""
    lines = [f"sandbox {n}: {'usable' if r['usable'] else 'NOT usable'}: {r['reason']}" for n, r in results.items()]
    try:
        lines.append(f"default sandbox (`auto`): {default_sandbox(results)}")
    except SandboxUnavailable as e:
        lines.append(f"NO sandbox is usable: rollouts will fail until one is. {e}")
    return lines
