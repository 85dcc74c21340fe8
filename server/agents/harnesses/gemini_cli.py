"""Gemini CLI (`@google/gemini-cli`), run headless: `gemini -p … --output-format stream-json --yolo`, prompt on
stdin, Gemini dialect (`:streamGenerateContent?alt=sse`).

Installed with `--omit=optional`: the package ships one self-contained JS bundle; its optional native modules
(`node-pty` for interactive shells, `keytar` for a keychain) are neither built nor used — the shell tool runs
commands through plain child processes (`tools.shell.enableInteractiveShell: false`), and no C++ compiler is needed.
It runs on its bundle's own Node, like Pi.

Configuration (NOTES §3): `GOOGLE_GEMINI_BASE_URL` is the capture root, `security.auth.selectedType:
"gemini-api-key"` and `GEMINI_API_KEY` from an env file (sent as `x-goog-api-key`), never argv; `-m` the model (no
router call). Our settings are the *system* settings file (`GEMINI_CLI_SYSTEM_SETTINGS_PATH`), which overrides user
and workspace settings key by key; a repo's `.gemini/.env` is ignored (`advanced.ignoreLocalEnv`), its MCP servers
never start (`--allowed-mcp-server-names` names none of them, `mcp.allowed` too), its hooks never run
(`hooksConfig.enabled: false`), nor its tool discovery / call / MCP server commands (set empty); folder trust is off
(so `--yolo` is not downgraded); no telemetry, usage statistics, update check or IDE; web tools excluded;
`model.maxSessionTurns` from the harness option `max_turns`.

The agent's record is its session transcript (`$GEMINI_CLI_HOME/.gemini/tmp/<project>/chats/session-*.jsonl`),
copied to a fixed path while it runs, followed by the `stream-json` output (its `error` and `result` events).
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
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import key_and_prompt
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import npm_install
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import NODE
from swe_gym_env.server.agents.bundle import BundledHarness

CLI_HOME = f"{AGENT_HOME}/.gemini-home"
SYSTEM_SETTINGS = f"{AGENT_HOME}/.gemini-system-settings.json"
EVENTS = f"{AGENT_HOME}/gemini-events.jsonl"
STDOUT = f"{AGENT_HOME}/gemini-stream.jsonl"
STDERR = f"{AGENT_HOME}/gemini-stderr.txt"
NO_MCP = "swe-gym-no-mcp-server"  # the only MCP server name allowed: none has it


def _call_id(call: dict) -> str:
    """The capture's tool-call id: gemini-cli records a call as `<tool name>__<functionCall id>`."""
    cid, name = str(call.get("id")), str(call.get("name") or "")
    return cid.removeprefix(f"{name}__") if name else cid


class GeminiCliHarness(BundledHarness):
    """gemini-cli, and the base of its forks (Qwen Code: harnesses/qwen_code.py): installed the same way, run on the
    bundle's Node with settings of ours and a key from an env file, its transcript copied to a fixed path while it
    runs. A fork names its entry file, settings, environment, flags and transcript; it parses its own record."""

    name: ClassVar[str] = "gemini-cli"
    version: ClassVar[str] = "0.61.0"
    dialect: ClassVar[str] = "gemini"
    min_context_tokens: ClassVar[int] = 16384
    package: ClassVar[str] = "@google/gemini-cli"
    needs_node: ClassVar[bool] = True
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (NODE,)
    min_glibc: ClassVar[str] = "2.28"  # Node 22's official binary
    bundle_probe: ClassVar[str] = "./node/bin/node --version"
    bundle_verifier: ClassVar[str | None] = "./node/bin/node"
    entry: ClassVar[str] = "bundle/gemini.js"  # the CLI's entry file in its package
    bundle_dir: ClassVar[str] = "gemini"  # its node_modules in the bundle: <bundle_dir>/node_modules
    cli_home: ClassVar[str] = CLI_HOME  # its home (settings, transcripts) for this run
    system_settings: ClassVar[str] = SYSTEM_SETTINGS
    stdout_path: ClassVar[str] = STDOUT
    # the variables of the image's environment that would pick another endpoint, key or model: unset
    unset: ClassVar[tuple[str, ...]] = (
        "GOOGLE_API_KEY",
        "GOOGLE_GENAI_USE_VERTEXAI",
        "GOOGLE_CLOUD_PROJECT",
        "GEMINI_MODEL",
    )
    events_path = EVENTS
    log_path = STDERR

    def cli_js(self, root: Path) -> Path:
        return root / "node_modules" / self.package / self.entry

    def ensure_installed(self, log=print) -> Path:
        root = self.install_dir()
        if not self.cli_js(root).is_file():
            npm_install(root, f"{self.package}@{self.version}", self.cli_js(root), ("--omit=optional",), log)
        return root

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {
            "node/bin/node": artifacts[NODE.package],
            f"{self.bundle_dir}/node_modules": self.install_dir() / "node_modules",
        }

    def settings(self, cfg: AgentConfig) -> dict:
        return {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False, "logPrompts": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "ide": {"enabled": False},
            "advanced": {"ignoreLocalEnv": True},
            "model": {"name": cfg.model, "maxSessionTurns": max_turns(cfg)},
            # a trusted workspace's own settings load under these: every key that would run a command is set here
            "tools": {
                "exclude": ["web_fetch", "google_web_search"],
                "shell": {"enableInteractiveShell": False},
                "discoveryCommand": "",
                "callCommand": "",
            },
            "hooksConfig": {"enabled": False},
            "mcp": {"allowed": [NO_MCP], "serverCommand": ""},
            "mcpServers": {},
            "experimental": {"extensionManagement": False},
        }

    def env(self, cfg: AgentConfig, key: str) -> dict[str, str]:
        """The agent's environment beyond the image's: endpoint, key, where its settings and home are."""
        return {
            "GEMINI_API_KEY": key,
            "GOOGLE_GEMINI_BASE_URL": cfg.base_url.rstrip("/"),
            "GEMINI_CLI_HOME": CLI_HOME,
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH": SYSTEM_SETTINGS,
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }

    def user_settings_path(self) -> str:
        return f"{self.cli_home}/.gemini/settings.json"

    def paths(self, cfg: AgentConfig) -> dict[str, str]:
        """The variables of ``env`` that name a path in the sandbox: exported by the command itself, where a sandbox
        that maps paths (landlock: /home/agent is elsewhere on the host) maps them; the env file holds the rest."""
        return {k: v for k, v in self.env(cfg, "").items() if v.startswith(f"{AGENT_HOME}/")}

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        paths = self.paths(cfg)
        env = {k: v for k, v in self.env(cfg, key).items() if k not in paths}
        settings = json.dumps(self.settings(cfg), indent=2).encode()
        return {
            self.system_settings: (settings, 0o600),
            self.user_settings_path(): (settings, 0o600),
            **key_and_prompt(env, prompt),
        }

    def run_args(self, cfg: AgentConfig) -> str:
        return f"--output-format stream-json --yolo --allowed-mcp-server-names {NO_MCP} -m {shlex.quote(cfg.model)}"

    def transcripts(self) -> str:
        """Its session transcript(s), as a shell glob."""
        return f"{self.cli_home}/.gemini/tmp/*/chats/session-*.jsonl"

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{BUNDLE_MOUNT}/node/bin/node {BUNDLE_MOUNT}/{self.bundle_dir}/node_modules/{self.package}/{self.entry} "
            f"{self.run_args(cfg)} < {PROMPT_FILE} > {self.stdout_path} 2> {self.log_path}"
        )
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.paths(cfg).items())
        setup = f"unset {' '.join(self.unset)}\n{LOAD_KEY}export {exports}\n"
        return setup + run_and_collect(run, f"{self.transcripts()} {self.stdout_path}", self.events_path)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        replies: dict[str, tuple[int | None, tuple[str, ...]]] = {}  # by record id: a record is rewritten as it grows
        for ev in jsonl_objects(text):
            kind = ev.get("type")
            if kind == "gemini" and ev.get("id"):  # a transcript record: one model reply
                tokens = ev.get("tokens") or {}
                n = tokens.get("output") if isinstance(tokens, dict) else None
                raw = ev.get("toolCalls")
                calls: list = raw if isinstance(raw, list) else []
                ids = tuple(_call_id(c) for c in calls if isinstance(c, dict) and c.get("id"))
                replies[str(ev["id"])] = (n if isinstance(n, int) else None, ids)
            elif kind == "error" and "severity" in ev:  # the stream-json output
                errors.append(str(ev.get("message") or "error"))
            elif kind == "result" and ev.get("status") == "error":
                err = ev.get("error")
                errors.append(str(err.get("message") if isinstance(err, dict) else err or "the run failed"))
        for n, ids in replies.values():
            out.add_step(n, ids)
        settle_errors(out, errors, NODE_UNREACHABLE)
        return out
