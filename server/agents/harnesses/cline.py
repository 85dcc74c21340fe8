"""Cline's CLI (`cline` on npm), run headless: `cline --json -P openai-compatible -m <model> "<prompt>"`, OpenAI chat.

Only the platform binary is installed (`@cline/cli-linux-x64`: one self-contained Bun executable, what the `cline`
package's optionalDependency carries; it needs neither the package's web hub nor its plugin bootstrap); its bundle
holds it and the static ripgrep (`bundle.NativeBinaryHarness`, as OpenCode's).

Configuration, all of it private to the rollout: `--data-dir` holds its `settings/providers.json` (provider `openai-
compatible`, or `openai-native` (Responses) / `anthropic` with the harness option `api`; `baseUrl` the capture's `/v1`,
the model, its context window and output limit; no key: each provider reads its own variable, `OPENAI_API_KEY` or
`ANTHROPIC_API_KEY`, sourced from the 0600 env file, never argv or a file of its own), `--config` a config directory of
ours (no `~/.cline` hooks, skills, MCP servers or plugins), and `CLINE_GLOBAL_SETTINGS_PATH` our global settings; the
image's `CLINE_*` variables are unset. Offline and hermetic (traced against a stub): its OpenTelemetry export to its own
host (which it looks up on every run) is off only with `telemetryOptOut` in the global settings; its PostHog feature
flags (another lookup, on a fresh data dir) only with `IS_TEST=true`, which in this version does nothing else (it swaps
the flags client for a no-op one and lets a test helper set flags); auto-update off; the tools a sandboxed one-shot run
cannot use, or that are model calls of their own, disabled (`disabledTools`: web fetch, questions to a user, sub-agents
and its agent-team tools). The prompt is its argument (`$(cat prompt.txt)`: its `--json` mode takes no prompt from a
redirected stdin).

Its record is its session's message file (`<data-dir>/sessions/<id>/<id>.messages.json`: each assistant message with
its `tool_use` ids and `metrics.outputTokens`), copied to a fixed path while it runs and followed by its `--json`
output, whose `error` events and `run_result` say whether the run failed.
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
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import as_list
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import key_and_prompt
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import NativeBinaryHarness

HOME = f"{AGENT_HOME}/.cline-run"
DATA = f"{HOME}/data"
SETTINGS = f"{HOME}/global-settings.json"
EVENTS = f"{AGENT_HOME}/cline-events.jsonl"
STDOUT = f"{AGENT_HOME}/cline-stream.jsonl"
STDERR = f"{AGENT_HOME}/cline-stderr.txt"
PROVIDER = "openai-compatible"
# its providers that /capture speaks (harness option `api`) -> (the capture dialect, the base URL's suffix, its key's
# variable). Its `gemini` provider sends no tools for a model its catalog does not know (measured: one call, no
# tools, nothing done): not offered
APIS = {
    "openai-compatible": ("openai-chat", "/v1", "OPENAI_API_KEY"),
    "openai-native": ("openai-responses", "/v1", "OPENAI_API_KEY"),
    "anthropic": ("anthropic-messages", "/v1", "ANTHROPIC_API_KEY"),
}
TEAM_TOOLS = tuple(
    f"team_{t}"
    for t in (
        "spawn_teammate shutdown_teammate status task run_task cancel_run list_runs await_runs send_message "
        "broadcast read_mailbox mission_log cleanup create_outcome attach_outcome_fragment review_outcome_fragment "
        "finalize_outcome list_outcomes"
    ).split()
)
DISABLED = ("fetch_web_content", "ask_question", "spawn_agent", *TEAM_TOOLS)


class ClineHarness(NativeBinaryHarness):
    name: ClassVar[str] = "cline"
    version: ClassVar[str] = "3.0.65"
    package: ClassVar[str] = "@cline/cli-linux-x64"
    cli: ClassVar[str] = "cline"
    # its first prompt measured 2.9k tokens on the demo task (system prompt + the tools it keeps); the rest is room for
    # its compaction, which keeps a summary and its output limit below the window
    min_context_tokens: ClassVar[int] = 16384
    events_path = EVENTS
    log_path = STDERR

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        api = cfg.options.get("api", PROVIDER)
        settings = {
            "provider": api,
            "model": cfg.model,
            "baseUrl": f"{cfg.base_url.rstrip('/')}{APIS[api][1]}",
            "contextWindow": int(cfg.context_window),  # else its catalog's default for an unknown model
            "maxTokens": int(cfg.max_tokens),
        }
        # `updatedAt` present, or it rewrites the entry from its defaults (dropping baseUrl)
        entry = {"settings": settings, "updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"}
        providers = {"version": 1, "lastUsedProvider": api, "modes": {}, "providers": {api: entry}}
        globals_ = {"telemetryOptOut": True, "autoUpdateEnabled": False, "disabledTools": list(DISABLED)}
        return {
            f"{DATA}/settings/providers.json": (json.dumps(providers, indent=2).encode(), 0o600),
            SETTINGS: (json.dumps(globals_, indent=2).encode(), 0o600),
            f"{HOME}/config/.keep": (b"", 0o600),
            **key_and_prompt({APIS[api][2]: key}, prompt),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{BUNDLE_MOUNT}/bin/cline --json -P {cfg.options.get('api', PROVIDER)} -m {shlex.quote(cfg.model)} "
            f"--data-dir {DATA} "
            f'--config {HOME}/config --hooks-dir {HOME}/config/hooks "$(cat {PROMPT_FILE})" '
            f"< /dev/null > {STDOUT} 2> {STDERR}"
        )
        return (
            "for v in $(env | sed -n 's/^\\(CLINE_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done\n"
            + LOAD_KEY
            + f"export PATH={BUNDLE_MOUNT}/bin:$PATH CLINE_GLOBAL_SETTINGS_PATH={SETTINGS} IS_TEST=true\n"
            + run_and_collect(run, f"{DATA}/sessions/*/*.messages.json {STDOUT}", EVENTS)
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        try:  # the session's message file, then the --json output (JSONL)
            doc, end = json.JSONDecoder().raw_decode(text.lstrip())
        except ValueError:
            doc, end = {}, 0
        for msg in as_list(as_dict(doc).get("messages")):
            if not isinstance(msg, dict) or msg.get("role") != "assistant":
                continue
            content = as_list(msg.get("content"))
            ids = tuple(str(c.get("id")) for c in content if isinstance(c, dict) and c.get("type") == "tool_use")
            n = as_dict(msg.get("metrics")).get("outputTokens")
            out.add_step(n if isinstance(n, int) else None, ids)
        for ev in jsonl_objects(text.lstrip()[end:] if end else text):
            if ev.get("type") == "error":
                errors.append(str(ev.get("message") or "error"))
        settle_errors(out, errors, NODE_UNREACHABLE, "error(s) in the agent")
        return out
