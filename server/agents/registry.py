"""Harnesses by name: adding an agent is one class plus one entry here."""

from __future__ import annotations

from swe_gym_env.server.agents.base import AgentError, Harness
from swe_gym_env.server.agents.opencode import OpenCodeHarness
from swe_gym_env.server.agents.pi import PiHarness

HARNESSES: dict[str, type] = {"pi": PiHarness, "opencode": OpenCodeHarness}


def get_harness(name: str) -> Harness:
    cls = HARNESSES.get(name)
    if cls is None:
        raise AgentError("install", f"unknown harness {name!r}; known: {sorted(HARNESSES)}")
    return cls()
