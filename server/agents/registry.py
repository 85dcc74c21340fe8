"""Harnesses by name. The names and where each class lives are `swe_gym_env.core.names.HARNESSES` (the one list);
a class is imported on first use. Adding an agent is one class plus one row there."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from swe_gym_env.core.names import HARNESSES as _NAMES
from swe_gym_env.server.agents.base import AgentError, Harness


def harness_class(name: str) -> type[Harness]:
    if name not in _NAMES:
        raise AgentError("install", f"unknown harness {name!r}; known: {sorted(_NAMES)}")
    try:
        return _NAMES[name].load()
    except ImportError as e:
        raise AgentError("install", f"harness {name!r} cannot load ({e})") from e


def get_harness(name: str) -> Harness:
    return harness_class(name)()


class _Classes(Mapping[str, type[Harness]]):
    """Name -> class, read-only; iterating lists the names without importing anything."""

    def __getitem__(self, name: str) -> type[Harness]:
        if name not in _NAMES:
            raise KeyError(name)
        return harness_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


HARNESSES: Mapping[str, type[Harness]] = _Classes()


def harness_info() -> dict[str, dict[str, str | bool]]:
    """Per harness: version, the capture dialect it speaks (by default), whether it is ready (its bundle built) and,
    when not, whether a rollout would install it on first use here (server/agents/provision.py)."""
    from swe_gym_env.server.agents.provision import install_on_use_from_env, install_refusal

    allowed = install_on_use_from_env()
    out: dict[str, dict[str, str | bool]] = {}
    for name in _NAMES:
        try:
            h = get_harness(name)
        except AgentError as e:
            out[name] = {"ready": False, "reason": str(e)}
            continue
        row: dict[str, str | bool] = {"version": h.version, "dialect": h.dialect, "ready": True}
        try:
            h.mounts()  # raises when the install or bundle is missing
        except AgentError as e:
            refusal = install_refusal(allowed, h)
            how = f"cannot install it on first use ({refusal})" if refusal else "a rollout installs it on first use"
            row.update(ready=False, installs_on_first_use=refusal is None, reason=f"{e}; or {how}")
        out[name] = row
    return out
