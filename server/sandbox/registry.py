"""Sandbox backends by name: adding one is a class with `create(spec)` plus one entry here."""

from __future__ import annotations

from swe_gym_env.server.sandbox.base import Sandbox, SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.local import LocalSandbox

BACKENDS = {"local": LocalSandbox}


async def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    cls = BACKENDS.get(backend)
    if cls is None:
        raise SandboxError(f"unknown sandbox backend {backend!r}; known: {sorted(BACKENDS)}")
    return await cls.create(spec)
