"""Sandbox backends by name. The names, where each class lives and what it needs installed are
`swe_gym_env.core.names.SANDBOXES` (the one list): adding a backend is a class with `create(spec)` plus one row there.

Classes are imported on first use (optional SDKs load lazily).
Every sandbox gets this server's id, incarnation, host and pid as labels, so `reap_orphans` can find what a
killed server left behind (containers and cloud sandboxes by label, local dirs and cgroups by pid).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re

from swe_gym_env.core.names import SANDBOXES
from swe_gym_env.core.tempdirs import HOST, INCARNATION, server_id
from swe_gym_env.server.sandbox.base import Sandbox, SandboxBase, SandboxError, SandboxSpec, SandboxUnavailable

log = logging.getLogger(__name__)

BACKENDS = SANDBOXES  # name -> ("module:Class", what to install when it is missing)
LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def backend_class(name: str) -> type[SandboxBase]:
    if name not in BACKENDS:
        raise SandboxError(f"unknown sandbox backend {name!r}; known: {sorted(BACKENDS)}")
    try:
        return BACKENDS[name].load()
    except ImportError as e:
        raise SandboxUnavailable(f"sandbox backend {name!r} cannot load ({e})") from e


def server_labels(spec: SandboxSpec) -> dict[str, str]:
    labels = {"server": server_id(), "incarnation": INCARNATION, "host": HOST, "pid": str(os.getpid()), **spec.labels}
    for k, v in labels.items():
        if not LABEL_VALUE.match(k) or not LABEL_VALUE.match(v):
            raise SandboxError(f"bad sandbox label {k[:70]!r}={v[:70]!r}: [A-Za-z0-9_.-]{{1,64}} only")
    return labels


def reap_orphans() -> list[str]:
    """What each loadable backend left behind from server processes that died (sandboxes, dirs, cgroups)."""
    found: list[str] = []
    for name in BACKENDS:
        try:
            cls = backend_class(name)
        except SandboxUnavailable:
            continue
        try:
            found += cls.reap_orphans()
        except Exception as e:  # one backend's trouble (daemon down, no token) must not stop the others
            log.warning("reaping %s sandboxes failed: %s", name, e)
    return found


async def reap_forever(interval_s: float = 300.0) -> None:
    """Run `reap_orphans` now and then every `interval_s` (a task for the server's lifespan)."""
    while True:
        await asyncio.to_thread(reap_orphans)
        await asyncio.sleep(interval_s)


async def create_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    cls = backend_class(backend)
    spec = dataclasses.replace(spec, labels=server_labels(spec))
    return await cls.create(spec)
