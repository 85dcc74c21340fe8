"""Hermes Agent (`hermes-agent` on PyPI), run headless: `hermes chat -q … -Q --yolo --max-turns N` on its bundle's own
Python 3.11, OpenAI chat through its `custom` provider (the capture's `/v1`); OpenAI Responses or Anthropic Messages
with the harness option `api` (its `api_mode`, on a named provider `custom:capture`: a plain `custom` one speaks chat
only).

Bundle: the host's CPython 3.11 made relocatable (`pyagent.HostPythonAgent`, as mini-swe-agent's and Aider's), with
its packages (`PINS`: pip's resolution of `hermes-agent==0.19.0`, which pins most of them itself, plus `anthropic`
for its Anthropic Messages mode: 0.125.0, the last on `httpx`; 1.x and 2.x are on `httpx2`, where the `httpx.Timeout`
its client passes fails).

Configuration: `$HERMES_HOME/config.yaml` (a private `HERMES_HOME`): `model: {provider: custom, base_url, api_key,
default, context_length, max_tokens}`; the key is `${OPENAI_API_KEY}` in it, expanded by Hermes from its environment
(sourced from the 0600 env file, never in a file or argv; its terminal tool strips `OPENAI_API_KEY` from the commands
it runs). Hermes refuses a context under 64K tokens (`MINIMUM_CONTEXT_LENGTH`): its minimum context. Offline:
- tirith, its command scanner, is off (`security.tirith_enabled: false`): on its first run it downloads the tirith
  binary from GitHub;
- its update check (`git ls-remote` / PyPI, cached 6 h in `$HERMES_HOME/.update_check`) finds a fresh cache of ours;
- the probes of its endpoint for a local server's kind (LM Studio's `/api/v1/models`, Ollama's `/api/tags`,
  llama.cpp's `/v1/props`, vLLM's `/version`: for Ollama's context size at start) are off (`ollama_num_ctx: 0`: given,
  and no `options.num_ctx` sent), and its price lookup after each call (`/v1/models`) is taken out by our launcher;
- its toolsets are `terminal`, `file` and `todo` (`-t`): no web, browser or vision tools (whose availability checks
  probe the endpoint too), no memory, skills hub, delegation or cron; `--ignore-rules` (no AGENTS.md / SOUL.md /
  memory injected from the work tree or its home);
- its environment probe (python3 / pip state, one line of its system prompt, waited on for up to 10 s) is off.
The prompt comes from a file (our launcher puts it into its own argv: never the real command line).

Its record is its own log (`$HERMES_HOME/logs/agent.log`, copied to a fixed path while it runs): one `API call #N: …
out=<completion tokens>` line per model call it used, `API call failed …` lines for failed attempts. Its session is
in `$HERMES_HOME/state.db` (SQLite) too.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import PROMPT_FILE
from swe_gym_env.server.agents.base import PYTHON_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import max_turns
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import HostPythonAgent

HERMES_HOME = f"{AGENT_HOME}/.hermes-home"
CONFIG = f"{HERMES_HOME}/config.yaml"
UPDATE_CHECK = f"{HERMES_HOME}/.update_check"
AGENT_LOG = f"{HERMES_HOME}/logs/agent.log"
EVENTS = f"{AGENT_HOME}/hermes-events.log"
LOG = f"{AGENT_HOME}/hermes-log.txt"
NET = f"{AGENT_HOME}/hermes-net.jsonl"
LAUNCH = f"{AGENT_HOME}/hermes-launch.py"
MIN_CONTEXT = 65536  # agent/model_metadata.py: MINIMUM_CONTEXT_LENGTH (64K): it refuses a model with less
TOOLSETS = "terminal,file,todo"
# its API modes that /capture speaks (harness option `api`, its `model.api_mode`) -> (the capture dialect, what its
# `base_url` ends with: the OpenAI client appends /chat/completions or /responses, the Anthropic one /v1/messages)
APIS = {
    "chat_completions": ("openai-chat", "/v1"),
    "codex_responses": ("openai-responses", "/v1"),
    "anthropic_messages": ("anthropic-messages", ""),
}
DEFAULT_API = "chat_completions"

PINS: tuple[str, ...] = tuple(
    """hermes-agent==0.19.0 annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 certifi==2026.5.20 cffi==2.1.1
    charset-normalizer==3.5.3 click==8.5.1 croniter==6.0.0 cryptography==46.0.7 distro==1.9.0 fastapi==0.165.0
    fire==0.7.1 h11==0.16.0 httpcore==1.0.9 httptools==0.9.0 httpx==0.28.1 idna==3.21 jinja2==3.1.6 jiter==0.19.0
    markdown==3.10.2 markdown-it-py==4.3.0 markupsafe==3.0.4 mdurl==0.1.2 openai==2.24.0 opentelemetry-api==1.45.3
    packaging==26.0 pathspec==1.1.1 pillow==12.2.0 prompt-toolkit==3.0.52 psutil==7.2.2 ptyprocess==0.7.0
    pycparser==3.12 pydantic==2.13.4 pydantic-core==2.46.4 pygments==2.21.0 pyjwt==2.13.0 python-dateutil==4.0.0
    python-dotenv==1.2.2 python-multipart==0.0.34 pytz==2026.6 pyyaml==6.0.3 requests==2.33.0 rich==14.3.3
    ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 sniffio==1.3.1 socksio==1.0.0 starlette==1.10.0 tenacity==9.1.4
    termcolor==3.3.0 tqdm==4.70.1 typing-inspection==0.4.5 typing-extensions==4.16.0 tzdata==2026.6 urllib3==2.8.0
    uvicorn==0.55.0 uvloop==0.23.0 watchfiles==1.3.0 wcwidth==0.9.5 websockets==15.0.1
    anthropic==0.125.0 docstring-parser==0.18.0""".split()
)
# its CLI with the socket audit first; the prompt from a file (the command line names it); its price lookup after
# each call (a GET of the endpoint's /v1/models, and of /api/v1/models, /api/tags, ... to tell its kind) taken out
LAUNCHER = (
    AUDIT
    + """with open(sys.argv.pop(1)) as f:
    prompt = f.read()
import agent.usage_pricing as usage_pricing
usage_pricing.fetch_endpoint_model_metadata = lambda *args, **kwargs: {}
sys.argv[0] = "hermes"
sys.argv[1:1] = ["chat", "-q", prompt]
from hermes_cli.main import main
sys.exit(main())
"""
)
QUIET = {"HERMES_HOME": HERMES_HOME, "TIRITH_ENABLED": "false", "DO_NOT_TRACK": "1"}
CALL = re.compile(r"\] agent\.conversation_loop: API call #(\d+): .*? out=(\d+) ")
FAILED = re.compile(r" (?:ERROR|WARNING) .*?API call failed(.*)$")


class HermesHarness(HostPythonAgent):
    name: ClassVar[str] = "hermes"
    version: ClassVar[str] = "0.19.0"
    min_context_tokens: ClassVar[int] = MIN_CONTEXT
    package: ClassVar[str] = "hermes-agent"
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    pins: ClassVar[tuple[str, ...]] = PINS
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, hermes_cli.main, run_agent, agent.usage_pricing"
    install_inputs: ClassVar[tuple[str, ...]] = (*pyruntime.recipe(), *PINS)
    bundle_inputs: ClassVar[tuple[str, ...]] = install_inputs
    bundle_probe: ClassVar[str] = f"{pyruntime.python_command('.')} -c 'import ssl, pydantic_core, yaml'"
    unset_prefix: ClassVar[str] = "HERMES_"  # its environment settings: none of the image's reaches it
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, CONFIG, NET, QUIET
    events_path = EVENTS
    log_path = LOG

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        api = cfg.options.get("api", DEFAULT_API)
        endpoint = {
            "base_url": cfg.base_url.rstrip("/") + APIS[api][1],
            "api_key": "${OPENAI_API_KEY}",  # expanded by Hermes from its environment
        }
        model = {
            "provider": "custom",
            **endpoint,
            "default": cfg.model,
            "context_length": int(cfg.context_window),
            "max_tokens": int(cfg.max_tokens),
            "ollama_num_ctx": 0,  # given: no probe of the endpoint for Ollama's
        }
        config: dict = {"model": model}
        if api != DEFAULT_API:  # a plain `custom` provider speaks chat only: a named one takes an api_mode
            model = {k: v for k, v in model.items() if k not in endpoint} | {"provider": "custom:capture"}
            config["model"] = model
            config["providers"] = {"capture": {**endpoint, "api_mode": api, "default_model": cfg.model}}
        # its environment probe (python3 / pip state for a line of its system prompt: a dozen commands, waited on for
        # up to 10 s, measured at that limit under load) off
        agent = {"max_turns": max_turns(cfg), "environment_probe": False}
        config.update(agent=agent, security={"tirith_enabled": False})
        return json.dumps(config, indent=2).encode()  # JSON is YAML

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        fresh = {"ts": 4102444800.0, "behind": 0, "rev": None, "ver": self.version}  # cached until 2100
        return {
            **super().config_files(cfg, key, prompt),
            UPDATE_CHECK: (json.dumps(fresh).encode(), 0o600),
            PROMPT_FILE: (prompt.encode(), 0o600),
        }

    def command(self, cfg: AgentConfig) -> str:
        run = (
            f"{pyruntime.python_command(BUNDLE_MOUNT)} {LAUNCH} {PROMPT_FILE} -Q --yolo --max-turns {max_turns(cfg)} "
            f"-t {TOOLSETS} --ignore-rules < /dev/null > {LOG} 2>&1"
        )
        return self.environment() + run_and_collect(run, AGENT_LOG, EVENTS)

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        errors: list[str] = []
        for line in text.splitlines():
            if m := CALL.search(line):
                out.add_step(int(m.group(2)))
                errors = []
            elif m := FAILED.search(line):
                errors.append("API call failed" + m.group(1)[:300])
        settle_errors(out, errors, PYTHON_UNREACHABLE, "failed attempt(s) at its last model call")
        return out
