"""mini-swe-agent (`mini-swe-agent` on PyPI), run headless on its bundle's own Python: `mini` with the built-in
`mini.yaml` and a config of ours on top, the task in that config (never argv), its trajectory file read back.

Its bundle carries a relocatable CPython 3.11 with its own loader and C library (`server/agents/pyruntime.py`) and the
agent's packages, installed by that runtime's pip from a full pin list (`PINS`: mini-swe-agent's dependencies as pip
resolved them, less `datasets` and what only it needs — pyarrow, pandas, numpy — which only its SWE-bench batch runner
imports). The image's Python is never used: the task's packages and the agent's never meet.

Model: its `litellm` model class (OpenAI chat, non-streaming, one `bash` tool `{command}`) as `openai/<model>` with
`api_base` = `/capture/v1`; the key is `OPENAI_API_KEY`, read from a 0600 file into the agent's environment and
blanked in the environment of its commands (`environment.env`). litellm makes no call of its own:
`LITELLM_LOCAL_MODEL_COST_MAP=True` (its cost map from the package, not GitHub), telemetry off, Hugging Face offline;
cost tracking is `ignore_errors` (our model has no price) and its cost limit off. Every socket it opens or name it
resolves is logged by an audit hook (`NET`), so a test can show from inside the sandbox that only `/capture` answered.

Limits: its `step_limit` is the rollout's model-call budget plus one (the call the proxy answers with its budget
reply, after which it stops itself: `LimitsExceeded`, `stop_reason: budget_exhausted` as for the others);
its wall-time limit is off (the rollout's deadline governs). Its submission convention — a bash call
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` alone, whose output after that line is its "submission" — ends the run
(`exit_status: Submitted`); what is graded is the work tree's diff, as for every harness (the submission text,
empty with `mini.yaml`, is not used).

Its record is the trajectory (`-o`, JSON, rewritten after every step): each model call is an assistant message whose
`extra.response` is the OpenAI response (tool-call ids, `usage.completion_tokens`), or — for a reply without a valid
tool call — the format-error message that carries the same `extra.response`; its last message (`role: exit`) says
how it ended.
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
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import LITELLM_QUIET
from swe_gym_env.server.agents.pyagent import HostPythonAgent
from swe_gym_env.server.agents.pyagent import without  # noqa: F401 (without: its old home)

TRAJ = f"{AGENT_HOME}/mini-traj.json"
LOG = f"{AGENT_HOME}/mini-log.txt"
NET = f"{AGENT_HOME}/mini-net.jsonl"  # every connect / name lookup the agent's Python made
CONFIG = f"{AGENT_HOME}/mini-config.yaml"
LAUNCH = f"{AGENT_HOME}/mini-launch.py"
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini.yaml's submission command: `echo <this>`, alone
# exit statuses that are not the agent's failures: it submitted, hit its step limit, or the model answered without a
# tool call three times in a row (the model's doing: graded as it stands, like a run whose model stopped early)
ENDED = ("Submitted", "LimitsExceeded", "RepeatedFormatError")
# pip's resolution of mini-swe-agent==2.4.6 (2026), less `datasets` and its own dependencies (dill, multiprocess,
# numpy, pandas, pyarrow, xxhash): installed with --no-deps, so this list is the whole environment
PINS: tuple[str, ...] = tuple(
    """mini-swe-agent==2.4.6 litellm==1.110.2 aiohttp==3.14.5 anyio==4.16.0 boto3==1.44.8 botocore==1.44.8 click==8.5.1
    fastuuid==0.14.0 filelock==4.3.1 httpx==0.28.1 httpcore==1.0.9 h2==4.4.1 hpack==4.2.0 huggingface_hub==2.4.0
    hf-xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 hyperframe==6.1.0 importlib_metadata==8.9.0 Jinja2==3.1.6
    jmespath==1.1.0 jsonschema==4.26.0 multidict==7.2.1 openai==3.57.0 jiter==0.19.0 pydantic==2.14.4
    pydantic_core==2.50.5 pydantic-settings==2.16.3 python-dateutil==2.9.0.post0 python-dotenv==1.2.4 PyYAML==6.0.4
    s3transfer==0.19.3 tiktoken==0.14.0 tokenizers==0.23.3 typing_extensions==4.16.0 urllib3==2.8.0 yarl==1.25.1
    aiohappyeyeballs==2.7.1 aiosignal==1.4.0 annotated-types==0.8.0 attrs==26.1.0 certifi==2026.10.19.post1
    frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0 idna==3.20 jsonschema-specifications==2025.9.1 MarkupSafe==3.0.4
    packaging==26.4 propcache==0.5.4 referencing==0.37.0 rpds-py==2026.9.1 six==1.17.0 tqdm==4.70.1 truststore==0.10.5
    typing-inspection==0.4.5 zipp==4.1.2 platformdirs==4.14.9 prompt_toolkit==3.0.53 wcwidth==0.9.4
    regex==2026.11.19 requests==2.34.2 charset-normalizer==3.5.3 rich==15.0.0 Pygments==2.21.0 markdown-it-py==4.3.0
    mdurl==0.1.2 sniffio==1.3.1 tenacity==9.2.1 textual==8.2.8 linkify-it-py==2.2.0 mdit-py-plugins==0.7.0
    typer==0.29.2 annotated-doc==0.0.7 shellingham==1.5.4""".split()
)
# in its install, never loaded by the agent: left out of its bundle (paths under `site/`). litellm's admin UI, a static
# web build (22 MB) only its proxy server (`litellm.proxy.proxy_server`) serves. The rest of `litellm/proxy` stays:
# a run loads a dozen of its modules (`_types`, `common_utils`, `spend_tracking.savings`, ...), as an import audit
# of a whole run shows
PRUNED: tuple[str, ...] = ("litellm/proxy/_experimental/out",)
# Runs mini's CLI module with an audit hook that logs the sockets it connects and the names it resolves. Paths come
# from the command line and the environment, never from file contents (landlock maps /home/agent only there).
LAUNCHER = (
    AUDIT
    + """import runpy
sys.argv[0] = "mini"
runpy.run_module("minisweagent.run.mini", run_name="__main__", alter_sys=True)
"""
)
QUIET = {  # what mini-swe-agent and litellm honour: no prompts, no banner, no fetch, no telemetry
    "MSWEA_CONFIGURED": "1",  # else it asks for a default model on stdin
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_GLOBAL_CONFIG_DIR": f"{AGENT_HOME}/.config/mini-swe-agent",
    "MSWEA_COST_TRACKING": "ignore_errors",
    # its retries of a failed call wait 4 s, 8 s, 16 s, ... up to 60 s (fixed in the package); 3 attempts give up
    # within ~15 s of waiting, like the other agents, well before a rollout's deadline (its OpenAI client retries
    # inside each attempt too, so the proxy still sees its limit of failures in a row where the engine is gone)
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
    **LITELLM_QUIET,
}


class MiniSweAgentHarness(HostPythonAgent):
    name: ClassVar[str] = "mini-swe-agent"
    version: ClassVar[str] = "2.4.6"
    # its first prompt (system + mini.yaml's instance template + its one bash tool) measured 1,223 SmolLM2 tokens with
    # the demo task's issue in it (1,245 under landlock: a longer work-tree path); room for a few steps, as Pi's
    min_context_tokens: ClassVar[int] = 4096
    package: ClassVar[str] = "mini-swe-agent"  # from PyPI, by the bundle's own pip
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    pins: ClassVar[tuple[str, ...]] = PINS
    pruned: ClassVar[tuple[str, ...]] = PRUNED
    imports: ClassVar[str] = "ssl, sqlite3, ctypes, pydantic_core, yaml, tiktoken"
    install_inputs: ClassVar[tuple[str, ...]] = (*pyruntime.recipe(), *PINS)  # what its install is made from
    bundle_inputs: ClassVar[tuple[str, ...]] = (*install_inputs, *(f"prune {p}" for p in PRUNED))
    bundle_probe: ClassVar[str] = f"{pyruntime.python_command('.')} -c 'import ssl, pydantic_core, yaml'"
    events_path = TRAJ  # its trajectory: the record parse_events reads
    log_path = LOG
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, CONFIG, NET, QUIET

    def config(self, cfg: AgentConfig, prompt: str) -> dict:
        return {
            "agent": {
                "agent_class": "default",  # never asks for confirmation
                # the budget, plus the one call the proxy answers with its budget reply: the run then ends as the
                # others' do (stop_reason budget_exhausted), not as a finished one. 0: none (the budget still holds)
                "step_limit": cfg.max_calls + 1 if cfg.max_calls > 0 else 0,
                "cost_limit": 0,
                "wall_time_limit_seconds": 0,
            },
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{cfg.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": cfg.base_url.rstrip("/") + "/v1", "max_tokens": int(cfg.max_tokens)},
            },
            # its commands never see the key
            "environment": {"environment_class": "local", "env": {self.key_env: ""}},
            "run": {"task": prompt},
        }

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        return json.dumps(self.config(cfg, prompt), indent=2).encode()  # JSON is YAML

    def launch_args(self, cfg: AgentConfig) -> str:
        return f"-c mini.yaml -c {CONFIG} --exit-immediately -o {TRAJ}"

    def parse_events(self, text: str) -> AgentOutcome:
        out = AgentOutcome()
        try:
            traj = json.loads(text)
        except ValueError:
            return out  # not written yet, or caught mid-write
        messages = traj.get("messages") if isinstance(traj, dict) else None
        errors: list[str] = []
        for msg in messages if isinstance(messages, list) else []:
            extra = msg.get("extra") if isinstance(msg, dict) else None
            if not isinstance(extra, dict):
                continue
            response = extra.get("response")
            if msg.get("role") == "exit" and extra.get("exit_status") not in ENDED:
                errors.append(f"{extra.get('exit_status')}: {extra.get('exception_str') or msg.get('content')}")
            if not isinstance(response, dict):  # a call that failed, or no call at all
                continue
            usage = response.get("usage") or {}
            choices = response.get("choices") or [{}]
            calls = (choices[0].get("message") or {}).get("tool_calls") or []
            n = usage.get("completion_tokens") if isinstance(usage, dict) else None
            out.add_step(n if isinstance(n, int) else None, tuple(str(c.get("id")) for c in calls))
        settle_errors(out, errors, PYTHON_UNREACHABLE)
        return out
