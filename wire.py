"""Wire models: everything that crosses a process boundary (MCP tool arguments and results, client payloads).

This module imports nothing but pydantic and the stdlib-only name list `swe_gym_env.names`, so `swe_gym_env.client`
can use it without the server's dependencies.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from swe_gym_env.names import HARNESSES, SANDBOXES

Phase = Literal["validate", "task", "session", "install", "boot", "agent", "diff", "grade", "done"]
# Built from the one list of names (a Literal built at run time: static checkers see these as unknown)
Harness: TypeAlias = Literal[*HARNESSES]  # pyright: ignore[reportInvalidTypeForm]
SandboxBackend: TypeAlias = Literal[*SANDBOXES]  # pyright: ignore[reportInvalidTypeForm]
AUTO_SANDBOX = "auto"  # a request's default: the server resolves it to the first backend usable there
# Per harness: the options it takes (`RolloutRequest.harness_options`) and their allowed values.
HARNESS_OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "pi": {"api": ("openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai")},
}


class RolloutRequest(BaseModel):
    """Arguments of the `run_rollout` tool."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{8,64}$",
        description="Idempotency key: the same id returns the same rollout (attach if running, result if done).",
    )
    instance_id: str | None = Field(default=None, description="Task instance id; default: the first task of the split.")
    split: str = Field(default="bundled", description="Catalog split to pick the task from.")
    index: int | None = Field(default=None, ge=0, description="Task index within the split (instead of instance_id).")
    purpose: Literal["eval", "train"] = Field(
        default="eval", description="`train` refuses engines that do not return token ids with processed logprobs."
    )
    harness: Harness = "pi"
    harness_options: dict[str, str] = Field(
        default={},
        max_length=8,
        description="Options of the harness, e.g. pi's {'api': 'anthropic-messages'}: the API dialect it speaks to "
        "/capture (openai-completions, openai-responses, anthropic-messages, google-generative-ai).",
    )
    sandbox: SandboxBackend | Literal["auto"] = Field(
        default=AUTO_SANDBOX,
        description="Sandbox backend; `auto`: the server's default, the first backend usable there (in the order "
        "local, landlock, docker, hf, …; /health and `info` say which, from a real probe).",
    )
    mode: Literal["capture", "black_box"] = Field(
        default="capture",
        description="capture: model calls go through /capture and are recorded (trainable); black_box: forwarded "
        "to the engine unchanged, nothing recorded (eval only, no token data, capture_level text).",
    )
    engine: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Server-side engine name.")
    max_model_calls: int = Field(default=30, ge=1, le=500)
    max_tokens: int = Field(default=1024, ge=1, le=32768, description="Completion-token cap per model call.")
    engine_url: str | None = Field(
        default=None,
        pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?$",
        max_length=500,
        description="An OpenAI-compatible base URL (…/v1) instead of a named engine; only where the server allows "
        "it (URL prefixes in SWE_GYM_ENGINE_URL_ALLOWLIST). No key can be given here: keys live server-side.",
    )
    engine_model: str | None = Field(default=None, max_length=200, description="Served model name at engine_url.")
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0, description="Sampling overrides, forced on every call."
    )
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    deadline_s: float = Field(default=600.0, gt=0, le=4 * 3600, description="Whole-call deadline, boot to grading.")

    @model_validator(mode="after")
    def _known_harness_options(self) -> RolloutRequest:
        known = HARNESS_OPTIONS.get(self.harness, {})
        for key, value in self.harness_options.items():
            if key not in known:
                raise ValueError(f"harness {self.harness!r} has no option {key!r} (it has: {sorted(known) or 'none'})")
            if value not in known[key]:
                raise ValueError(f"{self.harness} option {key}={value!r} is not one of {list(known[key])}")
        return self


class Turn(BaseModel):
    """One model call as the engine saw it: the exact ids the trainer must use."""

    index: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float] = Field(description="Logprob of each sampled completion token, aligned with its ids.")
    finish_reason: str | None
    streamed: bool = Field(description="Whether the agent asked for a streamed reply.")
    wall_s: float
    request: dict = Field(description="The request as forwarded upstream (messages, tools, sampling).")
    response_message: dict = Field(description="The assistant message returned to the agent.")
    dialect: str = Field(
        default="openai-chat",
        description="The API dialect the agent spoke (openai-chat, openai-responses, anthropic-messages, gemini); "
        "`request` is the chat-completions request it was translated into, as the engine got it.",
    )
    parent: int | None = Field(
        default=None, description="Rollout graph: the call whose whole prompt this prompt holds (None: a root)."
    )
    relation: Literal["root", "extends", "drift"] = Field(
        default="root",
        description="extends: the prompt holds the parent's prompt + completion exactly; drift: the parent's "
        "completion re-tokenised differently.",
    )
    retry_of: int | None = Field(
        default=None, description="An earlier call with exactly this prompt (a retry or resample)."
    )
    role: Literal["agent", "aux"] = Field(
        default="agent", description="aux: a call outside the agent's own conversations."
    )
    discarded: bool = Field(
        default=False, description="Abandoned (retried, or never used by the agent): kept visible, never trained on."
    )


def count_roots(turns: list[Turn]) -> int:
    """Conversations in the rollout graph: calls that continue none before them (the one count of roots)."""
    return sum(1 for t in turns if t.parent is None)


class SequenceRef(BaseModel):
    """A training sequence of the rollout graph: calls in order, each extending the previous one exactly."""

    turns: list[int] = Field(description="Turn indices, in order.")
    role: Literal["agent", "aux"] = "agent"
    discarded: bool = Field(default=False, description="An abandoned branch: never trained on.")


class Finding(BaseModel):
    """Something validation noticed. A `fatal` finding makes the rollout unusable (ok=false)."""

    severity: Literal["info", "warning", "fatal"]
    code: str
    message: str
    turn: int | None = None

    def __str__(self) -> str:
        return f"[{self.severity} {self.code}] {self.message}"


def _findings(value: object) -> object:
    """Plain strings are accepted as info findings."""
    if isinstance(value, list):
        return [{"severity": "info", "code": "note", "message": v} if isinstance(v, str) else v for v in value]
    return value


class TestReport(BaseModel):
    resolution: str
    fail_to_pass: dict[str, list[str]]
    pass_to_pass: dict[str, list[str]]
    log_tail: str = ""
    graded_by: Literal["eval_script", "install_config", "repo_parser", "pytest"] = Field(
        "pytest",
        description="eval_script: the row's own SWE-bench eval script (swebench make_test_spec); install_config: "
        "the row's SWE-rebench install_config (its env, test_cmd, parser); repo_parser: the test command with the "
        "parser swebench maps to the repo; pytest: pytest -rA and swebench's pytest parser.",
    )
    parser: str = Field("parse_log_pytest", description="The swebench log parser that read the test output.")
    junit_cross_check: Literal["match", "mismatch", "not_pytest", "ids_rewritten"] | None = Field(
        None,
        description="The parser's verdict per FAIL_TO_PASS/PASS_TO_PASS test against pytest's JUnit report: match, "
        "mismatch (JUnit passes a test the parser does not; a test the log passes that JUnit does not is a grading "
        "error, never a result); not_pytest: another runner, graded by its swebench parser alone; ids_rewritten: "
        "pytest, but the parser rewrites test ids (no per-test comparison).",
    )
    environment: str = Field("", description="Where the tests ran: the image's env, a local task venv, or the host's.")
    integrity: str = Field(
        "clean",
        max_length=2000,
        description="What the grader saw the code under test do to the test run: `clean`; `tampered: <what>` "
        "(reporting rewritten, a forged log or JUnit report, a replaced reporter, a foreign hook: reward 0.0); "
        "`patch_broke_run: <how>` (the run timed out, died or left no results where the empty patch's did not: "
        "reward 0.0). See the grading module's threat model.",
    )


class RolloutResult(BaseModel):
    rollout_id: str
    ok: bool
    error: str | None = None
    phase: Phase = "done"
    reward: float | None = Field(default=None, description="None when grading did not run; never confused with 0.0.")
    instance_id: str | None = None
    harness: str
    sandbox: str
    stop_reason: str | None = None
    turns: list[Turn] = []
    model_patch: str | None = None
    grading: TestReport | None = None
    timings: dict[str, float] = {}
    wall_s: float = 0.0
    agent_exit_code: int | None = None
    agent_log_tail: str = ""
    sequences: list[SequenceRef] = Field(
        default=[], description="The rollout graph's training sequences (the only source of training rows)."
    )
    cross_check: Literal["match", "mismatch", "none"] | None = Field(
        default=None,
        description="The agent's own event stream vs the capture, call by call; none: the agent left no trace.",
    )
    cross_check_detail: str = ""
    capture_level: str | None = Field(default=None, description="tokens | logprobs | text, from engine certification.")
    logprobs_mode: str | None = Field(default=None, description="processed | raw | placeholder | unknown.")
    capture_session_id: str | None = Field(default=None, description="The capture session (readable after a restart).")
    findings: Annotated[list[Finding], BeforeValidator(_findings)] = []

    @property
    def roots(self) -> int:
        return count_roots(self.turns)


def failed_result(
    req: RolloutRequest, error: str, phase: Phase = "validate", rollout_id: str | None = None, **fields
) -> RolloutResult:
    """A failed result for a request (reward None): client side, or before or during the pipeline."""
    fields.setdefault("instance_id", req.instance_id)
    return RolloutResult(
        rollout_id=rollout_id or req.rollout_id or "",
        ok=False,
        error=error,
        phase=phase,
        harness=req.harness,
        sandbox=req.sandbox,
        **fields,
    )


class RolloutSummary(BaseModel):
    """A rollout in a listing: in flight or finished."""

    rollout_id: str
    instance_id: str | None
    harness: str
    sandbox: str
    phase: Phase
    state: Literal["queued", "running", "finished"]
    ok: bool | None = None
    reward: float | None = None
    turns: int = 0
    roots: int = Field(
        default=0, description="Conversations in the rollout graph (the agent's, subagents', auxiliary)."
    )
    error: str | None = None
    seconds_since_last_call: float | None = None
    seconds_in_phase: float | None = Field(
        default=None, description="How long the rollout has been in its phase: booting vs an agent that is not calling."
    )
    capture_session_id: str | None = None

    @classmethod
    def of_result(cls, r: RolloutResult) -> RolloutSummary:
        return cls(
            rollout_id=r.rollout_id,
            instance_id=r.instance_id,
            harness=r.harness,
            sandbox=r.sandbox,
            phase=r.phase,
            state="finished",
            ok=r.ok,
            reward=r.reward,
            turns=len(r.turns),
            roots=r.roots,
            error=r.error,
            capture_session_id=r.capture_session_id,
        )


class RolloutStatus(BaseModel):
    """`get_rollout`: the live summary, plus the full result once finished."""

    rollout_id: str
    state: Literal["queued", "running", "finished"]
    summary: RolloutSummary
    result: RolloutResult | None = None


class RolloutList(BaseModel):
    rollouts: list[RolloutSummary]


class TaskView(BaseModel):
    """What clients may see of a task: never the gold patch or the test patch."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    hints_text: str = ""
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    image: str | None = None
    workdir: str
    dataset: str


class TaskPage(BaseModel):
    split: str
    total: int
    offset: int
    tasks: list[TaskView]


class Capabilities(BaseModel):
    version: str
    harnesses: list[str]
    sandboxes: list[str]
    engines: list[str]
    splits: list[str]
    limits: dict[str, int]
    dialects: list[str] = Field(default=[], description="The API dialects /capture speaks.")
    harness_info: dict[str, dict[str, str | bool]] = Field(
        default={}, description="Per harness: its pinned version, the dialect it speaks and whether it is ready here."
    )


class TrainingRow(BaseModel):
    """One training sequence: a chain of turns where each prompt extends the previous prompt + completion."""

    rollout_id: str
    instance_id: str | None
    reward: float
    input_ids: list[int]
    loss_mask: list[int] = Field(description="1 on sampled tokens, 0 on prompt / tool-result tokens.")
    logprobs: list[float] = Field(description="The engine's logprob per input token (0.0 where loss_mask is 0).")
    turn_indices: list[int]
    role: Literal["agent", "aux"] = Field(default="agent", description="aux: outside the agent's own conversations.")


class CaptureSessionCreate(BaseModel):
    """Admin API body for minting a capture session (`POST /capture/sessions`). The key comes back once."""

    model_config = ConfigDict(extra="forbid")

    engine_url: str = Field(pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?$", max_length=500)
    served_model: str = Field(max_length=200)
    engine_api_key: str | None = Field(default=None, max_length=4096, description="Held server-side; never returned.")
    engine_headers: dict[str, str] = Field(default_factory=dict, max_length=16)
    max_calls: int = Field(default=30, ge=1, le=10_000)
    max_tokens: int = Field(default=1024, ge=1, le=131_072)
    call_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    sampling: dict[str, float | int] = Field(default_factory=dict, max_length=8)
    passthrough: bool = False
    labels: dict[str, str] = Field(default_factory=dict, max_length=16)
