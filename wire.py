"""Wire models: everything that crosses a process boundary (MCP tool arguments and results, client payloads).

This module imports nothing but pydantic, so `swe_gym_env.client` can use it without the server's dependencies.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Phase = Literal["validate", "task", "session", "install", "boot", "agent", "diff", "grade", "done"]
Harness = Literal["pi"]
SandboxBackend = Literal["local"]


class RolloutRequest(BaseModel):
    """Arguments of the `run_rollout` tool."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str | None = Field(None, description="Task instance id; default: the first bundled task.")
    split: str = Field("bundled", description="Catalog split to pick the task from.")
    index: int | None = Field(None, ge=0, description="Task index within the split (instead of instance_id).")
    harness: Harness = "pi"
    sandbox: SandboxBackend = "local"
    engine: str = Field("default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Server-side engine name.")
    max_model_calls: int = Field(30, ge=1, le=500)
    max_tokens: int = Field(1024, ge=1, le=32768, description="Completion-token cap per model call.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    deadline_s: float = Field(600.0, gt=0, le=4 * 3600, description="Whole-call deadline, boot to grading.")


class TokenLogprob(BaseModel):
    token_id: int
    logprob: float


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


class TestReport(BaseModel):
    resolution: str
    fail_to_pass: dict[str, list[str]]
    pass_to_pass: dict[str, list[str]]
    log_tail: str = ""


class RolloutResult(BaseModel):
    rollout_id: str
    ok: bool
    error: str | None = None
    phase: Phase = "done"
    reward: float | None = Field(None, description="None when grading did not run; never confused with 0.0.")
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
    findings: list[str] = []
