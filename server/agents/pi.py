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

from swe_gym_env.server.agents.base import (
    AGENT_HOME,
    BUNDLE_MOUNT,
    AgentConfig,
    AgentOutcome,
    NpmArtifact,
    jsonl_objects,
    npm_install,
)
from swe_gym_env.server.agents.bundle import NODE, BundledHarness
from swe_gym_env.server.agents.pi_apis import DEFAULT_API, PI_APIS, capture_tool_call_id, pi_provider

PROVIDER = "capture"  # never "openai": Pi would switch to the Responses API
KEY_ENV = "SWE_GYM_CAPTURE_KEY"
EVENTS = f"{AGENT_HOME}/pi-events.jsonl"
CLI = "pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"  # in the bundle


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
        settings = {"enableInstallTelemetry": False, "quietStartup": True, "compaction": {"enabled": False}}
        agent_dir = f"{AGENT_HOME}/.pi/agent"
        return {
            f"{agent_dir}/models.json": (json.dumps(models, indent=2).encode(), 0o600),
            f"{agent_dir}/settings.json": (json.dumps(settings).encode(), 0o600),
            f"{AGENT_HOME}/.capture.env": (f"{KEY_ENV}={shlex.quote(key)}\n".encode(), 0o600),
            f"{AGENT_HOME}/prompt.txt": (prompt.encode(), 0o600),
        }

    def command(self, cfg: AgentConfig) -> str:
        return (
            f"set -a; . {AGENT_HOME}/.capture.env; set +a\n"
            f"export PI_OFFLINE=1 PI_CODING_AGENT_DIR={AGENT_HOME}/.pi/agent XDG_CONFIG_HOME={AGENT_HOME}/.config "
            f"XDG_CACHE_HOME={AGENT_HOME}/.cache XDG_DATA_HOME={AGENT_HOME}/.local/share "
            f"XDG_STATE_HOME={AGENT_HOME}/.local/state\n"
            f"{BUNDLE_MOUNT}/node/bin/node {BUNDLE_MOUNT}/{CLI} -p --mode json "
            f"--no-session --model {shlex.quote(PROVIDER + '/' + cfg.model)} "
            f"< {AGENT_HOME}/prompt.txt > {EVENTS} 2> {AGENT_HOME}/pi-stderr.txt"
        )

    events_path = EVENTS
    log_path = f"{AGENT_HOME}/pi-stderr.txt"

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        for ev in jsonl_objects(text):
            if ev.get("type") != "message_end":
                continue
            msg = ev.get("message") or {}
            if msg.get("role") != "assistant":
                continue
            if msg.get("stopReason") == "error":
                errors.append(str(msg.get("errorMessage") or "model call failed"))
                continue
            usage = msg.get("usage") or {}
            parts = msg.get("content")
            parts = parts if isinstance(parts, list) else []
            ids = [p.get("id") for p in parts if isinstance(p, dict) and p.get("type") == "toolCall"]
            calls = tuple(capture_tool_call_id(str(i)) for i in ids)  # Responses ids are "<call_id>|<item id>"
            # 0 output tokens: Pi never saw usage (its Responses client ignores `response.incomplete`, the event the
            # API ends a reply cut at max_output_tokens with): not reported, rather than a count that disagrees
            n = usage.get("output")
            out.add_step(n if isinstance(n, int) and n > 0 else None, calls)
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
