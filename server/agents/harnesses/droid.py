"""Factory's Droid (`droid` on npm), run headless: `droid exec --skip-permissions-unsafe -o stream-json -m
custom:capture-0 -f <prompt file>`, OpenAI chat (its `generic-chat-completion-api` provider).

Only the platform binary is installed (`@factory/cli-linux-x64`: one self-contained Bun executable, what the `droid`
package's optionalDependency carries); its bundle holds it and the static ripgrep (`FACTORY_RIPGREP_PATH`), as
OpenCode's and Cline's (`bundle.NativeBinaryHarness`).

Configuration, all of it private to the rollout: `FACTORY_HOME_OVERRIDE` moves its `~/.factory` (settings, sessions,
logs, caches) under the agent's home, and our settings file is its *org-managed* settings
(`FACTORY_ORG_MANAGED_SETTINGS_LOCAL_PATH`), the level above a repository's `.factory/settings.json` and the user's:
one custom model (provider `generic-chat-completion-api`, or `openai` (Responses) / `anthropic` with the harness option
`api`; `baseUrl` the capture's, `maxContextLimit` the engine's window, the key as `${SWE_GYM_CAPTURE_KEY}`, which it
expands from its environment: the 0600 env file, never argv or a file), and a model policy that allows custom models at
that base URL only, so a repository's own `.factory/settings.json` naming another endpoint (read, measured: it replaces
the user's model of the same name) is refused; hooks only from managed settings; no cloud session sync. The image's
`FACTORY_*` / `DROID_*` variables are unset.

Offline and hermetic (traced against a stub): without it, every run looks up `api.factory.ai` (16 DNS queries from
its feature flags, settings, telemetry and update checks, with or without a key); its Airgap Mode
(`FACTORY_AIRGAP_ENABLED=1`) skips each of them (feature flags at their defaults, no org-settings fetch, no OTel or
Sentry, no auto-update, no git-ai download) and leaves no connection or lookup but the model endpoint. It also adds one
paragraph to its system prompt saying the machine is offline (true in a sandbox). Its tools are limited to the file
and shell ones (`--only-tools`: no sub-agent `Task`, skills, missions, tool search, web fetch/search), built-in skills
off.

Its record is its session file (`<home>/.factory/sessions/<cwd>/<id>.jsonl`: one assistant `message` per model reply,
with its `tool_use` ids; no per-call token counts), copied to a fixed path while it runs and followed by its
`stream-json` output, whose `error` events and `completion` say whether the run failed.
"""

from __future__ import annotations

import json
from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import LOAD_KEY
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

HOME = f"{AGENT_HOME}/.droid-home"
ORG_SETTINGS = f"{AGENT_HOME}/.droid-org-settings.json"
EVENTS = f"{AGENT_HOME}/droid-events.jsonl"
STDOUT = f"{AGENT_HOME}/droid-stream.jsonl"
STDERR = f"{AGENT_HOME}/droid-stderr.txt"
MODEL_ID = "custom:capture-0"  # its id for the first custom model named "capture": custom:<displayName>-<index>
PROVIDER = "generic-chat-completion-api"
# its custom-model providers that /capture speaks (harness option `api`) -> (the capture dialect, the base URL's suffix)
APIS = {
    "generic-chat-completion-api": ("openai-chat", "/v1"),
    "openai": ("openai-responses", "/v1"),
    "anthropic": ("anthropic-messages", ""),
}
TOOLS = ("Read", "LS", "Execute", "Edit", "Grep", "Glob", "Create")
COMPACT_FRACTION = 0.8
UNREACHABLE = ("connection error", "unable to connect", "econnrefused", "fetch failed", "timed out", "timeout")


def compaction_limit(cfg: AgentConfig) -> int:
    """The prompt + completion tokens after which Droid compacts its context before its next call."""
    return int(COMPACT_FRACTION * cfg.context_window) - int(cfg.max_tokens)


class DroidHarness(NativeBinaryHarness):
    name: ClassVar[str] = "droid"
    version: ClassVar[str] = "0.215.0"
    package: ClassVar[str] = "@factory/cli-linux-x64"
    cli: ClassVar[str] = "droid"
    min_context_tokens: ClassVar[int] = 16384
    bundle_probe: ClassVar[str] = "./bin/droid --version && ./bin/rg --version >/dev/null"
    events_path = EVENTS
    log_path = STDERR

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        api = cfg.options.get("api", PROVIDER)
        base = f"{cfg.base_url.rstrip('/')}{APIS[api][1]}"
        model = {
            "model": cfg.model,
            "displayName": "capture",
            "baseUrl": base,
            "apiKey": "${SWE_GYM_CAPTURE_KEY}",  # expanded from its environment
            "provider": api,
            "maxContextLimit": int(cfg.context_window),
            "maxOutputTokens": int(cfg.max_tokens),
            "noImageSupport": True,
        }
        org = {
            "customModels": [model],
            "modelPolicy": {"allowCustomModels": True, "allowedBaseUrls": [base]},
            "allowManagedHooksOnly": True,
            "cloudSessionSync": False,
        }
        # it compacts once a call's prompt + completion passes `compactionTokenLimit` (250,000 for a custom model,
        # whatever its maxContextLimit): here 0.8 of the window less the output limit, so the next prompt still fits
        settings = {"cloudSessionSync": False, "compactionTokenLimit": compaction_limit(cfg)}
        return {
            ORG_SETTINGS: (json.dumps(org, indent=2).encode(), 0o600),
            f"{HOME}/.factory/settings.json": (json.dumps(settings).encode(), 0o600),
            **key_and_prompt({"SWE_GYM_CAPTURE_KEY": key}, prompt),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{BUNDLE_MOUNT}/bin/droid exec --skip-permissions-unsafe --disable-builtin-skills "
            f"--only-tools {','.join(TOOLS)} -o stream-json -m {MODEL_ID} -f {PROMPT_FILE} "
            f"< /dev/null > {STDOUT} 2> {STDERR}"
        )
        return (
            "for v in $(env | sed -n 's/^\\(\\(FACTORY\\|DROID\\)_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done\n"
            + LOAD_KEY
            + f"export PATH={BUNDLE_MOUNT}/bin:$PATH FACTORY_HOME_OVERRIDE={HOME} "
            f"FACTORY_ORG_MANAGED_SETTINGS_LOCAL_PATH={ORG_SETTINGS} FACTORY_AIRGAP_ENABLED=1 "
            f"FACTORY_RIPGREP_PATH={BUNDLE_MOUNT}/bin/rg\n"
            + run_and_collect(run, f"{HOME}/.factory/sessions/*/*.jsonl {STDOUT}", EVENTS)
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        failed: list[str] = []  # "Exec failed": said after the error that made it fail
        for ev in jsonl_objects(text):
            msg = as_dict(ev.get("message"))
            if ev.get("type") == "message" and msg.get("role") == "assistant":  # the session file's record of a reply
                content = as_list(msg.get("content"))
                ids = tuple(str(c.get("id")) for c in content if isinstance(c, dict) and c.get("type") == "tool_use")
                out.add_step(None, ids)
            elif ev.get("type") == "compaction_state" and ev.get("summaryKind") == "llm_summary":
                out.add_step(None)  # its summary call: recorded as the summary it kept
            elif ev.get("type") == "error":  # its stream-json output: the agent loop's error, then the CLI's summary
                (failed if ev.get("source") == "cli" else errors).append(str(ev.get("message") or "error"))
        settle_errors(out, errors or failed, UNREACHABLE, "error(s) in the agent")
        return out
