"""The harness protocol: how one coding-agent CLI is installed, configured, run and read back."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Protocol, TypeVar

from swe_gym_env.wire import Turn

AGENT_HOME = "/home/agent"
BUNDLE_MOUNT = "/opt/swe-gym-agent"  # where the harness's bundle (server/agents/bundle.py) is, in every sandbox
KEY_FILE = f"{AGENT_HOME}/.capture.env"  # the capture key (and the agent's other secrets): `NAME=value` lines, 0600
LOAD_KEY = f"set -a; . {KEY_FILE}; set +a\n"  # a command's line that exports them: the key never goes into argv
PROMPT_FILE = f"{AGENT_HOME}/prompt.txt"


class AgentError(RuntimeError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class AgentStep:
    """One model call the agent used, as its own events report it."""

    completion_tokens: int | None = None
    tool_call_ids: tuple[str, ...] = ()
    content: str | None = None  # the reply's text as the agent logged it (an editor's record: Aider's)
    edited: tuple[str, ...] = ()  # files the agent changed from this reply (each must be named in its text)


@dataclass
class AgentOutcome:
    """What the agent's own event stream says happened."""

    model_calls: int = 0
    error_kind: str | None = None  # endpoint_unreachable | agent_crashed | no_model_calls | timeout
    error: str | None = None
    completion_tokens: list[int] = field(default_factory=list)
    steps: list[AgentStep] = field(default_factory=list)

    def add_step(
        self,
        completion_tokens: int | None,
        tool_call_ids: tuple[str, ...] = (),
        content: str | None = None,
        edited: tuple[str, ...] = (),
    ) -> None:
        self.model_calls += 1
        if completion_tokens is not None:
            self.completion_tokens.append(completion_tokens)
        self.steps.append(AgentStep(completion_tokens, tool_call_ids, content, edited))


@dataclass(frozen=True)
class AgentConfig:
    base_url: str  # the capture proxy as the sandbox reaches it, without /v1
    model: str
    context_window: int
    max_tokens: int
    options: Mapping[str, str] = field(default_factory=dict)  # the rollout's harness_options (checked in wire)
    max_calls: int = 0  # the rollout's model-call budget (0: not given), for agents with a step limit of their own


Verdict = Literal["match", "mismatch", "none"]


@dataclass(frozen=True)
class Reconciliation:
    verdict: Verdict
    detail: str
    unused: tuple[int, ...] = ()  # captured turns the agent never used (retried, dropped): demoted
    missing: int = 0  # agent steps the capture does not hold: the capture is incomplete


def _steps(outcome: AgentOutcome) -> list[AgentStep]:
    if outcome.steps:
        return list(outcome.steps)
    steps = [AgentStep(n) for n in outcome.completion_tokens]
    return steps + [AgentStep() for _ in range(outcome.model_calls - len(steps))]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]  # as an agent's text log keeps them


def _differs(step: AgentStep, turn: Turn) -> str | None:
    """Why this agent step is not this captured turn (None: they agree as far as the agent reports)."""
    if step.tool_call_ids:
        ids = tuple(c.get("id") for c in turn.response_message.get("tool_calls") or [])
        if ids != step.tool_call_ids:
            return f"the agent ran tool calls {list(step.tool_call_ids)}, the capture answered {list(ids)}"
    if step.completion_tokens is not None and step.completion_tokens != len(turn.completion_token_ids):
        return (
            f"the agent reports {step.completion_tokens} completion tokens, "
            f"the capture holds {len(turn.completion_token_ids)}"
        )
    if step.content is not None or step.edited:  # an editor: its reply's text, and the files it edited from it
        captured = turn.response_message.get("content")
        text = captured if isinstance(captured, str) else ""
        if step.content is not None and _lines(step.content) != _lines(text):
            return "the agent logged a reply whose text is not the captured reply's"
        for path in step.edited:
            if path not in text:
                return f"the agent edited {path} from a reply, the captured reply names no such file"
    return None


def reconcile(outcome: AgentOutcome, turns: list[Turn], budget_replies: int) -> Reconciliation:
    """The agent's own trace against the capture, call by call, in order.

    Each captured turn is matched to the agent's next step (same tool-call ids, same completion token count where
    the agent reports them; for an editor, the same reply text, and the files it edited from it named there). A
    turn no step matches was never used by the agent (a retry, a dropped reply); steps left over after the last turn
    are budget replies (answered by the proxy, never captured) up to their count, and missing from the capture
    beyond it.
    """
    steps = _steps(outcome)
    if not steps and outcome.error_kind is None:
        return Reconciliation("none", "the agent left no trace of model calls")
    j, unused, first = 0, [], None
    for turn in turns:
        why = _differs(steps[j], turn) if j < len(steps) else "the agent reports no step for it"
        if why is None:
            j += 1
            continue
        unused.append(turn.index)
        first = first or f"call {turn.index}: {why}"
    missing = max(0, len(steps) - j - budget_replies)
    if not unused and not missing:
        return Reconciliation("match", f"{len(turns)} calls agree (tool-call ids and completion token counts)")
    counts = (
        f"the agent reports {len(steps)} model calls ({budget_replies} budget replies), "
        f"the capture holds {len(turns)} turns"
    )
    return Reconciliation("mismatch", f"{first}; {counts}" if first else counts, tuple(unused), missing)


def cross_check(outcome: AgentOutcome, turns: list[Turn], budget_replies: int) -> tuple[Verdict, str]:
    """Reconcile the agent's own trace with the capture: ("match" | "mismatch" | "none", detail)."""
    r = reconcile(outcome, turns, budget_replies)
    return r.verdict, r.detail


def npm_install(root: Path, spec: str, entry: Path, extra: tuple[str, ...] = (), log=print) -> None:
    """Install one pinned npm package under ``root`` (once per host); ``entry`` must exist afterwards. A failure
    (no npm, no registry, a bad pin) is an AgentError("install") carrying the end of npm's output."""
    root.mkdir(parents=True, exist_ok=True)
    log(f"installing {spec} with npm into {root}")
    argv = ["npm", "install", "--prefix", str(root), *extra, "--no-audit", "--no-fund", "--loglevel=error", spec]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentError("install", f"`npm install {spec}` failed: {e}") from e
    said = (r.stdout.strip() + "\n" + r.stderr.strip()).strip()
    if r.returncode != 0:
        raise AgentError("install", f"`npm install {spec}` failed (exit {r.returncode}): {said[-600:]}")
    if said:
        log(said.splitlines()[-1])  # "added 183 packages in 12s"
    if not entry.is_file():
        raise AgentError("install", f"npm install finished but {entry} is missing")


@dataclass(frozen=True)
class NpmArtifact:
    """One file taken from a pinned npm package (a registry tarball, checked against its sha512 integrity): what an
    agent bundle (server/agents/bundle.py) takes beyond the harness's own install."""

    package: str
    version: str
    integrity: str  # `npm view <package>@<version> dist.integrity`
    member: str  # the file inside the package tarball

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


class Harness(Protocol):
    """One agent CLI. Its name is its row in `swe_gym_env.core.names.HARNESSES`; what it needs of a sandbox is said by
    class attributes (read them, never probe the class with hasattr)."""

    name: ClassVar[str]
    version: ClassVar[str]  # the pinned release: installs, and space_app/sandbox.Dockerfile's build args
    package: ClassVar[str]  # the package installed at `version` (npm's; PyPI's for mini-swe-agent: `installer`)
    dialect: ClassVar[str]  # the capture dialect it speaks (by default): openai-chat, openai-responses, ...
    needs_node: ClassVar[bool]  # runs on Node (>= 20.6): its bundle carries one, never the image's
    min_context_tokens: ClassVar[int]  # the least engine context it works in: its own prompt + room to act
    needs_pty: ClassVar[bool]  # its terminal tool runs a shell on a pty: on sandboxes with `has_ptys` or `gives_ptys`
    takes_given_ptys: ClassVar[bool]  # pty pairs opened for it will do (`gives_ptys`); else only `has_ptys` sandboxes
    # its bundle (server/agents/bundle.py): what goes in, the image's glibc floor, the boot probe, the JS runtime
    # inside that can check the digest where the image has no sha256sum
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]]
    min_glibc: ClassVar[str]  # the highest GLIBC_ symbol version its binaries need (objdump -T)
    bundle_probe: ClassVar[str]  # run in the bundle's directory at boot: proves the bundle runs in the image
    bundle_verifier: ClassVar[str | None]
    installer: ClassVar[str]  # how its package is installed, in progress lines: "npm install", "pip install"
    # a Python agent's own runtime, what installing it takes (provision.install_refusal): "host" (copied from this
    # machine's Python 3.11), "debian" (Debian's packages, fetched with apt-get); None: not a Python agent
    python_runtime: ClassVar[str | None]
    bundle_inputs: ClassVar[tuple[str, ...]]  # what else the bundle is built from (pins, a runtime): in its recipe

    def install_dir(self) -> Path: ...

    def ensure_installed(self, log=print) -> Path: ...

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        """Bundle-relative path -> host file or tree (artifacts: npm package name -> its fetched file)."""
        ...

    def mounts(self) -> dict[str, str]:
        """{its built bundle's host directory: BUNDLE_MOUNT}; AgentError("install") when it is not built."""
        ...

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]: ...

    events_path: str
    log_path: str

    def command(self, cfg: AgentConfig) -> str: ...

    def parse_events(self, text: str) -> AgentOutcome: ...


# What an agent's record says when its endpoint could not be reached (settle_errors' ``unreachable``), as the
# HTTP clients word it: Python's (httpx, openai, litellm) and JavaScript's (fetch in Node and Bun).
PYTHON_UNREACHABLE = ("connect", "connection", "unreachable", "timed out", "timeout", "name or service")
NODE_UNREACHABLE = ("connect", "econnrefused", "fetch failed", "unable to connect", "timed out", "timeout", "socket")


def settle_errors(
    out: AgentOutcome, errors: list[str], unreachable: tuple[str, ...], what: str = "error(s) in the agent"
) -> None:
    """The outcome's error from the errors an agent's record holds: with no model call made, `endpoint_unreachable`
    when the last one says so (any of the words in ``unreachable``), else `agent_crashed`; after model calls, always
    `agent_crashed`, counting them (``what`` names them)."""
    if errors and out.model_calls == 0:
        low = errors[-1].lower()
        out.error_kind = "endpoint_unreachable" if any(w in low for w in unreachable) else "agent_crashed"
        out.error = errors[-1][:500]
    elif errors:
        out.error_kind = "agent_crashed"
        out.error = f"{len(errors)} {what}: {errors[-1][:400]}"


def key_and_prompt(env: Mapping[str, str], prompt: str) -> dict[str, tuple[bytes, int]]:
    """The two files every agent gets (config_files' entries, mode 0600): ``env`` (the capture key and any other
    secret) as KEY_FILE, which its command exports with LOAD_KEY, and the task's prompt as PROMPT_FILE."""
    return {KEY_FILE: key_file(env), PROMPT_FILE: (prompt.encode(), 0o600)}


def key_file(env: Mapping[str, str]) -> tuple[bytes, int]:
    """KEY_FILE's content and mode: ``env`` as `NAME=value` lines, values shell-quoted (LOAD_KEY sources it)."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()).encode(), 0o600


DEFAULT_MAX_TURNS = 100


def max_turns(cfg: AgentConfig) -> int:
    """The rollout's `max_turns` harness option for CLIs that take a turn limit (at least 1; default 100)."""
    raw = cfg.options.get("max_turns")
    try:
        return max(1, int(raw)) if raw is not None else DEFAULT_MAX_TURNS
    except ValueError:
        return DEFAULT_MAX_TURNS


def as_dict(value: object) -> dict:
    """``value`` if it is a JSON object, else an empty one (an agent's record read defensively)."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


T = TypeVar("T")


def jsonl_objects(text: str) -> Iterator[dict]:
    """The JSON objects of an agent's JSONL events or transcript, one per line; anything else (a partial last line,
    a stray print) is skipped."""
    return jsonl_values(text, dict)


def jsonl_values(text: str, kind: type[T]) -> Iterator[T]:
    """The lines of ``text`` that are JSON values of type ``kind`` (dict, list), parsed; the other lines skipped."""
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, kind):
            yield ev


def run_and_collect(run: str, transcript_glob: str, events: str, every_s: float = 0.5, dump: str | None = None) -> str:
    """Shell that runs the agent (``run``, one line, in the background) and keeps ``events`` a copy of its session
    transcript(s) (``transcript_glob``, unquoted so the shell expands it) while it runs and after it exits, so the
    pipeline reads the agent's own record at a fixed path even when it stops the agent early. Exits with the agent's
    status. ``dump``: a command that prints the record instead (an agent whose record is a database)."""
    copy = f"{dump or f'cat {transcript_glob}'} > {events}.part 2>/dev/null; mv -f {events}.part {events}"
    return (
        f"{run} &\n"
        "agent_pid=$!\n"
        f"while kill -0 $agent_pid 2>/dev/null; do {copy}; sleep {every_s}; done\n"
        "wait $agent_pid; rc=$?\n"
        f"{copy}\n"
        "exit $rc"
    )
