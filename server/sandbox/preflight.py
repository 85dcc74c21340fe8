"""Which sandbox backends can run right now, and why not: binary, daemon, credentials, SDK, image."""

from __future__ import annotations

from swe_gym_env.server.sandbox.base import SandboxUnavailable
from swe_gym_env.server.sandbox.registry import BACKENDS, backend_class


def preflight(name: str) -> dict:
    try:
        cls = backend_class(name)
    except SandboxUnavailable as e:
        return {"available": False, "reason": str(e)}
    try:
        ok, detail = cls.preflight()
    except Exception as e:  # a probe that breaks is a reason, not a crash of `info`
        ok, detail = False, f"preflight failed: {type(e).__name__}: {e}"
    return {"available": ok, "reason" if not ok else "detail": detail}


def preflight_all() -> dict[str, dict]:
    return {name: preflight(name) for name in BACKENDS}
