"""Mistral Vibe (`mistral-vibe` on PyPI), run headless: `vibe-rs --prompt-file … --output streaming --auto-approve`
on its bundle's own Python 3.13, OpenAI chat through its `generic` backend.

Vibe 3 is two processes: `vibe-rs` (a Rust front end shipped inside the wheel, `vibe/_bin/vibe-rs`) runs the session
and starts its Python app server (`vibe.app_server.stdio`, the harness that calls the model and runs the tools) as
`$VIBE_APP_SERVER_BIN`. It needs Python >= 3.12, so the bundle's runtime is Debian trixie's CPython 3.13 with its own
loader and C library (`pyagent.DebianPythonAgent`, as OpenHands'); `vibe-rs` is started by that loader too (it needs
glibc >= 2.28 and libgcc_s, both shipped), so nothing of the image's C library is used. The app server is a small
script of ours (`SERVER`, executable, so a `landlock` sandbox maps the paths in it) that runs our launcher (`AUDIT`:
every socket the Python opens is logged) on the bundle's Python. Its packages (`PINS`) are the wheel's own exact pins
(it pins every dependency), binary wheels for CPython 3.13.

Configuration: `$VIBE_HOME/config.toml` (a private `VIBE_HOME`): one provider (`backend = "generic"`, its `api_style`
the harness option `api`: `openai` by default, `openai-responses` or `anthropic`; `api_base` the capture's root or
`/v1`, its key read from `SWE_GYM_CAPTURE_KEY`, sourced from the 0600 env file, never argv), one model
(`max_context_length`, `max_output_tokens` from the rollout), pinned as `active_model`. Offline and hermetic: no
telemetry or OpenTelemetry, no update check or auto-update, no GrowthBook experiments (a feature-flag fetch), no model
catalog, no connectors / MCP / registry skills, no notifications, no sub-agents or background processes, no session
titles (a helper model call); the OS keyring is the null backend; the image's `VIBE_*` variables (its environment config
layer) are unset; the work tree is not trusted (no `--trust`), so a repo's `.vibe/config.toml` is never read. `--max-
turns` is the harness option `max_turns`.

Its record is its session journal (`$VIBE_HOME/logs/session/unified/<session>/journal/*.jsonl`, hash-chained records,
copied to a fixed path while it runs): each model call is an `action_result` whose result is `completion_succeeded`
(its `parts`, tool calls with their ids, and `usage.output_tokens`) or `completion_failed`. `--output-dir` also gets
its `export.json` (outcome, stop reason, usage) at exit.
"""

from __future__ import annotations

import json
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import PYTHON_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import as_list
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import DebianPythonAgent

PY = pyruntime.TRIXIE_PYTHON.version
VIBE_HOME = f"{AGENT_HOME}/.vibe-home"
CONFIG = f"{VIBE_HOME}/config.toml"
LAUNCH = f"{AGENT_HOME}/vibe-app-server.py"
SERVER = f"{AGENT_HOME}/vibe-app-server"  # $VIBE_APP_SERVER_BIN: runs LAUNCH on the bundle's Python
EVENTS = f"{AGENT_HOME}/vibe-events.jsonl"
STDOUT = f"{AGENT_HOME}/vibe-stream.jsonl"
LOG = f"{AGENT_HOME}/vibe-log.txt"
NET = f"{AGENT_HOME}/vibe-net.jsonl"
OUT = f"{AGENT_HOME}/vibe-out"
KEY_ENV = "SWE_GYM_CAPTURE_KEY"
RUST_CLI = "site/vibe/_bin/vibe-rs"  # in the bundle
# its generic backend's API styles that /capture speaks (harness option `api`) -> (the capture dialect, what its
# `api_base` ends with: each style appends its own path, /chat/completions, /responses, /v1/messages)
APIS = {
    "openai": ("openai-chat", "/v1"),
    "openai-responses": ("openai-responses", "/v1"),
    "anthropic": ("anthropic-messages", ""),
}
DEFAULT_API = "openai"

PINS: tuple[str, ...] = tuple(
    """agent-client-protocol==0.11.0 annotated-types==0.7.0 anyio==4.15.1 attrs==26.1.0 backports.tarfile==1.2.0
    beautifulsoup4==4.14.3 cachetools==7.0.6 certifi==2026.7.22 cffi==2.0.0 charset-normalizer==3.4.7 click==8.3.3
    croniter==6.2.4 cryptography==50.0.0 eval-type-backport==0.3.1 gitdb==4.0.12 gitpython==3.1.62 giturlparse==0.15.0
    google-auth==2.49.2 googleapis-common-protos==1.74.0 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1 httpx-sse==0.4.3
    humanize==4.16.0 idna==3.18 importlib-metadata==8.7.1 jaraco.classes==3.4.0 jaraco-context==6.1.2
    jaraco-functools==4.4.0 jeepney==0.9.0 jsonpatch==1.33 jsonpath-python==1.1.5 jsonpointer==3.1.1
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 keyring==25.7.0 linkify-it-py==2.1.0 markdown-it-py==4.0.0
    markdownify==1.2.3 mcp==1.28.1 mdit-py-plugins==0.5.0 mdurl==0.1.2 miniaudio==1.71 mistral-vibe==3.0.2
    mistralai==2.6.0 more-itertools==11.0.2 opentelemetry-api==1.39.1 opentelemetry-exporter-otlp-proto-common==1.39.1
    opentelemetry-exporter-otlp-proto-http==1.39.1 opentelemetry-proto==1.39.1 opentelemetry-sdk==1.39.1
    opentelemetry-semantic-conventions==0.60b1 packaging==26.2 pexpect==4.9.0 platformdirs==4.9.6 protobuf==6.33.6
    ptyprocess==0.7.0 pyasn1==0.6.4 pyasn1-modules==0.4.2 pycparser==3.0 pydantic==2.13.4 pydantic-core==2.46.4
    pydantic-settings==2.14.2 pygments==2.20.0 pyjwt==2.15.1 pyperclip==1.11.0 python-dateutil==2.9.0.post0
    python-dotenv==1.2.2 python-multipart==0.0.32 pyyaml==6.0.3 referencing==0.37.0 requests==2.34.2 rfc8785==0.1.4
    rich==15.0.0 rpds-py==0.30.0 secretstorage==3.5.0 sentry-sdk==2.64.0 setproctitle==1.3.7 six==1.17.0
    smmap==5.0.3 soupsieve==2.9.2 sse-starlette==3.4.1 starlette==1.3.1 textual==8.2.8 textual-speedups==0.2.1
    tomli-w==1.2.0 tree-sitter==0.26.0 tree-sitter-bash==0.25.1 truststore==0.10.4 typing-extensions==4.16.0
    typing-inspection==0.4.2 uc-micro-py==2.0.0 urllib3==2.8.0 uvicorn==0.46.0 watchfiles==1.2.0 websockets==16.0
    zipp==3.23.1 zstandard==0.25.0""".split()
)
# the app server vibe-rs starts, with the socket audit first
LAUNCHER = (
    AUDIT
    + """sys.argv[0] = "vibe-app-server"
from vibe.app_server.stdio import main
sys.exit(main())
"""
)
QUIET = {
    "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",  # no D-Bus secret service, no macOS keychain probing
    "DO_NOT_TRACK": "1",
}
# what Vibe turns off here, each a call or a lookup of its own (the defaults are on)
OFF = (
    "enable_telemetry",
    "enable_otel",
    "enable_update_checks",
    "enable_auto_update",
    "enable_notifications",
    "enable_connectors",
    "enable_mcp",
    "experimental_enable_registry_skills",
    "experimental_enable_model_catalog",
    "enable_subagents",
    "enable_background_processes",
)


def _toml(value: object) -> str:
    return json.dumps(value)  # a JSON string, number or bool is TOML too


class MistralVibeHarness(DebianPythonAgent):
    name: ClassVar[str] = "mistral-vibe"
    version: ClassVar[str] = "3.0.2"
    # its first prompt measured 8.2k tokens on the demo task (system prompt + its ten tools): room to act beyond it
    min_context_tokens: ClassVar[int] = 16384
    package: ClassVar[str] = "mistral-vibe"
    min_glibc: ClassVar[str] = "2.17"  # its own loader and C library (vibe-rs too): the image's glibc is never used
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    pins: ClassVar[tuple[str, ...]] = PINS
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, vibe.app_server.stdio, mistralai_vibe_local_harness"
    bundle_inputs: ClassVar[tuple[str, ...]] = (*pyruntime.TRIXIE_PYTHON.recipe(), *PINS)
    bundle_probe: ClassVar[str] = (
        f"{pyruntime.python_command('.', PY)} -c 'import ssl, pydantic_core' && "
        f"./python/lib/{pyruntime.LOADER} --library-path ./python/lib ./{RUST_CLI} --version >/dev/null"
    )
    key_env: ClassVar[str] = KEY_ENV
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, CONFIG, NET, QUIET
    unset_prefix: ClassVar[str] = "VIBE_"  # its environment config layer, over ours
    events_path = EVENTS
    log_path = LOG

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        lines = ['active_model = "capture"', *(f"{k} = false" for k in OFF), "mcp_servers = []", ""]
        lines += ["[experiments]", "enable = false", "", "[session_logging]", "generate_titles = false", ""]
        api = cfg.options.get("api", DEFAULT_API)
        base = cfg.base_url.rstrip("/") + APIS[api][1]
        lines += ["[[providers]]", 'name = "capture"', f"api_base = {_toml(base)}", f"api_style = {_toml(api)}"]
        lines += [f"api_key_env_var = {_toml(KEY_ENV)}", 'backend = "generic"', ""]
        lines += ["[[models]]", f"name = {_toml(cfg.model)}", 'provider = "capture"', 'alias = "capture"']
        lines += [f"max_context_length = {int(cfg.context_window)}", f"max_output_tokens = {int(cfg.max_tokens)}"]
        return ("\n".join(lines) + "\n").encode()

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        server = f'#!/bin/sh\nexec {pyruntime.python_command(BUNDLE_MOUNT, PY)} {LAUNCH} "$@"\n'
        return {
            **super().config_files(cfg, key, prompt),
            SERVER: (server.encode(), 0o700),  # executable: landlock maps the paths in it
            PROMPT_FILE: (prompt.encode(), 0o600),
        }

    def environment(self) -> str:
        return super().environment() + f"export VIBE_HOME={VIBE_HOME} VIBE_APP_SERVER_BIN={SERVER}\n"

    def command(self, cfg: AgentConfig) -> str:
        py = f"{BUNDLE_MOUNT}/{pyruntime.RUNTIME}"
        run = (
            f"{py}/lib/{pyruntime.LOADER} --library-path {py}/lib {BUNDLE_MOUNT}/{RUST_CLI} "
            f"--prompt-file {PROMPT_FILE} "
            f"--output streaming --auto-approve --max-turns {max_turns(cfg)} --output-dir {OUT} "
            f"< /dev/null > {STDOUT} 2> {LOG}"
        )
        return self.environment() + run_and_collect(run, f"{VIBE_HOME}/logs/session/unified/*/journal/*.jsonl", EVENTS)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        seen: set[str] = set()  # a record may be in two journal segments
        for ev in jsonl_objects(text):
            if ev.get("type") != "action_result" or ev.get("record_sha256") in seen:
                continue
            seen.add(str(ev.get("record_sha256")))
            result = as_dict(as_dict(ev.get("payload")).get("result"))
            kind, body = result.get("type"), as_dict(result.get("result"))
            if kind == "completion_succeeded":
                parts = as_list(body.get("parts"))
                ids = tuple(str(p.get("id")) for p in parts if isinstance(p, dict) and p.get("type") == "tool_call")
                n = as_dict(body.get("usage")).get("output_tokens")
                out.add_step(n if isinstance(n, int) else None, ids)
            elif kind == "completion_failed":
                errors.append(str(body.get("message") or body.get("error") or json.dumps(result)[:300]))
        settle_errors(out, errors, PYTHON_UNREACHABLE, "model call(s) failed in the agent")
        return out
