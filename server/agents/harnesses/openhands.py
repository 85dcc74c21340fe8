"""OpenHands (its CodeAct agent, as the `openhands-sdk` / `openhands-tools` packages ship it), run headless on its
bundle's own Python 3.13: the SDK's `Agent` with its terminal, file-editor and task-tracker tools, a local
`Conversation` whose workspace is the task's work tree, the task in a config file of ours (never argv), its event
stream written by a callback of ours to one JSONL file and read back for the cross-check.

Which OpenHands: `openhands-ai` 1.x is OpenHands' app server (web UI, conversation manager, its sandboxes); the agent
itself lives in the SDK, which the app server runs inside each sandbox through `openhands-agent-server`.
`openhands-ai==1.11.0` pins `openhands-sdk==1.34.0` and `openhands-tools==1.34.0`: this harness runs exactly those,
in the sandbox itself (no nested Docker, no agent server, no browser, no Jupyter: its `LocalConversation` executes
the tools in-process; the terminal tool is forced to its `subprocess` backend, a pty running `bash -i`, so no tmux is
needed either). Both need Python >= 3.12: the bundle's runtime is Debian trixie's CPython 3.13 with trixie's own
loader and C library (`pyruntime.TRIXIE_PYTHON`), run like mini-swe-agent's 3.11 (`server/agents/pyruntime.py`).

Its packages (`PINS`): pip's resolution of `openhands-sdk==1.34.0 openhands-tools==1.34.0` for CPython 3.13 under
`openhands-ai==1.11.0`'s pins, less `browser-use` (the browser tool set, not loaded with `cli_mode`), `tom-swe` (its
`tom_consult` tool, not loaded) and what only they need (`func-timeout`, the one sdist-only package of the tree, among
them): 129 wheels, binary only, no resolution at install time.

Model: its `LLM` (litellm underneath) as `openai/<model>` with `base_url` = `/capture/v1`, non-streaming, native tool
calls, no prompt caching, no reasoning effort, its retries short (3 attempts); the key is `OPENAI_API_KEY`, read from
a 0600 file into the launcher, which takes it out of its own environment before the agent's terminal starts (its
commands never see it). No condenser: a summarizing condenser makes model calls of its own that are no agent step
(the rollout's context window governs, as for mini-swe-agent). Nothing else is called: litellm's cost map from the
package (`LITELLM_LOCAL_MODEL_COST_MAP`), Laminar / OpenTelemetry off (their variables unset), no public skills, the
banner off. Every socket it opens or name it resolves is logged by an audit hook (`NET`).

Limits: `max_iteration_per_run` (one model call per iteration) is the rollout's budget plus one, the call the proxy
answers with its budget reply (a reply without a tool call, which ends its run: `finished`); reaching the limit is
its `MaxIterationsReached` error event, an ending like mini-swe-agent's `LimitsExceeded`, not a crash. Its stuck
detector stays on (its own way to stop a loop: `stuck`, also an ending).

Its record (`EVENTS`, JSONL): every event of its stream as OpenHands serializes it (`kind`: SystemPromptEvent,
MessageEvent, ActionEvent, ObservationEvent, AgentErrorEvent, ConversationErrorEvent, ...), each agent event followed
by a `swe_gym_usage` line (its model call's `response_id` and `completion_tokens`, from the SDK's own per-call
metrics), and a last `swe_gym_exit` line (its execution status, or the exception that ended it). One model call is
one `llm_response_id`: the ActionEvents that share it (parallel tool calls, in order) or the agent's MessageEvent.
"""

from __future__ import annotations

import json
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import PYTHON_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import jsonl_objects
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import LITELLM_QUIET
from swe_gym_env.server.agents.pyagent import DebianPythonAgent

RUNTIME = pyruntime.TRIXIE_PYTHON
PY = RUNTIME.version
EVENTS = f"{AGENT_HOME}/openhands-events.jsonl"
LOG = f"{AGENT_HOME}/openhands-log.txt"
NET = f"{AGENT_HOME}/openhands-net.jsonl"  # every connect / name lookup the agent's Python made
CONFIG = f"{AGENT_HOME}/openhands-config.json"
LAUNCH = f"{AGENT_HOME}/openhands-launch.py"
STATE = f"{AGENT_HOME}/.openhands/conversations"  # its own persistence (base_state.json, events/)
# its terminal is `bash -i` on a pty: readline's bracketed-paste mode would wrap every observation in escape codes
# (`\x1b[?2004l ... \x1b[?2004h`, measured) that its tmux backend never shows the model
INPUTRC = f"{AGENT_HOME}/openhands-inputrc"
# how a run may end without being the agent's failure: it finished (a reply without a tool call, or its finish tool),
# its iteration limit (our budget) was reached, or its stuck detector stopped it
ENDED = ("finished", "stuck")
LIMIT_CODES = ("MaxIterationsReached",)
# pip's resolution of openhands-sdk==1.34.0 + openhands-tools==1.34.0 for CPython 3.13 (2026), under openhands-ai
# 1.11.0's pins, less browser-use, tom-swe and what only they need: installed with --no-deps, the whole environment
PINS: tuple[str, ...] = tuple(
    """openhands-sdk==1.34.0 openhands-tools==1.34.0 agent-client-protocol==0.12.1 aiofile==3.12.3
    aiohappyeyeballs==2.7.1 aiohttp==3.14.1 aiosignal==1.4.0 annotated-types==0.8.0 anyio==4.9.0 attrs==26.1.0
    Authlib==1.9.10 beartype==0.23.1 binaryornot==0.6.0 cachetools==8.0.2 caio==0.12.10 certifi==2026.10.19.post1
    cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 cryptography==50.0.2 cyclopts==5.5.2 deprecation==2.1.0
    distro==1.9.0 docstring_parser==0.18.0 exceptiongroup==1.3.2 fakeredis==2.41.0 fastmcp-slim==3.4.11
    fastmcp==3.4.11 fastuuid==0.14.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0
    googleapis-common-protos==1.75.0 griffelib==2.4.1 grpcio==1.85.3 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.6.0
    httpcore==1.0.9 httpx-sse==0.4.3 httpx2==2.6.0 httpx==0.29.0 huggingface_hub==2.4.0 idna==3.20
    importlib_metadata==8.7.1 jaraco.classes==3.4.0 jaraco.context==6.1.2 jaraco.functools==4.6.0 jeepney==0.9.0
    Jinja2==3.1.6 jiter==0.19.0 joserfc==1.8.0 jsonref==1.1.0 jsonschema-path==0.5.0
    jsonschema-specifications==2025.9.1 jsonschema==4.26.0 keyring==25.7.0 libtmux==0.62.0 litellm==1.84.1
    lmnr-claude-code-proxy==0.2.0 lmnr==0.7.52 lupa==2.8 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mcp==1.30.0
    mdurl==0.1.2 more-itertools==11.2.1 multidict==6.9.1 openai==2.33.0 openapi-pydantic==0.6.0
    opentelemetry-api==1.39.1 opentelemetry-exporter-otlp-proto-common==1.39.1
    opentelemetry-exporter-otlp-proto-grpc==1.39.1 opentelemetry-exporter-otlp-proto-http==1.39.1
    opentelemetry-instrumentation-threading==0.60b1 opentelemetry-instrumentation==0.60b1
    opentelemetry-proto==1.39.1 opentelemetry-sdk==1.39.1 opentelemetry-semantic-conventions-ai==0.4.13
    opentelemetry-semantic-conventions==0.60b1 orjson==3.11.8 packaging==26.4 pathable==0.6.0 pillow==12.2.0
    platformdirs==4.14.9 propcache==0.5.4 protobuf==5.29.6 py-key-value-aio==0.4.6 pycparser==3.12
    pydantic-settings==2.16.3 pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.13.0
    pyperclip==1.11.0 python-dotenv==1.2.2 python-frontmatter==1.1.0 python-json-logger==4.2.0
    python-multipart==0.0.32 PyYAML==6.0.3 redis==6.4.0 referencing==0.37.0 regex==2026.11.19 requests==2.33.1
    rich-rst==2.2.0 rich==15.0.0 rpds-py==2026.9.1 SecretStorage==3.5.0 sniffio==1.3.1 sortedcontainers==2.4.0
    sse-starlette==3.3.4 starlette==1.3.1 tenacity==9.1.4 tiktoken==0.14.0 tokenizers==0.23.3 tqdm==4.70.1
    tree-sitter-bash==0.25.1 tree-sitter==0.26.1 truststore==0.10.5 typing-inspection==0.4.5
    typing_extensions==4.16.0 uncalled-for==0.6.2 urllib3==2.7.0 uvicorn==0.55.0 watchfiles==1.3.0
    websockets==16.1.1 wrapt==1.17.3 yarl==1.25.1 zipp==4.1.2""".split()
)
# Builds the SDK's agent and a local conversation from our config file and runs it; paths come from the command line
# and the environment, never from file contents (landlock maps /home/agent only there).
LAUNCHER = (
    AUDIT
    + """_path = list(sys.path)
conf_path, events_path, state_dir = sys.argv[1:4]
with open(conf_path) as f:
    conf = json.load(f)
key = os.environ.pop("OPENAI_API_KEY", "")  # the agent's terminal inherits this environment: never the key
# a sandbox that cannot make ptys (landlock) hands this command pairs it opened beforehand: its terminal takes them in
# turn, then real ones; the variable never reaches the terminal, the unused pairs never reach a child (non-inheritable)
_ptys = [tuple(int(fd) for fd in pair.split(":")) for pair in os.environ.pop("SWE_GYM_PTYS", "").split(",") if pair]
if _ptys:
    import pty
    for _fd in (fd for pair in _ptys for fd in pair):
        os.set_inheritable(_fd, False)
    _openpty = os.openpty
    def _given_pty():
        return _ptys.pop(0) if _ptys else _openpty()
    os.openpty = pty.openpty = _given_pty
out = open(events_path, "a", buffering=1)
def write(obj):
    out.write(json.dumps(obj) + "\\n")
try:
    from pydantic import SecretStr
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.task_tracker import TaskTrackerTool
    from openhands.tools.terminal import TerminalTool
    sys.path[:] = [p for p in sys.path if p in _path]  # importing the SDK appends the cwd (measured)
    llm = LLM(api_key=SecretStr(key), usage_id="agent", **conf["llm"])
    tools = [Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}), Tool(name=FileEditorTool.name),
             Tool(name=TaskTrackerTool.name)]
    agent = Agent(llm=llm, tools=tools, system_prompt_kwargs={"cli_mode": True}, condenser=None)
    conv = None
    def on_event(ev):
        write(json.loads(ev.model_dump_json()))
        rid = getattr(ev, "llm_response_id", None)
        if rid and getattr(ev, "source", None) == "agent" and conv is not None:
            metrics = conv.state.stats.usage_to_metrics.get("agent")
            usage = next((u for u in (metrics.token_usages if metrics else []) if u.response_id == rid), None)
            write({"kind": "swe_gym_usage", "response_id": rid,
                   "completion_tokens": usage.completion_tokens if usage else None})
    conv = Conversation(agent=agent, workspace=os.getcwd(), persistence_dir=state_dir, callbacks=[on_event],
                        max_iteration_per_run=conf["max_iterations"], visualizer=None, delete_on_close=False)
    conv.send_message(conf["task"])
    conv.run()
    status = str(getattr(conv.state.execution_status, "value", conv.state.execution_status))
    write({"kind": "swe_gym_exit", "status": status})
    conv.close()
except BaseException as e:
    write({"kind": "swe_gym_exit", "status": "exception", "error": f"{type(e).__name__}: {e}"[:2000]})
    raise
"""
)
QUIET = {  # what the SDK and litellm honour: no banner, no fetch, no telemetry
    "OPENHANDS_SUPPRESS_BANNER": "1",
    **LITELLM_QUIET,
}
# Laminar / OpenTelemetry export turns on when any of these is set (openhands/sdk/observability/laminar.py)
UNSET = ("LMNR_PROJECT_API_KEY", "OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class OpenHandsHarness(DebianPythonAgent):
    name: ClassVar[str] = "openhands"
    version: ClassVar[str] = "1.34.0"  # openhands-sdk / openhands-tools, as openhands-ai 1.11.0 pins them
    # its first prompt (system prompt in cli_mode, five tools: terminal, file_editor, task_tracker, finish, think)
    # measured 7,843 SmolLM2 tokens with the demo task's issue in it; and the SDK itself refuses a context window
    # under 16,384 tokens (LLMContextWindowTooSmallError, unless ALLOW_SHORT_CONTEXT_WINDOWS): that is the floor
    min_context_tokens: ClassVar[int] = 16384
    package: ClassVar[str] = "openhands-sdk"  # from PyPI, by the bundle's own pip
    needs_pty: ClassVar[bool] = True  # its terminal: `bash -i` on a pty (subprocess backend); landlock: given pairs
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    bundle_inputs: ClassVar[tuple[str, ...]] = (*RUNTIME.recipe(), *PINS)
    bundle_probe: ClassVar[str] = f"{pyruntime.python_command('.', PY)} -c 'import ssl, pydantic_core, litellm'"
    events_path = EVENTS
    log_path = LOG
    launcher, launch_path, config_path, net_path, unset = LAUNCHER, LAUNCH, CONFIG, NET, UNSET
    pins: ClassVar[tuple[str, ...]] = PINS
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, litellm, openhands.sdk, openhands.tools.terminal"
    quiet: ClassVar[dict[str, str]] = {**QUIET, "INPUTRC": INPUTRC}  # bash: no bracketed paste in its output

    def config(self, cfg: AgentConfig, prompt: str) -> dict:
        return {
            "llm": {
                "model": f"openai/{cfg.model}",
                "base_url": cfg.base_url.rstrip("/") + "/v1",
                "max_input_tokens": int(cfg.context_window),
                "max_output_tokens": int(cfg.max_tokens),
                "native_tool_calling": True,
                "stream": False,
                "caching_prompt": False,
                "reasoning_effort": None,
                "log_completions": False,
                # 3 attempts, a few seconds apart, like the other agents (the proxy counts failures in a row)
                "num_retries": 2,
                "retry_min_wait": 2,
                "retry_max_wait": 8,
            },
            # the budget, plus the one call the proxy answers with its budget reply (0: its own default, 500)
            "max_iterations": cfg.max_calls + 1 if cfg.max_calls > 0 else 500,
            "task": prompt,
        }

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        return json.dumps(self.config(cfg, prompt), indent=2).encode()

    def extra_files(self) -> dict[str, tuple[bytes, int]]:
        return {INPUTRC: (b"set enable-bracketed-paste off\n", 0o600)}

    def launch_args(self, cfg: AgentConfig) -> str:
        return f"{CONFIG} {EVENTS} {STATE}"

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        calls: dict[str, list[str]] = {}  # llm_response_id -> its tool-call ids, in the order of the stream
        tokens: dict[str, int] = {}
        errors: list[str] = []
        for ev in jsonl_objects(text):
            kind = ev.get("kind")
            if kind in ("ActionEvent", "MessageEvent") and ev.get("source") == "agent" and ev.get("llm_response_id"):
                ids = calls.setdefault(str(ev["llm_response_id"]), [])
                if kind == "ActionEvent" and ev.get("tool_call_id"):
                    ids.append(str(ev["tool_call_id"]))
            elif kind == "swe_gym_usage" and isinstance(ev.get("completion_tokens"), int):
                tokens[str(ev.get("response_id"))] = ev["completion_tokens"]
            elif kind == "ConversationErrorEvent" and ev.get("code") not in LIMIT_CODES:
                errors.append(f"{ev.get('code')}: {ev.get('detail')}")
            elif kind == "swe_gym_exit" and ev.get("status") not in (*ENDED, "error"):
                errors.append(f"{ev.get('status')}: {ev.get('error') or 'the agent stopped'}")
        for rid, ids in calls.items():
            out.add_step(tokens.get(rid), tuple(ids))
        settle_errors(out, errors, PYTHON_UNREACHABLE)
        return out
