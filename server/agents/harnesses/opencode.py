"""OpenCode (`opencode-ai`), run headless: `opencode run --format json --title task`, prompt on stdin, JSONL out.

Only the platform binary is installed (`opencode-linux-x64`: one self-contained Bun executable, no install script,
needs only glibc). Its bundle holds that binary and a static ripgrep (npm `@vscode/ripgrep-linux-x64`) in `bin/`.
Offline hygiene, all of it needed (NOTES §3): no models.dev fetch, no project config (a task repo's own
`opencode.json` would otherwise replace our provider and redirect the agent), the `@opencode-ai/plugin` install
pre-seeded as already done, every XDG dir and TMPDIR private to the rollout, ripgrep on PATH (the bundle's `bin/`).

Each model call is one `step_start … step_finish` pair in the events; a failed call is an `error` event.
"""

from __future__ import annotations

import json
import shlex
from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import LOAD_KEY
from swe_gym_env.server.agents.base import NODE_UNREACHABLE
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import key_and_prompt
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import NativeBinaryHarness

PROVIDER = "capture"
KEY_ENV = "SWE_GYM_CAPTURE_KEY"
HOME = f"{AGENT_HOME}/.opencode-run"  # every XDG dir and TMPDIR of the agent live here
EVENTS = f"{AGENT_HOME}/opencode-events.jsonl"
STDERR = f"{AGENT_HOME}/opencode-stderr.txt"
PLUGIN = "@opencode-ai/plugin"
OVERFLOW = "ContextOverflowError"  # the engine refused a call for the context length: OpenCode compacts, retries
# the environment switches OpenCode and its forks take (`<PREFIX>_<switch>=1`): no models.dev fetch, no project config
# (a task repo's own config would replace our provider), no file-finder download, update, LSP download or share
SWITCHES = (
    "DISABLE_MODELS_FETCH",
    "DISABLE_PROJECT_CONFIG",
    "DISABLE_FFF",
    "DISABLE_AUTOUPDATE",
    "DISABLE_LSP_DOWNLOAD",
    "DISABLE_SHARE",
)
# the AI SDK providers built into its binary that /capture speaks (harness option `api`, where wire.HARNESS_OPTIONS
# offers it: Kilo Code) -> (the capture dialect, the base URL's suffix; each provider appends its own path). Not
# `@ai-sdk/google`: it makes up its own tool-call ids (Gemini's are dropped), so no call can be matched to the capture
APIS = {
    "@ai-sdk/openai-compatible": ("openai-chat", "/v1"),
    "@ai-sdk/openai": ("openai-responses", "/v1"),
    "@ai-sdk/anthropic": ("anthropic-messages", "/v1"),
}
DEFAULT_API = "@ai-sdk/openai-compatible"


class OpenCodeHarness(NativeBinaryHarness):
    """OpenCode, and the base of its forks (Kilo Code: harnesses/kilocode.py), which differ only in what the class
    attributes below name: the binary, its environment's prefix, its config file, where its run keeps its files."""

    name: ClassVar[str] = "opencode"
    version: ClassVar[str] = "1.18.33"
    # its first prompt is ~7.9k tokens (system prompt + 10 tools): in less it compacts at once, never sees the task
    min_context_tokens: ClassVar[int] = 12288
    package: ClassVar[str] = "opencode-linux-x64"
    # what differs in a fork: its binary (also its config file's name and its XDG subdirectory), the prefix of its
    # environment switches (`<PREFIX>_DISABLE_MODELS_FETCH`, ...), the files of a run, `run`'s flags and config keys
    cli: ClassVar[str] = "opencode"
    env_prefix: ClassVar[str] = "OPENCODE"
    home: ClassVar[str] = HOME
    schema: ClassVar[str] = "https://opencode.ai/config.json"
    plugin: ClassVar[str | None] = PLUGIN  # its plugin package, whose install is pre-seeded as done
    run_flags: ClassVar[str] = "--title task"
    extra_switches: ClassVar[tuple[str, ...]] = ()  # more `<PREFIX>_<switch>=1` beyond SWITCHES
    extra_env: ClassVar[dict[str, str]] = {}
    events_path = EVENTS
    log_path = STDERR

    def config(self, cfg: AgentConfig) -> dict:
        api = cfg.options.get("api", DEFAULT_API)
        return {
            "$schema": self.schema,
            "provider": {
                PROVIDER: {
                    "npm": api,
                    "name": PROVIDER,
                    "options": {"baseURL": f"{cfg.base_url}{APIS[api][1]}", "apiKey": "{env:" + KEY_ENV + "}"},
                    "models": {
                        cfg.model: {
                            "name": cfg.model,
                            "tool_call": True,
                            "limit": {"context": cfg.context_window, "output": cfg.max_tokens},
                        }
                    },
                }
            },
            "model": f"{PROVIDER}/{cfg.model}",
            "small_model": f"{PROVIDER}/{cfg.model}",
            "autoupdate": False,
            "share": "disabled",
            "snapshot": False,
        }

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        conf_dir = f"{self.home}/config/{self.cli}"
        files = {
            f"{conf_dir}/{self.cli}.json": (json.dumps(self.config(cfg), indent=2).encode(), 0o600),
            f"{self.home}/tmp/.keep": (b"", 0o600),
            **key_and_prompt({KEY_ENV: key}, prompt),
        }
        if self.plugin:  # pre-seeded as if the plugin install had already run: else it runs `bun install` at start
            package = {"dependencies": {self.plugin: self.version}}
            lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": {self.plugin: self.version}}}}
            files[f"{conf_dir}/package.json"] = (json.dumps(package).encode(), 0o600)
            files[f"{conf_dir}/package-lock.json"] = (json.dumps(lock).encode(), 0o600)
            files[f"{conf_dir}/node_modules/.keep"] = (b"", 0o600)
        return files

    def command(self, cfg: AgentConfig) -> str:
        mount, home, p = BUNDLE_MOUNT, self.home, self.env_prefix
        switches = " ".join(f"{p}_{s}=1" for s in (*SWITCHES, *self.extra_switches))
        extra = "".join(f" {k}={shlex.quote(v)}" for k, v in self.extra_env.items())
        return (
            LOAD_KEY + f"export PATH={mount}/bin:$PATH XDG_CONFIG_HOME={home}/config XDG_CACHE_HOME={home}/cache "
            f"XDG_DATA_HOME={home}/data XDG_STATE_HOME={home}/state TMPDIR={home}/tmp {switches}{extra}\n"
            f"unset {p}_CONFIG {p}_CONFIG_CONTENT {p}_CONFIG_DIR\n"
            f"{mount}/bin/{self.cli} run --format json {self.run_flags} "
            f"< {PROMPT_FILE} > {self.events_path} 2> {self.log_path}"
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        overflows: list[tuple[str, int]] = []  # context-length refusals, with the steps made before each
        calls: list[str] = []  # tool calls of the step in progress
        for ev in jsonl_objects(text):
            kind = ev.get("type")
            part = ev.get("part")
            part = part if isinstance(part, dict) else {}
            if kind == "step_start":
                calls = []
            elif kind == "tool_use" and part.get("callID"):
                calls.append(str(part["callID"]))
            elif kind == "step_finish":
                tokens = part.get("tokens") or {}
                out.add_step(tokens["output"] if isinstance(tokens.get("output"), int) else None, tuple(calls))
                calls = []
            elif kind == "error":
                err = ev.get("error") or {}
                data = err.get("data") if isinstance(err, dict) else None
                message = (data or {}).get("message") if isinstance(data, dict) else None
                name = err.get("name") if isinstance(err, dict) else None
                said = f"{name or 'error'}: {message or json.dumps(err)[:300]}"
                if name == OVERFLOW:
                    overflows.append((said, out.model_calls))
                else:
                    errors.append(said)
        # a refusal for the context length that steps followed: OpenCode compacted its context and went on
        errors += [said for said, before in overflows if out.model_calls == before]
        settle_errors(out, errors, NODE_UNREACHABLE, "model call(s) failed in the agent")
        return out
