"""Claude Code (`@anthropic-ai/claude-code`), run headless: `claude -p --output-format stream-json`, prompt on stdin,
Anthropic Messages dialect.

Only the native binary is installed (`@anthropic-ai/claude-code-linux-x64`: one executable, no install script; the
`@anthropic-ai/claude-code` wrapper's postinstall just hard-links it). Its bundle holds `bin/claude` and a static
ripgrep (`bin/rg`, used instead of the binary's embedded one).

Configuration (NOTES §3): `ANTHROPIC_BASE_URL` is the capture root (it appends `/v1/messages`), the key is
`ANTHROPIC_API_KEY` (sent as `x-api-key`) from an env file, never argv; `CLAUDE_CONFIG_DIR` is private to the rollout
(no login or onboarding with a fresh one); `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` and the DISABLE_* switches
(no telemetry, error reports or update check); `--strict-mcp-config` (a repo's `.mcp.json` servers never start),
`--setting-sources user` (a repo's `.claude/settings*.json`, hooks included, never apply), web tools disallowed,
`--max-turns` from the harness option `max_turns`. As root it needs `IS_SANDBOX=1` to skip permissions.

The agent's record is its transcript (`$CLAUDE_CONFIG_DIR/projects/<cwd, / as ->/<session>.jsonl`), copied to a fixed
path while it runs, followed by the `stream-json` output (its `result` event says how the run ended). The transcript
writes one `assistant` record per content block; records with the same `message.id` are one model call.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
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
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import NativeBinaryHarness

CONFIG_DIR = f"{AGENT_HOME}/.claude"
EVENTS = f"{AGENT_HOME}/claude-events.jsonl"
STDOUT = f"{AGENT_HOME}/claude-stream.jsonl"
STDERR = f"{AGENT_HOME}/claude-stderr.txt"
DISALLOWED = ("WebFetch", "WebSearch")
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "ENABLE_TOOL_SEARCH": "false",  # every tool sent plainly
    "USE_BUILTIN_RIPGREP": "0",  # the bundle's rg
    "IS_SANDBOX": "1",  # skipping permissions as root is refused otherwise
    "MAX_THINKING_TOKENS": "0",
}


class ClaudeCodeHarness(NativeBinaryHarness):
    name: ClassVar[str] = "claude-code"
    version: ClassVar[str] = "2.1.332"
    dialect: ClassVar[str] = "anthropic-messages"
    min_context_tokens: ClassVar[int] = 32768  # its system prompt and tools are ~20k tokens
    package: ClassVar[str] = "@anthropic-ai/claude-code-linux-x64"
    cli: ClassVar[str] = "claude"
    min_glibc: ClassVar[str] = "2.26"  # objdump -T of the binary
    bundle_probe: ClassVar[str] = "./bin/rg --version >/dev/null && test -x ./bin/claude"
    bundle_verifier: ClassVar[str | None] = None
    events_path = EVENTS
    log_path = STDERR

    def binary(self, root: Path) -> Path:
        return root / "node_modules" / self.package / self.cli  # at the package's root, not in its bin/

    def env(self, cfg: AgentConfig) -> dict[str, str]:
        return {
            **QUIET_ENV,
            "CLAUDE_CONFIG_DIR": CONFIG_DIR,
            "ANTHROPIC_BASE_URL": cfg.base_url.rstrip("/"),
            "ANTHROPIC_MODEL": cfg.model,
            "ANTHROPIC_SMALL_FAST_MODEL": cfg.model,  # any side call goes to the same capture session
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": cfg.model,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(cfg.max_tokens),
        }

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        settings = {
            "permissions": {"deny": list(DISALLOWED)},
            "enableAllProjectMcpServers": False,
            "autoUpdates": False,
            "includeCoAuthoredBy": False,
            "env": {},
        }
        return {
            f"{CONFIG_DIR}/settings.json": (json.dumps(settings, indent=2).encode(), 0o600),
            **key_and_prompt({"ANTHROPIC_API_KEY": key, **self.env(cfg)}, prompt),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{BUNDLE_MOUNT}/bin/claude -p --output-format stream-json --verbose --dangerously-skip-permissions "
            f"--strict-mcp-config --setting-sources user --max-turns {max_turns(cfg)} "
            f"--disallowedTools {','.join(DISALLOWED)} --model {shlex.quote(cfg.model)} "
            f"< {PROMPT_FILE} > {STDOUT} 2> {STDERR}"
        )
        return (
            "unset ANTHROPIC_AUTH_TOKEN ANTHROPIC_API_KEY CLAUDE_CODE_USE_BEDROCK CLAUDE_CODE_USE_VERTEX\n"
            + LOAD_KEY
            + f"export PATH={BUNDLE_MOUNT}/bin:$PATH\n"
            + run_and_collect(run, f"{CONFIG_DIR}/projects/*/*.jsonl {STDOUT}", EVENTS)
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        order: list[str] = []  # message ids, in order
        tokens: dict[str, int | None] = {}
        calls: dict[str, list[str]] = {}
        for ev in jsonl_objects(text):
            kind = ev.get("type")
            msg = ev.get("message")
            msg = msg if isinstance(msg, dict) else {}
            content = msg.get("content")
            blocks: list = content if isinstance(content, list) else []
            if kind == "assistant" and "parentUuid" in ev:  # a transcript record (the stream-json ones have none)
                if ev.get("isApiErrorMessage") or msg.get("model") == "<synthetic>":
                    text_ = " ".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
                    errors.append(text_ or str(ev.get("error") or "model call failed"))
                    continue
                mid = str(msg.get("id") or ev.get("requestId") or ev.get("uuid"))
                if mid not in tokens:
                    order.append(mid)
                    tokens[mid], calls[mid] = None, []
                usage = msg.get("usage") or {}
                n = usage.get("output_tokens") if isinstance(usage, dict) else None
                if isinstance(n, int) and n > (tokens[mid] or 0):
                    tokens[mid] = n
                for block in blocks:
                    if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id"):
                        if str(block["id"]) not in calls[mid]:
                            calls[mid].append(str(block["id"]))
            elif kind == "result" and ev.get("is_error") and ev.get("subtype") != "error_max_turns":
                errors.append(str(ev.get("result") or ev.get("subtype") or "the run failed"))
        for mid in order:
            out.add_step(tokens[mid], tuple(calls[mid]))
        settle_errors(out, errors, NODE_UNREACHABLE)
        return out
