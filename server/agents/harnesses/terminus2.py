"""Terminus-2 (the `terminus-2` agent of Harbor, PyPI `harbor`), its own agent loop run in the sandbox on its bundle's
Python 3.13, driving a tmux session there with the tmux its bundle brings.

Harbor runs this loop outside the task's container and drives tmux inside it through its environment's `exec`. Here
the loop runs where every other harness runs, in the sandbox: our launcher (`LAUNCHER`) builds harbor's own
`Terminus2` agent and hands it an environment of ours whose `exec` runs each command right there (`sh -c`), so
harbor's `TmuxSession` starts `tmux new-session ... 'bash --login'` in the sandbox and types the model's keystrokes
into it with `tmux send-keys`, exactly as it would in a container; `harbor run` (jobs, trials, verifiers, Docker) is
never used. The reply format is Terminus-2's own: no tool calls, a JSON object (`analysis`, `plan`, `commands` of
`keystrokes` + `duration`, `task_complete`), or its XML form with the harness option `parser: xml`; a first
`task_complete` is asked to be confirmed by a second one.

Its bundle: Debian trixie's CPython 3.13 (`pyagent.DebianPythonAgent`, as OpenHands', Kimi CLI's, Mistral Vibe's),
`PINS` (pip's resolution of `harbor==0.26.0` for CPython 3.13, binary wheels), and trixie's `tmux` 3.5a with the
libraries it loads, run by the bundle's own loader through `bin/tmux` (a script: panes and the agent's commands use
the image's libraries, never the bundle's). tmux needs a pty for its pane: it makes one itself (`/dev/ptmx`), so it
runs where a command can (`local`, `docker`, the remote backends); `landlock` cannot make one and tmux cannot take the
pairs that sandbox hands over (its server opens its own), so a rollout there is refused at `validate`
(`needs_own_pty`).

Model: litellm (harbor's `LiteLLM`) as `openai/<model>` with `api_base` = the capture's `/v1`; the key from the 0600
env file, taken out of the launcher's environment before tmux starts (the pane's shell never sees it) and handed to
litellm in memory; `model_info` registers the rollout's context window and output limit (harbor's summarization reads
them), `max_tokens` each call. Nothing else is called: litellm's cost map from the package
(`LITELLM_LOCAL_MODEL_COST_MAP`), its tokenizer from the package, no telemetry; no asciinema recording (harbor would
install it), no skills, no MCP servers. tmux's systemd scope request (a D-Bus call) has no bus to reach: the session
bus variables are unset.

Limits: `max_turns` (one model call per turn) is the rollout's budget plus one, the call the proxy answers with its
budget reply (not JSON: Terminus-2 answers it with a parse-error prompt, and the limit ends the loop). Its context
summarization stays on (harbor's default: when fewer than 8,000 tokens are free, three calls of its own, recorded in
their own trajectory files).

Its record: its ATIF trajectory files under its logs folder (`LOGS/trajectory.json`, and
`trajectory.summarization-<n>-{summary,questions,answers}.json` per summarization), copied while it runs, read back:
each agent step with metrics is one model call with its `completion_tokens`; a system step's subagent references put
the summarization calls in their place. Terminus-2 has no tool-call ids (its commands are parsed from text), so the
cross-check compares the calls' completion token counts in order.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.base import PYTHON_UNREACHABLE
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.base import AgentError
from swe_gym_env.server.agents.base import AgentOutcome
from swe_gym_env.server.agents.base import NpmArtifact
from swe_gym_env.server.agents.base import as_dict
from swe_gym_env.server.agents.base import as_list
from swe_gym_env.server.agents.base import run_and_collect
from swe_gym_env.server.agents.base import settle_errors
from swe_gym_env.server.agents.pyagent import AUDIT
from swe_gym_env.server.agents.pyagent import LITELLM_QUIET
from swe_gym_env.server.agents.pyagent import DebianPythonAgent

PY = pyruntime.TRIXIE_PYTHON.version
LOGS = f"{AGENT_HOME}/terminus-2-logs"
CONFIG = f"{AGENT_HOME}/terminus-2-config.json"
LAUNCH = f"{AGENT_HOME}/terminus-2-launch.py"
EVENTS = f"{AGENT_HOME}/terminus-2-events.json"
LOG = f"{AGENT_HOME}/terminus-2-log.txt"
NET = f"{AGENT_HOME}/terminus-2-net.jsonl"
EXIT = "swe-gym-exit.json"  # the launcher's last word, in LOGS beside the trajectories
TMUX = "libexec/tmux"  # the binary in the bundle; `bin/tmux` runs it on the bundle's loader
# trixie's tmux and what it loads beyond the runtime's packages (`apt-cache depends tmux`)
TMUX_PACKAGES = ("tmux", "libevent-core-2.1-7t64", "libjemalloc2", "libsystemd0", "libcap2")
DEBIAN = pyruntime.DebianPython(PY, "trixie", (*pyruntime.TRIXIE_PYTHON.packages, *TMUX_PACKAGES), name="trixie-tmux")

# pip's resolution of harbor==0.26.0 for CPython 3.13 (2026-12), binary wheels: installed with --no-deps
PINS: tuple[str, ...] = tuple(
    """Authlib==1.9.10 Jinja2==3.1.6 MarkupSafe==3.0.4 PyJWT==2.15.1 PyYAML==6.0.4 Pygments==2.21.0 aiofile==3.12.3
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0
    anyio==4.16.0 attrs==26.1.0 beartype==0.23.1 boto3==1.44.18 botocore==1.44.18 cachetools==8.0.3 caio==0.12.10
    certifi==2026.10.19.post1 cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 cryptography==51.0.1
    cyclopts==5.5.2 deprecation==2.1.0 dirhash==0.5.0 dnspython==2.9.2 docstring_parser==0.18.0
    email-validator==2.4.0 exceptiongroup==1.3.2 fastapi==0.165.0 fastmcp-slim==4.2.3 fastmcp==4.2.3
    fastuuid==0.14.0 filelock==4.3.2 frozenlist==1.8.0 fsspec==2026.9.0 griffelib==2.4.1 h11==0.16.0 h2==4.4.1
    harbor==0.26.0 hf-xet==1.8.0 hpack==4.2.0 httpcore2==2.17.0 httpcore==1.0.9 httpx2==2.17.0 httpx==0.28.1
    huggingface_hub==2.4.0 hyperframe==6.1.0 idna==3.21 importlib_metadata==8.9.0 jiter==0.19.0 jmespath==1.1.0
    joserfc==1.8.0 jsonref==1.1.0 jsonschema-path==0.5.0 jsonschema-specifications==2025.9.1 jsonschema==4.26.0
    litellm==1.110.2 markdown-it-py==4.3.0 mcp-types==2.3.0 mcp==2.3.0 mdurl==0.1.2 multidict==7.2.1
    openai==3.63.0 openapi-pydantic==0.6.0 opentelemetry-api==1.45.3 packaging==26.4 pathable==0.6.0
    pathspec==1.1.1 platformdirs==4.14.9 postgrest==2.34.1 propcache==0.5.4 py-key-value-aio==0.5.0
    pycparser==3.12 pydantic-settings==2.16.3 pydantic==2.14.4 pydantic_core==2.50.5 pyperclip==1.11.0
    python-dateutil==2.9.0.post0 python-dotenv==1.2.4 python-multipart==0.0.34 realtime==2.34.1
    referencing==0.37.0 regex==2026.12.2 requests==2.34.2 rich-rst==2.2.0 rich==15.0.0 rpds-py==2026.9.1
    s3transfer==0.19.3 scantree==0.0.4 semver==3.2.0 shellingham==1.5.4 shortuuid==1.0.13 six==1.17.0
    sniffio==1.3.1 sse-starlette==3.7.1 starlette==1.10.0 storage3==2.34.1 supabase-auth==2.34.1
    supabase-functions==2.34.1 supabase==2.34.1 tenacity==9.2.1 tiktoken==0.14.0 tokenizers==0.23.3
    toml==0.10.2 tqdm==4.70.1 truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0
    uncalled-for==0.6.2 urllib3==2.8.0 uvicorn==0.55.0 watchfiles==1.3.0 websockets==15.0.1 yarl==1.25.1
    zipp==4.1.2""".split()
)
# Builds harbor's Terminus2 with an environment of ours (commands run here, in the sandbox) and runs its loop; paths
# come from the command line, never from file contents (landlock maps /home/agent only there).
LAUNCHER = (
    AUDIT
    + """import asyncio, subprocess
conf_path, logs_dir = sys.argv[1:3]
with open(conf_path) as f:
    conf = json.load(f)
key = os.environ.pop("OPENAI_API_KEY", "")  # tmux's server copies this environment into the pane: never the key
for name in ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "TMUX", "TMUX_PANE"):
    os.environ.pop(name, None)  # no bus for tmux's systemd scope request; no outer tmux
os.makedirs(logs_dir, exist_ok=True)
def finish(status, error=None):
    with open(os.path.join(logs_dir, "swe-gym-exit.json"), "w") as f:
        json.dump({"swe_gym_exit": status, "error": error}, f)
try:
    from pathlib import Path, PurePosixPath
    from harbor.agents.terminus_2 import terminus_2 as t2
    from harbor.environments.base import ExecResult
    from harbor.models.agent.context import AgentContext
    import litellm
    litellm.api_key = key  # its providers' key, in memory only (llm_kwargs would go into its trajectory)
    t2.EnvironmentPaths.agent_dir = PurePosixPath(logs_dir)  # its pane log (`pipe-pane`) beside its trajectories

    async def tmux_or_fail(self):
        # instead of its install of tmux when `tmux -V` fails (apt-get, dnf, ..., or a build from a download): the
        # bundle brings tmux; where it cannot run, the rollout fails here, with nothing fetched
        r = await self.environment.exec(command="tmux -V")
        if r.return_code != 0:
            raise RuntimeError(f"the bundle's tmux does not run here: {(r.stderr or r.stdout or '').strip()[:500]}")
    t2.TmuxSession._attempt_tmux_installation = tmux_or_fail
    # a reply cut at max_tokens never reaches its trajectory (harbor asks again, with its "ERROR!! NONE of the
    # actions" prompt, and records only the answer): each one is noted here, before the step it precedes
    from harbor.llms import lite_llm
    truncated = []
    _call = lite_llm.LiteLLM.call
    async def noted_call(self, *args, **kwargs):
        try:
            return await _call(self, *args, **kwargs)
        except lite_llm.OutputLengthExceededError:
            truncated.append(len(agent._trajectory_steps))
            with open(os.path.join(logs_dir, "swe-gym-truncated.json"), "w") as f:
                json.dump({"swe_gym_truncated_before_step": truncated}, f)
            raise
    lite_llm.LiteLLM.call = noted_call

    class Here:
        \"\"\"What harbor's TmuxSession asks of an environment: run a command (here, in the sandbox).\"\"\"
        session_id = "swe-gym"
        default_user = None

        async def exec(self, command, user=None, timeout_sec=None, env=None, cwd=None, **_):
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, **(env or {})})
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return ExecResult(stdout="", stderr=f"timed out after {timeout_sec} s", return_code=124)
            return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                              return_code=proc.returncode)

    agent = t2.Terminus2(
        logs_dir=Path(logs_dir), model_name=conf["model"], api_base=conf["api_base"], parser_name=conf["parser"],
        max_turns=conf["max_turns"], suppress_max_turns_warning=True, record_terminal_session=False,
        model_info=conf["model_info"],
        llm_call_kwargs={"max_tokens": conf["max_tokens"]})

    async def main():
        env = Here()
        try:
            await agent.setup(env)
            await agent.run(conf["task"], env, AgentContext())
        finally:
            await env.exec("tmux kill-server")
    asyncio.run(main())
    finish("done")
except BaseException as e:
    finish("exception", f"{type(e).__name__}: {e}"[:2000])
    raise
"""
)
# `bin/tmux`: the bundle's tmux on the bundle's loader and libraries (its panes' shells: the image's), found from its
# own path (`$0`: the bundle is not at BUNDLE_MOUNT everywhere, e.g. landlock maps it where it is)
TMUX_WRAPPER = (
    "#!/bin/sh\n"
    'b="${0%/bin/tmux}"\n'
    f'exec "$b/{pyruntime.RUNTIME}/lib/{pyruntime.LOADER}" --library-path "$b/{pyruntime.RUNTIME}/lib" '
    f'"$b/{TMUX}" "$@"\n'
)
PARSERS = ("json", "xml")  # harness option `parser`: Terminus-2's two reply formats
# harness option `api`: how its litellm speaks to /capture -> (the capture dialect, litellm's provider, base suffix).
# Not its Responses mode: it chains calls by `previous_response_id` (state kept by the server), which /capture does
# not keep (measured: refused at the second call)
APIS = {
    "openai": ("openai-chat", "openai", "/v1"),
    "anthropic": ("anthropic-messages", "anthropic", ""),
}


class Terminus2Harness(DebianPythonAgent):
    name: ClassVar[str] = "terminus-2"
    version: ClassVar[str] = "0.26.0"  # harbor
    # its first prompt is short (its template + the task: measured below 2k tokens on the bundled tasks), but harbor
    # summarizes its context (three calls of its own) whenever fewer than 8,000 tokens are free, and each call may
    # take max_tokens more: below 16,384 it would summarize at once
    min_context_tokens: ClassVar[int] = 16384
    package: ClassVar[str] = "harbor"
    needs_pty: ClassVar[bool] = True  # tmux's pane is a pty its server makes itself (`/dev/ptmx`)
    # pairs opened for it are no use (tmux opens its own), and its client and server talk over a unix socket: not on
    # landlock (no /dev/ptmx, TCP sockets only), refused there at validate
    takes_given_ptys: ClassVar[bool] = False
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = ()
    debian: ClassVar[pyruntime.DebianPython] = DEBIAN
    pins: ClassVar[tuple[str, ...]] = PINS
    imports: ClassVar[str] = "ssl, sqlite3, pydantic_core, litellm, harbor.agents.terminus_2.terminus_2"
    bundle_inputs: ClassVar[tuple[str, ...]] = (*DEBIAN.recipe(), *PINS, TMUX_WRAPPER)
    bundle_probe: ClassVar[str] = (
        f"{pyruntime.python_command('.', PY)} -c 'import ssl, pydantic_core' && "
        f"{pyruntime.RUNTIME}/lib/{pyruntime.LOADER} --library-path {pyruntime.RUNTIME}/lib {TMUX} -V"
    )
    launcher, launch_path, config_path, net_path, quiet = LAUNCHER, LAUNCH, CONFIG, NET, LITELLM_QUIET
    # what litellm's openai provider would take over ours
    unset: ClassVar[tuple[str, ...]] = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    events_path = EVENTS
    log_path = LOG

    def add_binaries(self, root: Path, unpacked: Path, log=print) -> tuple[Path, ...]:
        src = unpacked / "usr" / "bin" / "tmux"
        if not src.is_file():
            raise AgentError("install", f"Debian trixie's tmux package holds no {src}")
        dest = root / TMUX
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        dest.chmod(0o755)
        wrapper = root / "bin" / "tmux"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(TMUX_WRAPPER)
        wrapper.chmod(0o755)
        log(f"tmux from Debian trixie ({', '.join(v for v in self.debian.versions(unpacked) if 'tmux' in v)})")
        return (dest,)

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        root = self.finished_install()
        return {**super().bundle_contents(artifacts), TMUX: root / TMUX, "bin/tmux": root / "bin" / "tmux"}

    def config(self, cfg: AgentConfig, prompt: str) -> dict:
        api = cfg.options.get("api", "openai")
        _, provider, suffix = APIS[api]
        return {
            "model": f"{provider}/{cfg.model}",
            "api_base": cfg.base_url.rstrip("/") + suffix,
            "parser": cfg.options.get("parser", "json"),
            # the budget, plus the one call the proxy answers with its budget reply (0: its own default, no limit)
            "max_turns": cfg.max_calls + 1 if cfg.max_calls > 0 else None,
            "max_tokens": int(cfg.max_tokens),
            "model_info": {
                "max_input_tokens": int(cfg.context_window),
                "max_output_tokens": int(cfg.max_tokens),
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                "litellm_provider": provider,
                "mode": "chat",
            },
            "task": prompt,
        }

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        return json.dumps(self.config(cfg, prompt), indent=2).encode()

    def launch_args(self, cfg: AgentConfig) -> str:
        return f"{CONFIG} {LOGS}"

    def environment(self) -> str:
        # tmux's socket folder (`tmux-<uid>/`) in the agent's home, not /tmp (landlock grants it no write)
        return super().environment() + f"export PATH={BUNDLE_MOUNT}/bin:$PATH TMUX_TMPDIR={AGENT_HOME}\n"

    def command(self, cfg: AgentConfig) -> str:
        run = f"{pyruntime.python_command(BUNDLE_MOUNT, PY)} {LAUNCH} {CONFIG} {LOGS} < /dev/null > {LOG} 2>&1"
        return self.environment() + run_and_collect(run, f"{LOGS}/*.json", EVENTS)

    def parse_events(self, text: str) -> AgentOutcome:
        docs = _documents(text)
        out = AgentOutcome()
        errors: list[str] = []
        subs = {d.get("session_id"): d for d in docs if "-summarization-" in str(as_dict(d.get("agent")).get("name"))}
        main = next((d for d in docs if as_dict(d.get("agent")).get("name") == "terminus-2"), None)
        cut = sorted(i for d in docs for i in as_list(d.get("swe_gym_truncated_before_step")) if isinstance(i, int))
        for i, step in enumerate(as_list(main.get("steps")) if main else []):
            step = as_dict(step)
            while cut and cut[0] <= i and step.get("source") == "agent":  # a reply cut at max_tokens, asked again
                out.add_step(None)
                cut.pop(0)
            if step.get("source") == "system":  # a summarization: its subagents' calls, in order
                for result in as_list(as_dict(step.get("observation")).get("results")):
                    for ref in as_list(as_dict(result).get("subagent_trajectory_ref")):
                        sub = subs.get(as_dict(ref).get("session_id"))
                        for s in as_list(sub.get("steps")) if sub else []:
                            _add_call(out, as_dict(s))
            else:
                _add_call(out, step)
        for d in docs:
            if d.get("swe_gym_exit") not in (None, "done"):
                errors.append(str(d.get("error") or d.get("swe_gym_exit")))
        settle_errors(out, errors, PYTHON_UNREACHABLE)
        return out


def _add_call(out: AgentOutcome, step: dict) -> None:
    """One model call where ``step`` is an agent step that carries its own metrics (not copied context)."""
    metrics = as_dict(step.get("metrics"))
    if step.get("source") != "agent" or step.get("is_copied_context") or not metrics:
        return
    n = metrics.get("completion_tokens")
    out.add_step(n if isinstance(n, int) else None)


def _documents(text: str) -> list[dict]:
    """The JSON objects of ``text``, one after another (its trajectory files, concatenated); a cut-off last one and
    anything that is not an object are skipped."""
    decoder, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        try:
            doc, i = decoder.raw_decode(text, i)
        except ValueError:
            return docs
        if isinstance(doc, dict):
            docs.append(doc)
