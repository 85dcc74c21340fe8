"""Codex (`@openai/codex`), run headless: `codex exec --json`, prompt on stdin, OpenAI Responses dialect.

Only the native binary is installed (`@openai/codex@<version>-linux-x64`, npm's alias package
`@openai/codex-linux-x64`: a static-pie musl executable plus a static ripgrep, no install script). Its bundle holds
`bin/codex` and `bin/rg`.

Configuration (`$CODEX_HOME/config.toml`, written per rollout; NOTES §3): a custom provider `capture` with
`wire_api = "responses"` pointed at `/capture/v1` (the built-in provider would try a WebSocket and send no key), the
key read from an environment variable (`env_key`), never argv; no analytics, no plugins (else `git ls-remote` to
GitHub), no web search, no update check, no MCP servers. A task repo's own `.codex/config.toml` is ignored because
the project is never trusted (no `[projects]` entry).

Codex has no turn limit of its own: the capture session's model-call budget bounds it.

The agent's record is its session transcript (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<ts>-<id>.jsonl`), copied to
a fixed path while it runs, followed by the `exec --json` stream (its `error` / `turn.failed` events). One model call
is the assistant-side items it produced (`response_item`: message, reasoning, function_call, custom_tool_call)
closed by an `event_msg` `token_count` whose `last_token_usage.output_tokens` is that call's completion tokens.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import LOAD_KEY
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import key_and_prompt
from swe_gym_env.server.agents.base import npm_install
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import BundledHarness

PROVIDER = "capture"
KEY_ENV = "SWE_GYM_CAPTURE_KEY"
CODEX_HOME = f"{AGENT_HOME}/.codex"
EVENTS = f"{AGENT_HOME}/codex-events.jsonl"
STDOUT = f"{AGENT_HOME}/codex-exec.jsonl"
STDERR = f"{AGENT_HOME}/codex-stderr.txt"
VENDOR = "vendor/x86_64-unknown-linux-musl"
UNREACHABLE = ("connect", "connection", "dns", "timed out", "timeout", "unreachable", "error sending request")
CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")


def _toml(value: object) -> str:
    return json.dumps(value)  # a JSON string or number is a valid TOML basic string / number


class CodexHarness(BundledHarness):
    name: ClassVar[str] = "codex"
    version: ClassVar[str] = "0.171.0"
    dialect: ClassVar[str] = "openai-responses"
    min_context_tokens: ClassVar[int] = 12288  # its first request is ~6k tokens (instructions + tools)
    package: ClassVar[str] = "@openai/codex"  # installed as its linux-x64 native build (`<version>-linux-x64`)
    needs_node: ClassVar[bool] = False
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    min_glibc: ClassVar[str] = "2.17"  # static-pie musl: no glibc symbols at all (any image with a kernel runs it)
    bundle_probe: ClassVar[str] = "./bin/codex --version >/dev/null && ./bin/rg --version >/dev/null"
    bundle_verifier: ClassVar[str | None] = None
    events_path = EVENTS
    log_path = STDERR

    def vendor(self, root: Path) -> Path:
        return root / "node_modules" / self.package / VENDOR

    def ensure_installed(self, log=print) -> Path:
        root = self.install_dir()
        binary = self.vendor(root) / "bin" / "codex"
        if not binary.is_file():
            npm_install(root, f"{self.package}@{self.version}-linux-x64", binary, log=log)
        return root

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        vendor = self.vendor(self.install_dir())
        return {"bin/codex": vendor / "bin" / "codex", "bin/rg": vendor / "codex-path" / "rg"}

    def config_toml(self, cfg: AgentConfig) -> str:
        lines = [
            f"model = {_toml(cfg.model)}",
            f"model_provider = {_toml(PROVIDER)}",
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',  # the rollout's sandbox is the sandbox
            f"model_context_window = {int(cfg.context_window)}",
            f"model_max_output_tokens = {int(cfg.max_tokens)}",
            'web_search = "disabled"',
            "check_for_update_on_startup = false",
            "hide_agent_reasoning = false",
            'cli_auth_credentials_store = "file"',
            "",
            f"[model_providers.{PROVIDER}]",
            f"name = {_toml(PROVIDER)}",
            f"base_url = {_toml(cfg.base_url.rstrip('/') + '/v1')}",
            f"env_key = {_toml(KEY_ENV)}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "",
            "[history]",
            'persistence = "none"',
            "",
            "[otel]",
            'exporter = "none"',
            "log_user_prompt = false",
            "",
        ]
        return "\n".join(lines)

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        return {
            f"{CODEX_HOME}/config.toml": (self.config_toml(cfg).encode(), 0o600),
            **key_and_prompt({KEY_ENV: key}, prompt),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{BUNDLE_MOUNT}/bin/codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "
            f"--model {shlex.quote(cfg.model)} - < {PROMPT_FILE} > {STDOUT} 2> {STDERR}"
        )
        return (
            LOAD_KEY + f"export CODEX_HOME={CODEX_HOME} PATH={BUNDLE_MOUNT}/bin:$PATH RUST_LOG=error "
            "CODEX_DISABLE_TELEMETRY=1 NO_BROWSER=1\n"
            "unset OPENAI_API_KEY OPENAI_BASE_URL CODEX_API_KEY\n"
            + run_and_collect(run, f"{CODEX_HOME}/sessions/*/*/*/rollout-*.jsonl {STDOUT}", EVENTS)
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        calls: list[str] = []
        pending = False  # assistant-side items since the last token count
        last_total: object = None
        for ev in jsonl_objects(text):
            kind = ev.get("type")
            payload = ev.get("payload")
            payload = payload if isinstance(payload, dict) else {}
            if kind == "response_item":
                item = payload.get("type")
                if item in CALL_ITEMS:
                    calls.append(str(payload.get("call_id") or payload.get("id")))
                    pending = True
                elif item == "reasoning" or (item == "message" and payload.get("role") == "assistant"):
                    pending = True
            elif kind == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                if not isinstance(info, dict):
                    continue
                total = info.get("total_token_usage")
                if total == last_total and not pending:
                    continue  # a repeated count (rate-limit refresh), not a new call
                last_total = total
                last = info.get("last_token_usage") or {}
                n = last.get("output_tokens") if isinstance(last, dict) else None
                out.add_step(n if isinstance(n, int) else None, tuple(calls))
                calls, pending = [], False
            elif kind == "event_msg" and payload.get("type") in ("error", "stream_error"):
                errors.append(str(payload.get("message") or "model call failed"))
            elif kind in ("error", "turn.failed"):  # the `exec --json` stream
                err = ev.get("error") if kind == "turn.failed" else ev
                message = err.get("message") if isinstance(err, dict) else None
                errors.append(str(message or json.dumps(ev)[:300]))
        settle_errors(out, errors, UNREACHABLE)
        return out
