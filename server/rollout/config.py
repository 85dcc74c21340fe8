"""Server configuration of the rollout service (engines, stores, limits), from the settings model
(`swe_gym_env.core.settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from swe_gym_env.core.names import SANDBOXES
from swe_gym_env.core.settings import max_rollouts, setting
from swe_gym_env.server.capture import EngineTarget
from swe_gym_env.server.engine import builtin
from swe_gym_env.server.results.retention import RetentionSettings
from swe_gym_env.server.results.store import CACHE_BYTES, CACHE_ITEMS
from swe_gym_env.server.security import engine_allowlist

DEFAULT_ENGINE_URL = "http://127.0.0.1:8001/v1"  # `swe-gym-env engine`'s own default port


def concurrency_from_env() -> dict[str, int]:
    """Rollouts running at once per sandbox backend: SWE_GYM_MAX_ROLLOUTS (default 8) for every backend, and
    SWE_GYM_MAX_ROLLOUTS_<BACKEND> (e.g. SWE_GYM_MAX_ROLLOUTS_HF_POOL=16) for one (the settings model's; a bad value
    is a `SettingsError`, a ValueError, naming the variable)."""
    return {name: max_rollouts(name) for name in SANDBOXES}


def default_engine(url: str | None = None, model: str | None = None) -> EngineTarget:
    """The default engine: ``url`` / ``model`` (a command's flags) over SWE_GYM_ENGINE_URL / _MODEL, its key
    SWE_GYM_ENGINE_API_KEY; with no URL anywhere, the built-in engine where this process runs it, else
    127.0.0.1:8001."""
    url = url or setting("engine_url")
    if not url and not model and builtin.running is not None:
        return builtin.running
    key = setting("engine_api_key")
    return EngineTarget(
        base_url=(url or DEFAULT_ENGINE_URL).rstrip("/"),
        served_model=model or setting("engine_model"),
        api_key=key.get_secret_value() if key is not None else None,
    )


@dataclass
class ServerConfig:
    engines: dict[str, EngineTarget]
    results_dir: Path | None = None
    capture_db: Path | None = None  # durable capture store (SQLite); None: in memory only
    context_window: int = 8192  # what agents are told when the engine does not say
    grading_timeout_s: float = 300.0
    canaries: bool = True  # a 1.0 is checked again with the mutation canaries (SWE_GYM_CANARIES=0: off)
    stall_timeout_s: float = 60.0  # an engine stream silent this long ends its call (well under any deadline)
    max_failed_calls: int = 5  # model calls failing in a row that end the rollout at once
    concurrency: dict[str, int] = field(default_factory=lambda: {"local": 8})  # rollouts running per backend (else 8)
    max_queue: int = 256  # rollouts waiting per backend before `capacity` errors
    allow_engine_urls: tuple[str, ...] = ()  # URL prefixes callers may name as engine_url ("*": any); security.py
    # a harness, the pypi split or a task venv a rollout needs and this server lacks is installed on first use (else:
    # refused at validate, naming the command that installs it); $SWE_GYM_INSTALL_ON_USE, server/agents/provision.py
    install_on_use: bool = True
    # what the results store and the capture store may keep (age, bytes, free-space floor): server/results/retention.py
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # finished results kept in memory as their JSON (the rest are read from disk on demand): count, and bytes
    result_cache_items: int = CACHE_ITEMS
    result_cache_bytes: int = CACHE_BYTES

    @classmethod
    def from_env(cls, engine: EngineTarget | None = None) -> ServerConfig:
        """The settings model's configuration; ``engine`` (what a command started or was told) is the default engine,
        else `default_engine()`."""
        from swe_gym_env.core.assets import cache_dir
        from swe_gym_env.server.agents.provision import install_on_use_from_env

        data = setting("data_dir")
        return cls(
            engines={"default": engine or default_engine()},
            results_dir=Path(data) / "results" if data else cache_dir() / "results",
            context_window=setting("context_window"),
            grading_timeout_s=setting("grading_timeout_s"),
            canaries=setting("canaries"),
            stall_timeout_s=setting("stall_timeout_s"),
            max_failed_calls=setting("max_failed_calls"),
            capture_db=(Path(data) if data else cache_dir()) / "capture.sqlite",
            concurrency=concurrency_from_env(),
            allow_engine_urls=engine_allowlist(),
            install_on_use=install_on_use_from_env(),
            retention=RetentionSettings.from_env(),
            result_cache_items=setting("result_cache_items"),
            result_cache_bytes=setting("result_cache_bytes"),
        )
