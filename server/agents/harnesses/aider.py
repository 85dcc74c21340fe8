"""Aider (`aider-chat` on PyPI), run headless: `aider --message-file … --yes-always` on its bundle's own Python 3.11,
OpenAI chat through litellm (`openai/<model>`, the capture's `/v1`); Anthropic Messages with the harness option `api`
(`anthropic/<model>`, the capture's root in `ANTHROPIC_API_BASE`, the key from the env file as `ANTHROPIC_API_KEY`).

Aider is an editor, not a tool-calling loop: its requests carry no tools; its system prompt asks for the edits as
SEARCH/REPLACE blocks in the reply text (its `diff` edit format, set for our model), which it applies to the work
tree itself. A reply that names a file not yet in its chat makes it add the file and ask again (the edits of that
reply are dropped); a block that does not apply makes it send the error back (up to 3 reflections). No commits (its
edits stay in the work tree, graded like any harness's diff), no lint or test runs, no shell commands, no repo map.

Bundle: the host's CPython 3.11 made relocatable (`pyagent.HostPythonAgent`, as mini-swe-agent's; aider-chat 0.86
needs Python < 3.13), with its own exact pins (`PINS`, the wheel's `Requires-Dist`) less `scipy` (only its repo map's
PageRank imports it; the map is off); tree-sitter's language pack is installed but its 180 MB of grammars
(`PRUNED`) are left out of the bundle: only the repo map and its linter parse code, both off.

Configuration, all from the command line or files of ours: `--model-settings-file` (edit format, no repo map, no
weak model of its own, `max_tokens`), `--model-metadata-file` (the rollout's context window and output limit), its
price-table cache pre-seeded (`~/.aider/caches/model_prices_and_context_window.json`: else it fetches litellm's table
from GitHub at start whatever `LITELLM_LOCAL_MODEL_COST_MAP` says), analytics disabled, no update check, no release
notes, no URL detection, no browser, no `.gitignore` edit; the key is `OPENAI_API_KEY`, sourced from the 0600 env
file (never argv). A task repository is never trusted: our launcher makes Aider read no `.aider.conf.yml`, `.env`,
`.aider.model.settings.yml` or `.aider.model.metadata.json` of the work tree's (nor of the cwd or home): only the
files its command line names; the image's `AIDER_*` variables (its environment config layer) are unset. Its retries
of a failed call stop after ~16 s of waiting (its own limit, 60 s, doubled delays: ~2 min).

Its record is two logs of its own (copied to one file while it runs): `--llm-history-file` (every call: `TO LLM`,
then `LLM RESPONSE` with the reply's text, each line prefixed with its role) and `--chat-history-file` (its
transcript: a `> Tokens: …` line after each call, then `> Applied edit to <file>` for each edit it applied). Each call
is a step carrying the reply's text and the files edited from it: the cross-check holds the text against the
captured reply and each edited file against the files that reply names.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import LITELLM_QUIET
from swe_gym_env.server.agents.pyagent import HostPythonAgent

LLM_LOG = f"{AGENT_HOME}/aider-llm-history.txt"
CHAT_LOG = f"{AGENT_HOME}/aider-chat-history.md"
EVENTS = f"{AGENT_HOME}/aider-events.txt"
LOG = f"{AGENT_HOME}/aider-log.txt"
NET = f"{AGENT_HOME}/aider-net.jsonl"
SETTINGS = f"{AGENT_HOME}/aider-model-settings.yml"
METADATA = f"{AGENT_HOME}/aider-model-metadata.json"
PRICES = f"{AGENT_HOME}/.aider/caches/model_prices_and_context_window.json"  # its price-table cache (24 h)
LAUNCH = f"{AGENT_HOME}/aider-launch.py"
# litellm's providers that /capture speaks (harness option `api`) -> (the capture dialect, what the base URL ends with,
# how Aider is told it: OpenAI's by its own switch, Anthropic's through the environment litellm reads)
APIS = {
    "openai": ("openai-chat", "/v1", "--openai-api-base"),
    "anthropic": ("anthropic-messages", "", "--set-env ANTHROPIC_API_BASE="),
}
DEFAULT_API = "openai"
UNREACHABLE = ("connection error", "connect", "unreachable", "timed out", "timeout", "name or service")

# aider-chat 0.86.2's own exact pins (its Requires-Dist for Python >= 3.10), less scipy (its repo map's PageRank)
PINS: tuple[str, ...] = tuple(
    """aider-chat==0.86.2 aiohappyeyeballs==2.6.1 aiohttp==3.13.3 aiosignal==1.4.0 annotated-doc==0.0.4
    annotated-types==0.7.0 anyio==4.12.1 asgiref==3.11.1 attrs==25.4.0 backoff==2.2.1 beautifulsoup4==4.14.3
    certifi==2026.1.4 cffi==2.0.0 charset-normalizer==3.4.4 click==8.3.1 configargparse==1.7.1
    diff-match-patch==20241021 diskcache==5.6.3 distro==1.9.0 fastapi==0.128.8 fastuuid==0.14.0 filelock==3.20.3
    flake8==7.3.0 frozenlist==1.8.0 fsspec==2026.2.0 gitdb==4.0.12 gitpython==3.1.46 grep-ast==0.9.0 h11==0.16.0
    hf-xet==1.2.0 httpcore==1.0.9 httpx==0.28.1 huggingface-hub==1.4.1 idna==3.11 importlib-metadata==7.2.1
    importlib-resources==6.5.2 jinja2==3.1.6 jiter==0.13.0 json5==0.13.0 jsonschema==4.26.0
    jsonschema-specifications==2025.9.1 litellm==1.81.10 markdown-it-py==4.0.0 markupsafe==3.0.3 mccabe==0.7.0
    mdurl==0.1.2 mixpanel==5.0.0 mslex==1.3.0 multidict==6.7.1 networkx==3.4.2 numpy==1.26.4 openai==2.20.0
    orjson==3.11.7 oslex==0.1.3 packaging==26.0 pathspec==1.0.4 pexpect==4.9.0 pillow==12.1.1 posthog==7.8.6
    prompt-toolkit==3.0.52 propcache==0.4.1 psutil==7.2.2 ptyprocess==0.7.0 pycodestyle==2.14.0 pycparser==3.0
    pydantic==2.12.5 pydantic-core==2.41.5 pydub==0.25.1 pyflakes==3.4.0 pygments==2.19.2 pypandoc==1.16.2
    pyperclip==1.11.0 python-dateutil==2.9.0.post0 python-dotenv==1.2.1 pyyaml==6.0.3 referencing==0.37.0
    regex==2026.1.15 requests==2.32.5 rich==14.3.2 rpds-py==0.30.0 shellingham==1.5.4 shtab==1.8.0 six==1.17.0
    smmap==5.0.2 sniffio==1.3.1 socksio==1.0.0 sounddevice==0.5.5 soundfile==0.13.1 soupsieve==2.8.3
    starlette==0.52.1 tiktoken==0.12.0 tokenizers==0.22.2 tqdm==4.67.3 tree-sitter==0.25.2
    tree-sitter-c-sharp==0.23.1 tree-sitter-embedded-template==0.25.0 tree-sitter-language-pack==0.13.0
    tree-sitter-yaml==0.7.2 typer==0.23.0 typer-slim==0.23.0 typing-extensions==4.15.0 typing-inspection==0.4.2
    urllib3==2.6.3 watchfiles==1.1.1 wcwidth==0.6.0 yarl==1.22.0 zipp==3.23.0""".split()
)
# in its install, never loaded with the repo map and the linter off: left out of its bundle (paths under `site/`)
PRUNED: tuple[str, ...] = ("tree_sitter_language_pack/bindings",)
# Its CLI with the socket audit first. A work tree is never trusted: the config files Aider would read from the git
# root, the cwd and home (`.aider.conf.yml`, `.env`, `.aider.model.settings.yml`, `.aider.model.metadata.json`) are
# only those the command line names (its defaults, such as `--env-file <git root>/.env`, are not). Its retries of a
# failed call stop after ~16 s of waiting.
LAUNCHER = (
    AUDIT
    + """from pathlib import Path
import aider.main as aider_main
import aider.coders.base_coder as base_coder
_get_parser = aider_main.get_parser
aider_main.get_parser = lambda default_config_files, git_root: _get_parser([], git_root)
aider_main.generate_search_path_list = lambda default_file, git_root, command_line_file: (
    [str(Path(command_line_file).resolve())] if command_line_file and str(command_line_file) in sys.argv else []
)
base_coder.RETRY_TIMEOUT = 10
sys.argv[0] = "aider"
sys.exit(aider_main.main())
"""
)
QUIET = {
    **LITELLM_QUIET,  # litellm's own price table from the package (Aider's cache: pre-seeded)
    "HOME": AGENT_HOME,  # its ~/.aider (analytics switch, price-table cache, installs file): ours
}
# the switches of its command line: one-shot, no questions, nothing of its own beyond the calls the edits need
FLAGS = (
    "--yes-always --no-check-update --analytics-disable --no-analytics --no-show-release-notes --no-auto-commits "
    "--no-dirty-commits --no-gitignore --no-auto-lint --no-auto-test --no-suggest-shell-commands --no-detect-urls "
    "--disable-playwright --no-pretty --no-fancy-input --no-notifications --no-restore-chat-history "
    "--map-tokens 0 --edit-format diff --no-show-model-warnings --no-check-model-accepts-settings"
)
TOKENS = re.compile(r"^> Tokens: ")
APPLIED = re.compile(r"^> Applied edit to (.+?)\s*$")
FAILED = re.compile(r"^> (litellm\.\w+|openai\.\w+|\w*Error):\s*(.*?)\s*$")


def llm_replies(text: str) -> list[str]:
    """The replies in Aider's LLM history, in order: the lines after each `LLM RESPONSE` header, each without its
    `ASSISTANT ` prefix."""
    replies: list[str] = []
    lines: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("LLM RESPONSE "):
            lines = []
            replies.append("")
        elif lines is not None and (line == "ASSISTANT" or line.startswith("ASSISTANT ")):
            lines.append(line[len("ASSISTANT ") :])
            replies[-1] = "\n".join(lines)
        else:
            lines = None
    return replies


class AiderHarness(HostPythonAgent):
    name: ClassVar[str] = "aider"
    version: ClassVar[str] = "0.86.2"
    # its first prompt (system prompt + its edit-format examples + the task) measured ~2.4k tokens with the demo
    # task; the files it adds to its chat come on top: room for a few files of source
    min_context_tokens: ClassVar[int] = 8192
    package: ClassVar[str] = "aider-chat"
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    pins: ClassVar[tuple[str, ...]] = PINS
    pruned: ClassVar[tuple[str, ...]] = PRUNED
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, aider.main, aider.coders.base_coder, litellm"
    install_inputs: ClassVar[tuple[str, ...]] = (*pyruntime.recipe(), *PINS)
    bundle_inputs: ClassVar[tuple[str, ...]] = (*install_inputs, *(f"prune {p}" for p in PRUNED))
    bundle_probe: ClassVar[str] = f"{pyruntime.python_command('.')} -c 'import ssl, pydantic_core, yaml'"
    # what litellm's providers would take over our command line (their endpoints; Anthropic's key: ours, if any)
    unset: ClassVar[tuple[str, ...]] = (
        "OPENAI_API_BASE",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_BASE",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
    )
    unset_prefix: ClassVar[str] = "AIDER_"  # its environment config layer: none of the image's reaches it
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, SETTINGS, NET, QUIET
    events_path = EVENTS
    log_path = LOG

    def model(self, cfg: AgentConfig) -> str:
        return f"{cfg.options.get('api', DEFAULT_API)}/{cfg.model}"

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        settings = {
            "name": self.model(cfg),
            "edit_format": "diff",
            "use_repo_map": False,
            "weak_model_name": self.model(cfg),  # its summaries, if any, are calls to our model: captured
            "editor_model_name": self.model(cfg),
            "extra_params": {"max_tokens": int(cfg.max_tokens)},
        }
        return json.dumps([settings], indent=2).encode()  # JSON is YAML

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        info = {
            "max_input_tokens": int(cfg.context_window),
            "max_tokens": int(cfg.max_tokens),
            "max_output_tokens": int(cfg.max_tokens),
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": cfg.options.get("api", DEFAULT_API),
            "mode": "chat",
        }
        meta = json.dumps({self.model(cfg): info}, indent=2).encode()
        return {
            **super().config_files(cfg, key, prompt),
            METADATA: (meta, 0o600),
            PRICES: (meta, 0o600),  # a fresh, non-empty cache: Aider fetches none
            PROMPT_FILE: (prompt.encode(), 0o600),
        }

    def command(self, cfg: AgentConfig) -> str:
        _, suffix, switch = APIS[cfg.options.get("api", DEFAULT_API)]
        base = cfg.base_url.rstrip("/") + suffix
        endpoint = f"{switch}{base}" if switch.endswith("=") else f"{switch} {base}"
        run = (
            f"{pyruntime.python_command(BUNDLE_MOUNT)} {LAUNCH} --model {self.model(cfg)} "
            f"{endpoint} --model-settings-file {SETTINGS} --model-metadata-file {METADATA} "
            f"--llm-history-file {LLM_LOG} --chat-history-file {CHAT_LOG} "
            f"--input-history-file {AGENT_HOME}/aider-input-history.txt --max-chat-history-tokens "
            f"{int(cfg.context_window)} {FLAGS} --message-file {PROMPT_FILE} < /dev/null > {LOG} 2>&1"
        )
        # litellm's Anthropic provider reads its own variable: the key from the env file, never argv
        key = 'export ANTHROPIC_API_KEY="$OPENAI_API_KEY"\n' if cfg.options.get("api") == "anthropic" else ""
        return self.environment() + key + run_and_collect(run, f"{LLM_LOG} {CHAT_LOG}", EVENTS)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        replies = llm_replies(text)
        edited: list[list[str]] = []  # per call, after its `Tokens:` line
        errors: list[str] = []  # failed attempts since the last call that was answered
        for line in text.splitlines():
            if TOKENS.match(line):
                edited.append([])
                errors = []
            elif (m := APPLIED.match(line)) and edited:
                edited[-1].append(m.group(1))
            elif m := FAILED.match(line):
                errors.append(f"{m.group(1)}: {m.group(2)}")
        for i, reply in enumerate(replies):
            out.add_step(None, (), reply, tuple(edited[i]) if i < len(edited) else ())
        settle_errors(out, errors, UNREACHABLE, "failed attempt(s) at its last model call")
        return out
