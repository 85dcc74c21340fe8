"""Every `SWE_GYM_*` setting the server, the CLI and the Space read: one pydantic-settings model.

- `Settings`: name (``SWE_GYM_`` + the field name in capitals), type, default, one-line description, secret or not
  (`SecretStr`: never printed). Read from the environment, then a ``.env`` file in the current directory.
- `startup()`: what the CLI calls before it does anything: a bad value is a `SettingsError` whose message names the
  variable, the value and what is expected (one line each); an unknown ``SWE_GYM_*`` variable is a warning naming the
  closest known name; the values that came from ``.env`` are kept here (never written to ``os.environ``): `setting`,
  `current` and `environ()` read them under the environment's own.
- `current()`: the validated model for the environment as it is now (cached while no ``SWE_GYM_*`` variable changes);
  `setting(field)`: one setting, checked alone (what server modules read, so one bad value fails only its reader).
- Families: ``SWE_GYM_MAX_ROLLOUTS_<BACKEND>`` (one per sandbox backend, `FAMILIES`).
- `INTERNAL`: names the server sets for its own sandboxes and child processes (not settings; the guard plugin and the
  in-sandbox launchers read them with the stdlib). `MARKERS`: heredoc delimiters in generated scripts.
- `markdown()` prints docs/configuration.md (`swe-gym-env config --markdown`); a test keeps the page equal to it.

Imports nothing of the project but the name list, so the server, the CLI and space_app can all use it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from swe_gym_env.core.names import SANDBOXES

PREFIX = "SWE_GYM_"
ENV_FILE = ".env"

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_size(raw: Any) -> Any:
    """``"10G"`` → 10 GiB; ``"512M"``, ``"1024"``, ``"1.5G"``, ``"8MiB"`` likewise (as results/retention.py reads)."""
    if not isinstance(raw, str):
        return raw
    s = raw.strip().upper().removesuffix("B").removesuffix("I")
    unit = s[-1] if s and s[-1] in _UNITS else ""
    try:
        value = float(s[: len(s) - len(unit)] if unit else s)
    except ValueError:
        raise ValueError("a size in bytes is needed, e.g. 1024, 512M, 10G") from None
    if value < 0:
        raise ValueError("a size must not be negative")
    return int(value * _UNITS[unit])


def parse_flag(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    s = raw.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError("a flag is needed: 1/0, true/false, yes/no, on/off")


def parse_json(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        raise ValueError("a JSON object is needed") from None


def parse_positive_int(raw: Any) -> Any:
    """A count written as digits, at least 1 (the words of the error the server always gave for it)."""
    if not isinstance(raw, str):
        return raw
    s = raw.strip()
    if not s.isdigit() or int(s) < 1:
        raise ValueError("a positive integer is needed")
    return int(s)


JsonMap = Annotated[dict[str, str], BeforeValidator(parse_json)]
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Flag = Annotated[bool, BeforeValidator(parse_flag)]
PositiveInt = Annotated[int, Field(gt=0)]
Count = Annotated[int, BeforeValidator(parse_positive_int), Field(gt=0)]  # as the SWE_GYM_MAX_ROLLOUTS_* family
NonNegative = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


def _s(group: str, description: str, default: Any = None, **kw: Any) -> Any:
    return Field(default=default, description=description, json_schema_extra={"group": group}, **kw)


class Settings(BaseSettings):
    """The settings of a swe_gym_env server, its CLI and its Space (prefix ``SWE_GYM_``)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        case_sensitive=False,
        extra="ignore",
        env_ignore_empty=True,  # an empty value means unset, as the code always read it
        validate_default=False,
    )

    # engine
    engine_url: str | None = _s(
        "engine",
        "the default engine's OpenAI-compatible base URL (…/v1); unset: `serve` runs the built-in engine (NOT a model)",
    )
    engine_model: str = _s("engine", "the default engine's served model name", "smollm2-135m-instruct")
    engine_api_key: SecretStr | None = _s("engine", "the default engine's API key (never sent to sandboxes)")
    context_window: PositiveInt = _s("engine", "the context (tokens) the engine is expected to have", 8192)
    engine_delay_s: NonNegative = _s("engine", "`engine`: wait this long before each reply (to watch a rollout)", 0.0)
    engine_max_model_len: PositiveInt = _s("engine", "`engine`: the context length the built-in engine enforces", 8192)
    vllm_model: str | None = _s("engine", "`serve`: start vLLM with this model as the default engine")
    vllm_served_name: str | None = _s("engine", "`serve --vllm-model`: the name vLLM serves it under")
    vllm_tool_parser: str = _s("engine", "`serve --vllm-model`: vLLM's tool-call parser", "hermes")
    vllm_chat_template: str | None = _s("engine", "`serve --vllm-model`: a chat template file for vLLM")
    vllm_args: str = _s("engine", "`serve --vllm-model`: more vLLM flags, one shell-quoted string", "")
    vllm_startup_timeout_s: NonNegative = _s("engine", "`serve --vllm-model`: how long vLLM may take to start", 1800.0)
    vllm_python: Path | None = _s("engine", "a python that has vllm (else this one, else the checkout's .vllm-venv)")
    upstream: Literal["aiohttp", "httpx"] = _s("engine", "the HTTP client /capture forwards with", "aiohttp")

    # rollouts
    max_rollouts: Count = _s(
        "rollouts", "rollouts at once per sandbox backend (SWE_GYM_MAX_ROLLOUTS_<BACKEND> for one backend)", 8
    )
    grading_timeout_s: NonNegative = _s("rollouts", "the longest a grading run may take (caps the measured one)", 300.0)
    grading_timeout_floor_s: NonNegative = _s("rollouts", "the least test timeout grading gives a task", 120.0)
    grading_timeout_multiple: NonNegative = _s(
        "rollouts", "test timeout = the task's measured run time times this", 5.0
    )
    stall_timeout_s: NonNegative = _s("rollouts", "an engine stream silent this long ends that call", 60.0)
    max_failed_calls: PositiveInt = _s("rollouts", "failed model calls in a row that end a rollout", 5)
    canaries: Flag = _s("rollouts", "check a 1.0 again with the mutation canaries (0: off)", True)
    install_on_use: Flag = _s("rollouts", "install a harness, split or task venv on a rollout's first use", True)
    datasets: str = _s("rollouts", 'more task splits: "name=SOURCE[@split],…" (local files or Hub ids)', "")

    # storage
    data_dir: Path | None = _s("storage", "results and capture store (default ~/.cache/swe_gym_env)")
    env_home: Path | None = _s("storage", "the cache root: tokenizer, bundles, models (default ~/.cache/swe_gym_env)")
    server_id: str | None = _s("storage", "this server's id (default: one persisted in the cache dir)")
    result_cache_items: PositiveInt = _s("storage", "finished results kept in memory as JSON", 16)
    result_cache_bytes: Size = _s("storage", "… and at most this much of it", 8 * 1024**2)
    retention_max_age_h: NonNegative = _s("storage", "results and captures older than this are deleted (hours)", 168.0)
    retention_results_bytes: Size = _s("storage", "byte budget of the results store", 10 * 1024**3)
    retention_capture_bytes: Size = _s("storage", "byte budget of the capture store", 10 * 1024**3)
    retention_min_free_bytes: Size = _s("storage", "keep at least this much free on the data disk", 2 * 1024**3)
    retention_grace_s: NonNegative = _s("storage", "never delete what ended less than this long ago", 3600.0)
    retention_interval_s: NonNegative = _s("storage", "seconds between retention passes", 600.0)

    # security
    access_token: SecretStr | None = _s("security", "needed to start work (run_rollout, /ws, cancel, UI runs)")
    admin_key: SecretStr | None = _s("security", "needed for admin routes (capture sessions); also grants access")
    open_access: Flag = _s("security", "an exposed server with no secret is open on purpose (else locked)", False)
    public_reads: Flag = _s("security", "rollouts readable without the access token", False)
    bind_host: str | None = _s("security", "the address the server listens on, where `serve --host` does not say it")
    engine_url_allowlist: str = _s("security", "URL prefixes a caller may name as engine_url (comma-separated; *)", "")
    allow_engine_urls: Flag = _s(
        "security", "1: any engine_url a caller names is allowed (legacy; use the list)", False
    )
    rate_limit_per_min: int | None = _s(
        "security", "work-starting calls per minute per key (default 60 with a token, else off; 0: off)", ge=0
    )
    max_request_bytes: Size = _s("security", "largest HTTP request body the server reads", 16 * 1024**2)
    openenv_session_idle_s: NonNegative = _s("security", "an OpenEnv session idle this long expires", 3600.0)
    openenv_max_sessions: PositiveInt = _s(
        "security", "OpenEnv sessions open at most (strangers' and token holders' counted apart)", 4096
    )
    openenv_unused_session_idle_s: NonNegative = _s(
        "security", "an OpenEnv session that never did anything expires after this long", 120.0
    )
    max_connections: PositiveInt = _s("security", "`serve`: open connections at most (more: 503)", 512)
    header_timeout_s: PositiveFloat = _s(
        "security", "`serve`: a request's headers must arrive within this long (else the connection is cut)", 10.0
    )
    body_timeout_s: PositiveFloat = _s("security", "a request body silent this long between chunks is cut (408)", 30.0)
    ui: Flag = _s("security", "mount the Gradio UI at /web", True)

    # sandboxes
    docker_image: str = _s("sandboxes", "the base image of docker sandboxes", "swe-gym-env/base:bookworm")
    docker_state: Path = _s(
        "sandboxes", "scripts/setup_docker.sh: the daemon's pidfile and log", Path("/var/lib/swe-gym-docker")
    )
    debian_mirror: str = _s(
        "sandboxes", "Debian mirror for setup_docker.sh and the Python agents' runtime", "http://deb.debian.org/debian"
    )
    agent_python: Path | None = _s("sandboxes", "the Python the Python agents' runtime is copied from")
    landlock_partial: Flag = _s("sandboxes", "run landlock sandboxes on a kernel lacking parts of the ruleset", False)
    pristine_max: int = _s("sandboxes", "pristine repo trees cached (0: a clone per sandbox)", 64, ge=0)
    public_url: str | None = _s(
        "sandboxes", "this server's public URL: hf, hf-pool and e2b sandboxes reach /capture there"
    )
    e2b_templates: JsonMap = _s("sandboxes", 'E2B templates per image, JSON {"image": "template"}', {})
    remote_timeout_floor_s: int = _s("sandboxes", "the least own timeout of a cloud sandbox (seconds; 1 at least)", 60)
    hf_pool_sandboxes_per_host: PositiveInt = _s("sandboxes", "hf-pool: sandboxes per host Job", 8)
    hf_pool_warm_up: int = _s("sandboxes", "hf-pool: hosts booted when the pool is made", 0, ge=0)
    hf_pool_max_hosts: PositiveInt | None = _s("sandboxes", "hf-pool: host Jobs at most (default: no limit)")
    hf_pool_idle_timeout_s: int = _s("sandboxes", "hf-pool: an empty host shuts down after this long", 600, ge=60)

    # tools
    checkout: Path | None = _s("tools", "the source checkout (default: the current directory or a parent of it)")
    trainer_python: Path | None = _s("tools", "`parity`: a python with torch + transformers (default .trl-venv)")
    space_hf_token: SecretStr | None = _s("tools", "`push --hf-sandboxes`: the HF token the Space gets (else HF_TOKEN)")

    _families: dict[str, int] = PrivateAttr(default_factory=dict)

    def max_rollouts_for(self, backend: str) -> int:
        """``SWE_GYM_MAX_ROLLOUTS_<BACKEND>``, else ``SWE_GYM_MAX_ROLLOUTS``."""
        return self._families.get(family_name(backend), self.max_rollouts)


def env_name(field: str) -> str:
    return PREFIX + field.upper()


def family_name(backend: str) -> str:
    return f"{PREFIX}MAX_ROLLOUTS_{backend.upper().replace('-', '_')}"


# SWE_GYM_MAX_ROLLOUTS_<BACKEND>: one per sandbox backend, a positive integer each
FAMILIES: dict[str, str] = {family_name(b): b for b in SANDBOXES}

# Set by the server for its own sandboxes and child processes; not settings (the stdlib code that reads them cannot
# import this module).
INTERNAL: dict[str, str] = {
    "SWE_GYM_CAPTURE_KEY": "an agent's per-rollout capture key, in its sandbox (the agent's API key)",
    "SWE_GYM_GUARD_FD": "the grading guard's record channel (a pipe to its collector), in the grading sandbox",
    "SWE_GYM_PTYS": "pre-opened pty pairs the landlock launcher hands to OpenHands",
    "SWE_GYM_NET_LOG": "the file a Python agent's network log goes to, in its sandbox",
    "SWE_GYM_TASK_ENV": "a task's venv, in the activation script of `local` task environments",
}
# heredoc delimiters in generated shell scripts: not variables at all
MARKERS = ("SWE_GYM_PATCH_EOF", "SWE_GYM_CONDA_SH", "SWE_GYM_ACTIVATE", "SWE_GYM_CONDA")
# read by the test suite only (never by the server): not warned about
TEST_ONLY = ("SWE_GYM_AGENT_METRICS", "SWE_GYM_RECORD_VLLM_FIXTURES", "SWE_GYM_SECRET_PROBE", "SWE_GYM_VLLM_URL")


def setting_names() -> dict[str, str]:
    """``SWE_GYM_*`` name → field name, for every setting of the model."""
    return {env_name(f): f for f in Settings.model_fields}


def known_names() -> set[str]:
    return {*setting_names(), *FAMILIES, *INTERNAL, *MARKERS, *TEST_ONLY}


def secret_names() -> set[str]:
    return {env_name(f) for f, info in Settings.model_fields.items() if _is_secret(info.annotation)}


def _is_secret(annotation: Any) -> bool:
    return "SecretStr" in repr(annotation)


class SettingsError(ValueError):
    """Bad settings: one line per bad variable, each naming it, its value and what is expected."""


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:60] + ("…" if len(text) > 60 else ""))


def _problems(err: ValidationError, env: Mapping[str, str], secrets: set[str]) -> list[str]:
    lines = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else "?"
        name = env_name(field)
        raw = env.get(name, e.get("input"))
        shown = "(secret)" if name in secrets else _short(raw)
        msg = str(e["msg"]).removeprefix("Value error, ")
        lines.append(f"{name}={shown}: {msg}")
    return lines


def _swe_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(PREFIX)}


def _family_values(env: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
    values, bad = {}, []
    for name in FAMILIES:
        raw = (env.get(name) or "").strip()
        if not raw:
            continue
        if raw.isdigit() and int(raw) > 0:
            values[name] = int(raw)
        else:
            bad.append(f"{name}={_short(raw)}: a positive integer is needed")
    return values, bad


def build(env: Mapping[str, str] | None = None, env_file: str | Path | None = None) -> Settings:
    """The settings for ``env`` (default: os.environ) and an optional ``.env`` file; `SettingsError` if any is bad."""
    env = dict(os.environ if env is None else env)
    file_values = dotenv_values(env_file)
    merged = {**file_values, **_swe_env(env)}  # the environment wins over the file
    kwargs: dict[str, Any] = {}
    names = setting_names()
    for name, value in merged.items():
        if name in names and value is not None and value.strip() != "":
            kwargs[names[name]] = value
    problems: list[str] = []
    try:
        # values handed in as init kwargs, not read by pydantic-settings itself: `env` decides, not os.environ
        settings = _Isolated(**kwargs)
    except ValidationError as e:
        problems += _problems(e, merged, secret_names())
        settings = None
    families, bad = _family_values(merged)
    problems += bad
    if problems or settings is None:
        raise SettingsError("\n".join(problems))
    settings._families = families
    return settings


class _Isolated(Settings):
    """The model with no source but its init arguments (`build` reads the environment and the file itself)."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, *args, **kwargs):
        return (init_settings,)


def dotenv_values(env_file: str | Path | None) -> dict[str, str]:
    """The ``SWE_GYM_*`` entries of a ``.env`` file (none when it does not exist)."""
    if env_file is None or not Path(env_file).is_file():
        return {}
    from dotenv import dotenv_values as read

    return {k.upper(): v for k, v in read(env_file).items() if k.upper().startswith(PREFIX) and v is not None}


def unknown_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``SWE_GYM_*`` variable that is no setting, family member, internal name or marker."""
    env = os.environ if env is None else env
    known = known_names()
    candidates = sorted({*setting_names(), *FAMILIES})
    out = []
    for name in sorted(_swe_env(env)):
        if name in known:
            continue
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else " (`swe-gym-env config` lists the settings)"
        out.append(f"warning: {name} is not a swe_gym_env setting, it is ignored{hint}")
    return out


def sources(env: Mapping[str, str] | None = None, env_file: str | Path | None = ENV_FILE) -> dict[str, str]:
    """Setting name → where its value comes from: ``environment``, ``.env`` or ``default``."""
    env = os.environ if env is None else env
    file_values = dotenv_values(env_file)
    out = {}
    for name in [*setting_names(), *FAMILIES]:
        if (env.get(name) or "").strip():
            out[name] = "environment"
        elif (file_values.get(name) or "").strip():
            out[name] = ".env"
        else:
            out[name] = "default"
    return out


_from_file: dict[str, str] = {}  # the known ``.env`` values `startup` read; the environment wins over them


def environ() -> dict[str, str]:
    """os.environ as it is now, with the ``.env`` values `startup` read where the environment leaves a name unset or
    empty: what the settings are read from, and the environment for a child process that reads them itself."""
    return {**os.environ, **{k: v for k, v in _from_file.items() if not (os.environ.get(k) or "").strip()}}


def _raw(name: str) -> str:
    raw = os.environ.get(name, "")
    return raw if raw.strip() else _from_file.get(name, raw)


_current: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def current() -> Settings:
    """The validated settings for the environment as it is now (`environ`); rebuilt only when a ``SWE_GYM_*``
    variable changed (so a test that sets one before building a server gets it). A bad value raises `SettingsError`."""
    global _current
    env = environ()
    key = tuple(sorted(_swe_env(env).items()))
    if _current is None or _current[0] != key:
        _current = (key, build(env))
    return _current[1]


_one: dict[tuple[str, str], Any] = {}


def setting(field: str) -> Any:
    """One setting (by field name) from the environment as it is now (`environ`), checked alone: a module reads what
    it needs without another variable's bad value failing it (`startup` checked them all already). A bad value raises
    `SettingsError` naming the variable; an unset or empty one is the default."""
    info = Settings.model_fields[field]
    name = env_name(field)
    raw = _raw(name)
    if not raw.strip():
        return info.default
    key = (field, raw)
    if key not in _one:
        try:
            _one[key] = getattr(_Isolated.model_validate({field: raw}), field)
        except ValidationError as e:
            raise SettingsError("\n".join(_problems(e, {name: raw}, secret_names()))) from None
    return _one[key]


def max_rollouts(backend: str) -> int:
    """Rollouts at once on ``backend``: ``SWE_GYM_MAX_ROLLOUTS_<BACKEND>``, else ``SWE_GYM_MAX_ROLLOUTS`` (default 8);
    each checked alone, as `setting` does (a bad value raises `SettingsError` naming the variable)."""
    default: int = setting("max_rollouts")
    name = family_name(backend)
    values, bad = _family_values({name: _raw(name)} if name in FAMILIES else {})
    if bad:
        raise SettingsError(bad[0])
    return values.get(name, default)


def startup(env_file: str | Path | None = ENV_FILE, warn: Any = None) -> Settings:
    """Read and check the settings once, before anything starts: `SettingsError` for a bad value; a warning (through
    ``warn``, default stderr) for each unknown ``SWE_GYM_*`` variable. The known values from ``.env`` are kept for
    `setting` / `current` / `environ` (the environment still wins); os.environ is left as it is."""
    import sys

    global _from_file
    settings = build(env_file=env_file)
    _from_file = {name: value for name, value in dotenv_values(env_file).items() if name in known_names()}
    for line in unknown_warnings(environ()):
        (warn or (lambda s: print(s, file=sys.stderr, flush=True)))(line)
    return settings


# ---- describing the settings (swe-gym-env config, docs/configuration.md) -------------------------------------------


def _type_name(field: str) -> str:
    info = Settings.model_fields[field]
    ann = repr(info.annotation)
    if any(getattr(m, "func", None) is parse_size for m in info.metadata):
        return "bytes (1024, 512M, 10G)"
    if any(getattr(m, "func", None) is parse_flag for m in info.metadata):
        return "flag (1/0)"
    if "SecretStr" in ann:
        return "secret"
    if "Literal" in ann:
        return " \\| ".join(str(a) for a in re.findall(r"'([^']+)'", ann))
    for word, shown in (("dict", "JSON object"), ("Path", "path"), ("int", "integer"), ("float", "number")):
        if word in ann:
            return shown
    return "text"


def _default(field: str) -> str:
    d = Settings.model_fields[field].default
    if d is None:
        return "unset"
    if isinstance(d, bool):
        return "1" if d else "0"
    if isinstance(d, dict):
        return "{}" if not d else repr(d)
    if d == "":
        return '""'
    if _type_name(field).startswith("bytes"):
        for unit, size in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
            if d % size == 0:
                return f"{d // size}{unit}"
    return str(d)


def describe(settings: Settings | None = None, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per setting (and family member set): name, type, default, description, secret, value, source.
    Secrets are only ``set`` / ``unset``."""
    src = sources(env)
    rows = []
    for field, info in Settings.model_fields.items():
        name = env_name(field)
        row: dict[str, Any] = {
            "name": name,
            "group": (info.json_schema_extra or {}).get("group", ""),  # type: ignore[union-attr]
            "type": _type_name(field),
            "default": _default(field),
            "description": info.description or "",
            "secret": _is_secret(info.annotation),
        }
        if settings is not None:
            value = getattr(settings, field)
            if row["secret"]:
                value = "set" if value is not None else "unset"
            elif isinstance(value, Path):
                value = str(value)
            row["value"] = value
            row["source"] = src[name]
        rows.append(row)
    if settings is not None:
        for name, backend in FAMILIES.items():
            if src[name] != "default":
                rows.append(
                    {
                        "name": name,
                        "group": "rollouts",
                        "type": "integer",
                        "default": "SWE_GYM_MAX_ROLLOUTS",
                        "description": f"rollouts at once on the {backend} backend",
                        "secret": False,
                        "value": settings.max_rollouts_for(backend),
                        "source": src[name],
                    }
                )
    return rows


GROUPS = {
    "engine": "Engine",
    "rollouts": "Rollouts and grading",
    "storage": "Storage and retention",
    "security": "Access and the HTTP surface",
    "sandboxes": "Sandboxes",
    "tools": "Command-line tools",
}


def markdown() -> str:
    """docs/configuration.md, generated: `swe-gym-env config --markdown > docs/configuration.md`."""
    out = [
        "# Configuration",
        "",
        "<!-- generated by `swe-gym-env config --markdown` from swe_gym_env/core/settings.py: do not edit by hand -->",
        "",
        "Every setting is an environment variable (on a Space: a variable, or a secret for the secret ones), or a",
        "line in a `.env` file in the directory the server starts in; the environment wins. They are read and",
        "checked once at startup: a bad value stops `swe-gym-env` before it starts anything, naming the variable, the",
        "value and what is expected; an unknown `SWE_GYM_*` variable is a warning naming the closest setting.",
        "`swe-gym-env config` prints each setting with its value and where it came from (`--json`: machine-readable);",
        "secrets show only as set or unset and never appear in logs, `/health`, results or `info`.",
        "",
    ]
    rows = describe()
    for group, title in GROUPS.items():
        out += [f"## {title}", "", "| variable | type | default | what |", "| --- | --- | --- | --- |"]
        for r in rows:
            if r["group"] == group:
                desc = r["description"].replace("|", "\\|")
                out.append(f"| `{r['name']}` | {r['type']} | `{r['default']}` | {desc} |")
        out.append("")
    out += [
        "## Families",
        "",
        "| variable | type | default | what |",
        "| --- | --- | --- | --- |",
    ]
    for name, backend in FAMILIES.items():
        out.append(f"| `{name}` | integer | `SWE_GYM_MAX_ROLLOUTS` | rollouts at once on the `{backend}` backend |")
    out += [
        "",
        "## Internal names (not settings)",
        "",
        "The server sets these for its own sandboxes and child processes; setting them yourself has no effect or",
        "is overwritten.",
        "",
        "| variable | what |",
        "| --- | --- |",
    ]
    out += [f"| `{name}` | {what} |" for name, what in INTERNAL.items()]
    out += [
        "",
        "Heredoc delimiters in generated scripts (not variables): " + ", ".join(f"`{m}`" for m in MARKERS) + ".",
        "",
        "Read only by the test suite: " + ", ".join(f"`{m}`" for m in TEST_ONLY) + ".",
        "",
    ]
    return "\n".join(out)
