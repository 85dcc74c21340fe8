"""Pi (`@mariozechner/pi-coding-agent`), run headless: `pi -p --mode json`, prompt on stdin, JSONL events out.

Pi exits 0 even when every model call failed; the failure is only in its events (`stopReason: "error"`), so the
outcome is read from the events, not the exit code.

It runs on its bundle's own Node (`/opt/swe-gym-agent/node/bin/node`), never a `node` from the image: task images
(SWE-Gym, SWE-bench) have none, and the agent's shell commands keep the image's PATH untouched.
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
from swe_gym_env.server.agents.bundle import NODE
from swe_gym_env.server.agents.bundle import BundledHarness
from swe_gym_env.server.agents.harnesses.pi_apis import DEFAULT_API
from swe_gym_env.server.agents.harnesses.pi_apis import PI_APIS
from swe_gym_env.server.agents.harnesses.pi_apis import capture_tool_call_id
from swe_gym_env.server.agents.harnesses.pi_apis import pi_provider

PROVIDER = "capture"  # never "openai": Pi would switch to the Responses API
KEY_ENV = "SWE_GYM_CAPTURE_KEY"
EVENTS = f"{AGENT_HOME}/pi-events.jsonl"
STDERR = f"{AGENT_HOME}/pi-stderr.txt"
TRACE = f"{AGENT_HOME}/pi-trace.jsonl"  # the agent's record with compaction on (SETTLE): replaces the events
CLI = "pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"  # in the bundle


def compaction(cfg: AgentConfig) -> dict:
    """Pi's `compaction` setting from the harness option `compaction` (`off` by default).

    `off`: a rollout that fills the engine's context fails there (the engine refuses the call). `on`: Pi compacts,
    with its defaults (reserveTokens 16384, keepRecentTokens 20000) scaled down to a quarter of the context each,
    so they fit small contexts. Headless (`-p`), Pi compacts mid-run only when the engine refuses a call for its
    context length: it summarises the older part of the conversation in a call of its own (a different system
    prompt: an `aux` root), then retries with the summary in place of that part (a new root of the agent's family).
    Its threshold check runs only after its last reply, where a compaction changes nothing the rollout keeps."""
    if cfg.options.get("compaction", "off") != "on":
        return {"enabled": False}
    quarter = max(1, cfg.context_window // 4)
    return {"enabled": True, "reserveTokens": min(16384, quarter), "keepRecentTokens": min(20000, quarter)}


# An extension, loaded only with compaction on. Headless, Pi compacts mid-run only after the engine refused a call
# for its context length, and it does so *after* its print mode has taken the refusal as the end of the run: the
# summary call and the retry run on while print mode no longer listens (pi 0.73.1: `prompt()` waits for a retry,
# not for a compaction's), so its JSON events end at the refusal. This one keeps the session open at shutdown until
# the agent has settled (not running, not compacting, for a second) and writes the agent's record (its messages and
# compactions) to TRACE, which then replaces the events. It changes no request.
SETTLE = """import { appendFileSync } from "node:fs";
const TRACE = "@TRACE@";
export default function (pi) {
  let running = false, compacting = false, changed = Date.now();
  const log = (event) => appendFileSync(TRACE, JSON.stringify(event) + "\\n");
  const on = (name, f) => pi.on(name, (event) => { changed = Date.now(); f(event); });
  on("agent_start", () => { running = true; log({ type: "agent_start" }); });
  on("agent_end", () => { running = false; log({ type: "agent_end" }); });
  on("session_before_compact", () => { compacting = true; log({ type: "compaction_start" }); });
  on("session_compact", (e) => {
    compacting = false;
    log({ type: "compaction_end", summary: (e.compactionEntry && e.compactionEntry.summary) || "" });
  });
  on("message_end", (e) => log({ type: "message_end", message: e.message }));
  pi.on("session_shutdown", async () => {
    while (running || compacting || Date.now() - changed < 1000) await new Promise((r) => setTimeout(r, 100));
  });
}
""".replace("@TRACE@", TRACE)
SPLIT_TURN = "**Turn Context (split turn):**"  # Pi's summary of a turn cut in two: its own call (compaction.js)
NO_HISTORY = "No prior history."  # ... with nothing before that turn: no history call


def summary_calls(summary: str) -> int:
    """Model calls one compaction made: the history's summary, the split turn's prefix, or both (in parallel)."""
    if SPLIT_TURN not in summary:
        return 1
    return 1 if summary.startswith(NO_HISTORY) else 2


class PiHarness(BundledHarness):
    name: ClassVar[str] = "pi"
    version: ClassVar[str] = "0.73.1"
    min_context_tokens: ClassVar[int] = 4096  # its first prompt is ~1.5k tokens (4 tools); room for a few steps
    package: ClassVar[str] = "@mariozechner/pi-coding-agent"
    dialect: ClassVar[str] = PI_APIS[DEFAULT_API]  # by default; harness option `api` picks another (pi_apis.py)
    needs_node: ClassVar[bool] = True
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (NODE,)
    # Node 22's official binary: GLIBC_2.28 symbols (and libstdc++ >= GCC 5, which the probe would show missing)
    min_glibc: ClassVar[str] = "2.28"
    bundle_probe: ClassVar[str] = "./node/bin/node --version"
    bundle_verifier: ClassVar[str | None] = "./node/bin/node"  # runs VERIFY_JS (sandbox/bundles.py)
    events_path = EVENTS
    log_path = STDERR

    def cli_js(self, root: Path) -> Path:
        return root / "node_modules" / "@mariozechner" / "pi-coding-agent" / "dist" / "cli.js"

    def ensure_installed(self, log=print) -> Path:
        root = self.install_dir()
        if self.cli_js(root).is_file():
            return root
        npm_install(root, f"{self.package}@{self.version}", self.cli_js(root), ("--omit=optional",), log)
        return root

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {"node/bin/node": artifacts[NODE.package], "pi/node_modules": self.install_dir() / "node_modules"}

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        api = cfg.options.get("api", DEFAULT_API)
        provider = pi_provider(api, cfg.base_url, KEY_ENV, cfg.model, cfg.context_window, cfg.max_tokens)
        models = {"providers": {PROVIDER: provider}}
        settings = {"enableInstallTelemetry": False, "quietStartup": True, "compaction": compaction(cfg)}
        agent_dir = f"{AGENT_HOME}/.pi/agent"
        files = {
            f"{agent_dir}/models.json": (json.dumps(models, indent=2).encode(), 0o600),
            f"{agent_dir}/settings.json": (json.dumps(settings).encode(), 0o600),
            **key_and_prompt({KEY_ENV: key}, prompt),
        }
        if settings["compaction"]["enabled"]:
            files[f"{agent_dir}/extensions/swe-gym-settle.js"] = (SETTLE.encode(), 0o600)
        return files

    def command(self, cfg: AgentConfig) -> str:
        return (
            LOAD_KEY
            + f"export PI_OFFLINE=1 PI_CODING_AGENT_DIR={AGENT_HOME}/.pi/agent XDG_CONFIG_HOME={AGENT_HOME}/.config "
            f"XDG_CACHE_HOME={AGENT_HOME}/.cache XDG_DATA_HOME={AGENT_HOME}/.local/share "
            f"XDG_STATE_HOME={AGENT_HOME}/.local/state\n"
            f"{BUNDLE_MOUNT}/node/bin/node {BUNDLE_MOUNT}/{CLI} -p --mode json "
            f"--no-session --model {shlex.quote(PROVIDER + '/' + cfg.model)} "
            f"< {PROMPT_FILE} > {EVENTS} 2> {STDERR}"
            + (f"; rc=$?; [ -s {TRACE} ] && mv -f {TRACE} {EVENTS}; exit $rc" if compaction(cfg)["enabled"] else "")
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        overflows: list[tuple[str, int]] = []  # failed calls Pi compacted after, with the steps made before each
        last_failed = False  # the last call failed (no step since)
        for ev in jsonl_objects(text):
            # mid-run, Pi compacts only after a call the engine refused for its context length (`overflow`)
            if ev.get("type") == "compaction_start" and last_failed:
                overflows.append((errors.pop(), out.model_calls))
                last_failed = False
                continue
            if ev.get("type") == "compaction_end" and isinstance(ev.get("summary"), str):
                for _ in range(summary_calls(ev["summary"])):  # its summary calls: no tool calls, tokens unreported
                    out.add_step(None)
                continue
            if ev.get("type") != "message_end":
                continue
            msg = ev.get("message") or {}
            if msg.get("role") != "assistant":
                continue
            if msg.get("stopReason") == "error":
                errors.append(str(msg.get("errorMessage") or "model call failed"))
                last_failed = True
                continue
            last_failed = False
            usage = msg.get("usage") or {}
            parts = msg.get("content")
            parts = parts if isinstance(parts, list) else []
            ids = [p.get("id") for p in parts if isinstance(p, dict) and p.get("type") == "toolCall"]
            calls = tuple(capture_tool_call_id(str(i)) for i in ids)  # Responses ids are "<call_id>|<item id>"
            # 0 output tokens: Pi never saw usage (its Responses client ignores `response.incomplete`, the event the
            # API ends a reply cut at max_output_tokens with): not reported, rather than a count that disagrees
            n = usage.get("output")
            out.add_step(n if isinstance(n, int) and n > 0 else None, calls)
        # a refusal for the context length that steps followed: Pi compacted its context and went on
        errors += [said for said, before in overflows if out.model_calls == before]
        if errors and out.model_calls == 0:
            low = errors[-1].lower()
            out.error_kind = (
                "endpoint_unreachable" if ("connect" in low or "fetch" in low or "401" in low) else ("agent_crashed")
            )
            out.error = errors[-1][:500]
        elif errors:
            out.error_kind = "agent_crashed"
            out.error = f"{len(errors)} model call(s) failed in the agent: {errors[-1][:400]}"
        return out
