"""Qwen Code (`@qwen-code/qwen-code`), run headless: `qwen --yolo -o stream-json --auth-type openai`, prompt on stdin,
OpenAI chat (`/capture/v1/chat/completions`).

A gemini-cli fork, so gemini-cli's harness (server/agents/harnesses/gemini_cli.py) with its names: installed with
`--omit=optional` (its optional native modules — a pty, a clipboard, audio capture, sharp — are neither built nor
used), run on the bundle's Node 22 (it needs >= 22), our settings as the system settings
(`QWEN_CODE_SYSTEM_SETTINGS_PATH`, over user and workspace settings key by key) and the user settings of a private
`QWEN_HOME`; endpoint, key and model from an env file (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`), never
argv — set, so a repo's `.env` (applied only to unset variables) cannot change them. The bundle also carries the
static ripgrep on PATH (the package's own copy is not executable as npm unpacks it).

Offline and hermetic (each found by tracing a run against a stub): no usage statistics or telemetry, no update
check, no sleep inhibitor (`general.preventSystemSleep`: it spawns `systemd-inhibit`, which calls D-Bus), no
managed auto-memory / auto-dream / auto-skill (each a second, sub-agent model call after the run), no next-speaker
check or LLM loop detection (helper model calls), no session recap; web fetch and web search off; no MCP server, hook,
tool discovery or IDE. `model.maxSessionTurns` is the harness option `max_turns`.

Its record is its chat transcript (`$QWEN_HOME/projects/<cwd>/chats/<session>.jsonl`): one `assistant` record per
model reply, with its `functionCall` ids and `usageMetadata.candidatesTokenCount`; copied to a fixed path while it
runs, followed by the `stream-json` output, whose `result` event says whether the run failed.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import NODE_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import as_list
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import NODE
from swe_gym_env.server.agents.bundle import RIPGREP
from swe_gym_env.server.agents.harnesses.gemini_cli import NO_MCP
from swe_gym_env.server.agents.harnesses.gemini_cli import GeminiCliHarness

QWEN_HOME = f"{AGENT_HOME}/.qwen-home"
# its auth types that /capture speaks (harness option `api`) -> the capture dialect each is recorded in
APIS = {
    "openai": "openai-chat",
    "openai-responses": "openai-responses",
    "anthropic": "anthropic-messages",
    "gemini": "gemini",
}
DEFAULT_API = "openai"
# tools a one-shot run in a sandbox has no use for, each a way out of it or a model call of its own: the web, sub-agents
# and messages between them, background cron / monitor / loop jobs, worktrees, goals, artifacts, deferred (MCP) tools
EXCLUDED = (
    *("web_fetch", "web_search", "agent", "list_agents", "send_message", "task_stop", "monitor", "loop_wakeup"),
    *("cron_create", "cron_list", "cron_delete", "enter_worktree", "exit_worktree", "get_goal", "update_goal"),
    *("record_artifact", "report_findings", "tool_search", "tool_call", "read_mcp_resource"),
)


# Qwen Code compacts its context once its estimate of the prompt passes `auto` of the window W it is told: 0.85 W, or
# W - 33,000 (a 20,000-token summary reserve and a 13,000-token buffer) where that is positive and smaller. So a window
# a little over 33k compacts at once (40k: at ~8k tokens, under its own first prompt); told 32,768 there, it compacts
# at ~27.9k — never later than it would at W. Told W itself only where W - 33,000 reaches that.
COMPACT_FRACTION, COMPACT_RESERVE, SAFE_WINDOW = 0.85, 33_000, 32_768


def told_window(context: int) -> int:
    """The context window Qwen Code is told for an engine of ``context`` tokens: never more than the engine has."""
    best_below = COMPACT_FRACTION * SAFE_WINDOW
    return context if context <= SAFE_WINDOW or context - COMPACT_RESERVE >= best_below else SAFE_WINDOW


class QwenCodeHarness(GeminiCliHarness):
    name: ClassVar[str] = "qwen-code"
    version: ClassVar[str] = "0.24.4"
    dialect: ClassVar[str] = "openai-chat"
    # its first prompt measured 12.9k tokens on the demo task (system prompt + the tools it keeps); it compacts at 0.85
    # of the window (above): 20,480 leaves ~4.5k to act before it does
    min_context_tokens: ClassVar[int] = 20480
    package: ClassVar[str] = "@qwen-code/qwen-code"
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (NODE, RIPGREP)
    bundle_probe: ClassVar[str] = "./node/bin/node --version && ./bin/rg --version >/dev/null"
    entry: ClassVar[str] = "cli.js"
    bundle_dir: ClassVar[str] = "qwen"
    cli_home: ClassVar[str] = QWEN_HOME
    system_settings: ClassVar[str] = f"{AGENT_HOME}/.qwen-system-settings.json"
    stdout_path: ClassVar[str] = f"{AGENT_HOME}/qwen-stream.jsonl"
    unset: ClassVar[tuple[str, ...]] = (
        *("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "QWEN_MODEL", "QWEN_DEFAULT_AUTH_TYPE", "QWEN_SANDBOX"),
        *("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "GEMINI_API_KEY", "GEMINI_MODEL"),
        *("GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_GENAI_USE_VERTEXAI", "QWEN_TELEMETRY_TARGET"),
    )
    events_path = f"{AGENT_HOME}/qwen-events.jsonl"
    log_path = f"{AGENT_HOME}/qwen-stderr.txt"

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {**super().bundle_contents(artifacts), "bin/rg": artifacts[RIPGREP.package]}

    def settings(self, cfg: AgentConfig) -> dict:
        return {
            "security": {
                "auth": {"selectedType": cfg.options.get("api", DEFAULT_API)},
                "folderTrust": {"enabled": False},
            },
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False, "logPrompts": False},
            "general": {"enableAutoUpdate": False, "preventSystemSleep": False, "showSessionRecap": False},
            "ide": {"enabled": False},
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False},
            "model": {
                "name": cfg.model,
                "maxSessionTurns": max_turns(cfg),
                "skipNextSpeakerCheck": True,
                "skipLoopDetection": True,
                "generationConfig": {"contextWindowSize": told_window(cfg.context_window)},
            },
            # a workspace's own settings load under these: every key that would run a command is set here
            "tools": {
                "exclude": list(EXCLUDED),
                "webSearch": {"enabled": False},
                "shell": {"enableInteractiveShell": False},
                "discoveryCommand": "",
                "callCommand": "",
                "useBuiltinRipgrep": False,
            },
            "disableAllHooks": True,
            "hooks": {},
            "mcp": {"allowed": [NO_MCP], "serverCommand": ""},
            "mcpServers": {},
        }

    def env(self, cfg: AgentConfig, key: str) -> dict[str, str]:
        api = cfg.options.get("api", DEFAULT_API)
        root = cfg.base_url.rstrip("/")
        endpoint = {  # each auth type reads its own variables; each SDK appends its own path
            "openai": {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{root}/v1", "OPENAI_MODEL": cfg.model},
            "openai-responses": {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{root}/v1", "OPENAI_MODEL": cfg.model},
            "anthropic": {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": root, "ANTHROPIC_MODEL": cfg.model},
            "gemini": {"GEMINI_API_KEY": key, "GOOGLE_GEMINI_BASE_URL": root, "GEMINI_MODEL": cfg.model},
        }[api]
        return {
            **endpoint,
            "QWEN_HOME": QWEN_HOME,
            "QWEN_CODE_SYSTEM_SETTINGS_PATH": self.system_settings,
            "QWEN_CODE_NO_RELAUNCH": "true",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }

    def user_settings_path(self) -> str:
        return f"{QWEN_HOME}/settings.json"

    def run_args(self, cfg: AgentConfig) -> str:
        api = cfg.options.get("api", DEFAULT_API)
        return f"--yolo -o stream-json --auth-type {api} -m {shlex.quote(cfg.model)}"

    def transcripts(self) -> str:
        return f"{QWEN_HOME}/projects/*/chats/*.jsonl"

    def command(self, cfg: AgentConfig) -> str:
        return f"export PATH={BUNDLE_MOUNT}/bin:$PATH\n" + super().command(cfg)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        replies: dict[str, tuple[int | None, tuple[str, ...]]] = {}  # by record uuid (copied more than once)
        for ev in jsonl_objects(text):
            kind = ev.get("type")
            if kind == "assistant" and ev.get("sessionId") and isinstance(ev.get("usageMetadata"), dict):
                parts = as_list(as_dict(ev.get("message")).get("parts"))
                calls = [
                    p["functionCall"] for p in parts if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
                ]
                n = ev["usageMetadata"].get("candidatesTokenCount")
                replies[str(ev.get("uuid"))] = (
                    n if isinstance(n, int) else None,
                    tuple(str(c.get("id")) for c in calls),
                )
            elif kind == "result" and ev.get("is_error"):  # the stream-json output
                err = ev.get("error")
                errors.append(str(err.get("message") if isinstance(err, dict) else err or ev.get("result") or "error"))
        for n, ids in replies.values():
            out.add_step(n, ids)
        settle_errors(out, errors, NODE_UNREACHABLE)
        return out
