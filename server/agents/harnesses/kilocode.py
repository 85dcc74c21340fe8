"""Kilo Code (`@kilocode/cli`), run headless: `kilo run --format json --auto`, prompt on stdin, JSONL out.

Kilo Code's CLI is an OpenCode fork: the same provider config (its own file, `$XDG_CONFIG_HOME/kilo/kilo.json`), the
same `run` events (`step_start … step_finish` per model call, with its token counts; `error` events), the same
`<PREFIX>_DISABLE_*` switches with its own prefix. So it is OpenCode's harness (harnesses/opencode.py) with its
names: only the platform package is installed (`@kilocode/cli-linux-x64`, pinned at a version npm serves: 7.8.1's is
not served), and its bundle holds that Bun binary and the static ripgrep, as OpenCode's does — not the package's web
console, tree-sitter grammars (codebase indexing only, switched off) or its own bwrap sandbox.

Offline and hermetic, beyond OpenCode's switches: its built-in `kilo` gateway provider (which fetches a model list)
and every other provider are off (`enabled_providers` names only ours); telemetry off (`KILO_TELEMETRY_LEVEL=off`);
no codebase indexing, session ingest, presence, Claude Code compatibility (`~/.claude`, a repo's `.claude/`) or
external skills. `--auto` approves its tool calls (there is no one to ask). No plugin install happens at start, so
none is pre-seeded. Its provider's AI SDK package is the harness option `api` (opencode.APIS):
`@ai-sdk/openai-compatible` (chat, the default), `@ai-sdk/openai` (Responses) or `@ai-sdk/anthropic`, all built
into its binary.
"""

from __future__ import annotations

from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.harnesses.opencode import PROVIDER
from swe_gym_env.server.agents.harnesses.opencode import OpenCodeHarness


class KiloCodeHarness(OpenCodeHarness):
    name: ClassVar[str] = "kilocode"
    version: ClassVar[str] = "7.7.7"
    package: ClassVar[str] = "@kilocode/cli-linux-x64"
    # its first prompt measured 12.5k tokens on the demo task (system prompt + its tools; OpenCode: ~7.9k): room to act
    min_context_tokens: ClassVar[int] = 16384
    cli: ClassVar[str] = "kilo"
    env_prefix: ClassVar[str] = "KILO"
    home: ClassVar[str] = f"{AGENT_HOME}/.kilo-run"
    schema: ClassVar[str] = "https://kilo.ai/config.json"
    plugin: ClassVar[str | None] = None
    run_flags: ClassVar[str] = "--auto --title task"
    extra_switches: ClassVar[tuple[str, ...]] = (
        "DISABLE_CODEBASE_INDEXING",
        "DISABLE_SESSION_INGEST",
        "DISABLE_PRESENCE",
        "DISABLE_CLAUDE_CODE",
        "DISABLE_EXTERNAL_SKILLS",
    )
    extra_env: ClassVar[dict[str, str]] = {"KILO_TELEMETRY_LEVEL": "off"}
    events_path = f"{AGENT_HOME}/kilo-events.jsonl"
    log_path = f"{AGENT_HOME}/kilo-stderr.txt"

    def config(self, cfg: AgentConfig) -> dict:
        return {**super().config(cfg), "enabled_providers": [PROVIDER]}
