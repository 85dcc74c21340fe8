"""Kimi CLI (`kimi-cli` on PyPI), run headless: `kimi --print --output-format stream-json --yolo`, OpenAI chat
(`openai_legacy`) on its bundle's own Python 3.13.

1.51.0 is the pin: 1.52.0 is an archived stub that only prints a notice. It needs Python >= 3.12, so the bundle's
runtime is Debian trixie's CPython 3.13 (`pyagent.DebianPythonAgent`, as OpenHands' and Mistral Vibe's), with its
packages (`PINS`): pip's resolution of `kimi-cli==1.51.0` for CPython 3.13, binary wheels, plus `lxml-html-clean`
(its web tools' `justext` imports `lxml.html.clean`, which lxml 6 no longer carries: without it the CLI refuses to
start, "Invalid tools"); `ripgrepy` (its Grep tool's wrapper) has no wheel on the index and is built from its sdist
(`sdists`). Its Grep tool runs `rg`: the bundle's static ripgrep, on PATH.

Configuration: a config of ours (TOML) with one provider `capture` (`openai_legacy`, or `openai_responses` with the
harness option `api`; the capture's `/v1`) and one model (`max_context_size` the rollout's window); the key comes from
the 0600 env file and our launcher puts it into the config in its own memory (`--config` in its own `sys.argv`, taken
out of its environment: never in a file, the real argv or its tools' environment); the image's `OPENAI_API_KEY` /
`OPENAI_BASE_URL` (which those provider types read over their config) are unset; telemetry off (`telemetry = false`,
`KIMI_DISABLE_TELEMETRY`: else it looks up its telemetry host at start), no auto-update, the image's `KIMI_*` variables
unset, `KIMI_SHARE_DIR` private. Its agent is the default one (`--agent-file`: `extend: default`) less the tools a
sandboxed one-shot run cannot use or that are model calls of their own: web search / fetch, sub-agents, background
tasks. Compaction reserves the rollout's `max_tokens` (its default reserve, 50,000 tokens, would compact at once in any
window under ~59k). `max_steps_per_turn` is the harness option `max_turns`.

Its record is its wire log (`$KIMI_SHARE_DIR/sessions/<work dir hash>/<session>/wire.jsonl`, copied to a fixed path
while it runs): each model call is a `StepBegin` … `StatusUpdate` (its `token_usage.output`), with the `ToolCall`s
between (their ids); a `StepRetry` discards the attempt's calls, a `StepInterrupted` is an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import PYTHON_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.bundle import RIPGREP
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import DebianPythonAgent

PY = pyruntime.TRIXIE_PYTHON.version
SHARE = f"{AGENT_HOME}/.kimi-share"
CONFIG = f"{AGENT_HOME}/kimi-config.toml"
AGENT_FILE = f"{AGENT_HOME}/kimi-agent.yaml"
LAUNCH = f"{AGENT_HOME}/kimi-launch.py"
EVENTS = f"{AGENT_HOME}/kimi-events.jsonl"
LOG = f"{AGENT_HOME}/kimi-log.txt"
NET = f"{AGENT_HOME}/kimi-net.jsonl"

PINS: tuple[str, ...] = tuple(
    """agent-client-protocol==0.8.0 aiofile==3.12.3 aiofiles==25.1.0 aiohappyeyeballs==2.7.1 aiohttp==3.13.3
    aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 anthropic==2.17.0 anyio==4.16.0 asyncssh==2.21.1
    attrs==26.1.0 authlib==1.9.10 babel==2.19.0 backports.tarfile==1.2.0 beartype==0.23.1 cachetools==8.0.3
    caio==0.12.10 certifi==2026.10.19.post1 cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 courlan==1.4.0
    cryptography==51.0.1 cyclopts==5.5.2 dateparser==1.5.0 distro==1.9.0 dnspython==2.9.2 docstring-parser==0.18.0
    email-validator==2.4.0 exceptiongroup==1.3.2 fastapi==0.165.0 fastmcp==3.2.4 frozenlist==1.8.0 google-auth==2.63.1
    google-genai==3.6.1 griffelib==2.4.1 h11==0.16.0 htmldate==1.10.0 httpcore==1.0.9 httpcore2==2.17.0
    httptools==0.9.0 httpx==0.28.1 httpx2==2.17.0 httpx-sse==0.4.3 idna==3.21 importlib-metadata==10.2.0
    jaraco.classes==3.4.0 jaraco-context==6.1.2 jaraco-functools==4.6.0 jeepney==0.9.0 jinja2==3.1.6 jiter==0.19.0
    joserfc==1.8.0 jsonref==1.1.0 jsonschema==4.26.0 jsonschema-path==0.5.0 jsonschema-specifications==2025.9.1
    justext==3.0.2 keyring==25.7.0 kimi-cli==1.51.0 kosong==0.56.0 lazy-importer==0.1.0 loguru==0.7.3 lxml==6.0.2
    lxml-html-clean==0.4.7
    markdown-it-py==4.3.0 markupsafe==3.0.4 mcp==1.30.0 mdurl==0.1.2 more-itertools==11.2.1 multidict==6.9.1
    openai==2.14.0 openapi-pydantic==0.6.0 opentelemetry-api==1.45.3 packaging==26.4 pathable==0.6.0 pillow==12.2.0
    platformdirs==4.14.9 prompt-toolkit==3.0.52 propcache==0.5.4 py-key-value-aio==0.4.6 pyasn1==0.6.5
    pyasn1-modules==0.4.2 pycparser==3.12 pydantic==2.12.5 pydantic-core==2.41.5 pydantic-settings==2.16.3
    pygments==2.21.0 pyjwt==2.15.1 pykaos==0.9.0 pyperclip==1.11.0 python-dateutil==4.0.0 python-dotenv==1.2.4
    python-multipart==0.0.34 pytz==2026.6 pyyaml==6.0.3 referencing==0.37.0 regex==2026.12.2 requests==2.34.2
    rich==14.2.0 rich-rst==2.2.0 ripgrepy==2.2.0 rpds-py==2026.9.1 scalar-fastapi==1.9.1 secretstorage==3.5.0
    setproctitle==1.3.8 shellingham==1.5.4 sniffio==1.3.1 socksio==1.0.0 sse-starlette==3.7.1 starlette==1.10.0
    streamingjson==0.0.5 tenacity==9.1.2 tld==0.13.2 tomlkit==0.14.0 tqdm==4.70.1 trafilatura==2.0.0
    truststore==0.10.5 typer==0.21.1 typing-extensions==4.16.0 typing-inspection==0.4.5 tzdata==2026.6
    tzlocal==5.4.5 uncalled-for==0.6.2 urllib3==2.8.0 uvicorn==0.55.0 uvloop==0.23.0 watchfiles==1.3.0
    wcwidth==0.9.5 websockets==17.4 yarl==1.25.1 zipp==4.1.2""".split()
)
SDISTS = ("ripgrepy",)  # no wheel on the index: pure Python, built from its sdist
# the tools of its default agent it runs without: the web, sub-agents (model calls of their own), background tasks
EXCLUDED = (
    "kimi_cli.tools.web:SearchWeb",
    "kimi_cli.tools.web:FetchURL",
    "kimi_cli.tools.agent:Agent",
    "kimi_cli.tools.background:TaskList",
    "kimi_cli.tools.background:TaskOutput",
    "kimi_cli.tools.background:TaskStop",
)
# its CLI, with the socket audit first; the prompt from a file (the command line names it, never holds it)
# its CLI, with the socket audit first; the prompt and the config from files (the command line names them, never holds
# them), the capture key put into the config's `api_key` here, in this process only (taken out of its environment:
# its tools never see it)
LAUNCHER = (
    AUDIT
    + """prompt_file, config_file = sys.argv.pop(1), sys.argv.pop(1)
with open(prompt_file) as f:
    prompt = f.read()
with open(config_file) as f:
    config = f.read().replace("@SWE_GYM_CAPTURE_KEY@", json.dumps(os.environ.pop("SWE_GYM_CAPTURE_KEY", ""))[1:-1])
sys.argv[0] = "kimi"
sys.argv += ["--config", config, "--prompt", prompt]
from kimi_cli.__main__ import main
sys.exit(main())
"""
)
# its provider types that /capture speaks (harness option `api`) -> (the capture dialect, the base URL's suffix). Its
# `anthropic` and `gemini` types fail inside 1.51.0 before their first call with this pin set (anthropic: "Cannot
# instantiate typing.Union"): not offered
APIS = {
    "openai_legacy": ("openai-chat", "/v1"),
    "openai_responses": ("openai-responses", "/v1"),
}
DEFAULT_API = "openai_legacy"
QUIET = {
    "KIMI_DISABLE_TELEMETRY": "1",
    "KIMI_CLI_NO_AUTO_UPDATE": "1",
    "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
    "DO_NOT_TRACK": "1",
}


class KimiCliHarness(DebianPythonAgent):
    name: ClassVar[str] = "kimi-cli"
    version: ClassVar[str] = "1.51.0"
    # its first prompt measured 10.4k tokens on the demo task (system prompt + the tools it keeps): room to act
    min_context_tokens: ClassVar[int] = 16384
    package: ClassVar[str] = "kimi-cli"
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (RIPGREP,)
    pins: ClassVar[tuple[str, ...]] = PINS
    sdists: ClassVar[tuple[str, ...]] = SDISTS
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, lxml, kimi_cli.__main__, kimi_cli.tools.web"
    bundle_inputs: ClassVar[tuple[str, ...]] = (
        *pyruntime.TRIXIE_PYTHON.recipe(),
        *PINS,
        *(f"sdist {s}" for s in SDISTS),
    )
    bundle_probe: ClassVar[str] = f"{pyruntime.python_command('.', PY)} -c 'import ssl, pydantic_core' && ./bin/rg -V"
    key_env: ClassVar[str] = "SWE_GYM_CAPTURE_KEY"
    # what its openai provider types would take over the config (the endpoint and key: ours are in the config)
    unset: ClassVar[tuple[str, ...]] = ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, CONFIG, NET, QUIET
    unset_prefix: ClassVar[str] = "KIMI_"
    events_path = EVENTS
    log_path = LOG

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {**super().bundle_contents(artifacts), "bin/rg": artifacts[RIPGREP.package]}

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        api = cfg.options.get("api", DEFAULT_API)
        base = json.dumps(cfg.base_url.rstrip("/") + APIS[api][1])  # a JSON string is a TOML string
        return (
            'default_model = "capture"\ntelemetry = false\n\n'
            f'[providers.capture]\ntype = "{api}"\nbase_url = {base}\n'
            'api_key = "@SWE_GYM_CAPTURE_KEY@"\n\n'  # the launcher puts the key in, in its own memory
            f'[models.capture]\nprovider = "capture"\nmodel = {json.dumps(cfg.model)}\n'
            f"max_context_size = {int(cfg.context_window)}\n\n"
            f"[loop_control]\nmax_steps_per_turn = {max_turns(cfg)}\n"
            f"reserved_context_size = {max(1000, int(cfg.max_tokens))}\n"
        ).encode()

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        agent = "version: 1\nagent:\n  extend: default\n  exclude_tools:\n"
        agent += "".join(f'    - "{t}"\n' for t in EXCLUDED)
        return {
            **super().config_files(cfg, key, prompt),
            AGENT_FILE: (agent.encode(), 0o600),
            PROMPT_FILE: (prompt.encode(), 0o600),
        }

    def environment(self) -> str:
        return super().environment() + f"export KIMI_SHARE_DIR={SHARE} PATH={BUNDLE_MOUNT}/bin:$PATH\n"

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{pyruntime.python_command(BUNDLE_MOUNT, PY)} {LAUNCH} {PROMPT_FILE} {CONFIG} "
            f"--agent-file {AGENT_FILE} --print --output-format stream-json --yolo "
            f"< /dev/null > {AGENT_HOME}/kimi-stream.jsonl 2> {LOG}"
        )
        return self.environment() + run_and_collect(run, f"{SHARE}/sessions/*/*/wire.jsonl", EVENTS)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        calls: list[str] = []  # tool calls of the step in progress
        for ev in jsonl_objects(text):
            message = as_dict(ev.get("message"))
            kind, payload = message.get("type"), as_dict(message.get("payload"))
            if kind in ("StepBegin", "StepRetry"):
                calls = []
            elif kind == "ToolCall" and payload.get("id"):
                calls.append(str(payload["id"]))
            elif kind == "StatusUpdate" and isinstance(payload.get("token_usage"), dict):
                n = as_dict(payload.get("token_usage")).get("output")
                out.add_step(n if isinstance(n, int) else None, tuple(calls))
                calls = []
            elif kind == "StepInterrupted":
                errors.append("a step was interrupted (the model call failed: see the agent's log)")
        settle_errors(out, errors, PYTHON_UNREACHABLE, "step(s) interrupted in the agent")
        return out
