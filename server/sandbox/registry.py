"""Sandbox backends by name: adding one is a class with `create(spec)` plus one entry here."""

from __future__ import annotations

from swe_gym_env.server.sandbox.base import Sandbox, SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.local import LocalSandbox

BACKENDS = {"local": LocalSandbox}


def reap_orphans() -> list[str]:
    """What each backend left behind from server processes that died (sandboxes, dirs)."""
    return [item for cls in BACKENDS.values() if hasattr(cls, "reap_orphans") for item in cls.reap_orphans()]


async def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    cls = BACKENDS.get(backend)
    if cls is None:
        raise SandboxError(f"unknown sandbox backend {backend!r}; known: {sorted(BACKENDS)}")
    return await cls.create(spec)
