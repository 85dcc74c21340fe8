"""The harness protocol: how one coding-agent CLI is installed, configured, run and read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from swe_gym_env.wire import Turn

AGENT_HOME = "/home/agent"
AGENT_MOUNT = "/opt/agents"


class AgentError(RuntimeError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class AgentOutcome:
    """What the agent's own event stream says happened."""

    model_calls: int = 0
    error_kind: str | None = None  # endpoint_unreachable | agent_crashed | no_model_calls | timeout
    error: str | None = None
    completion_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class AgentConfig:
    base_url: str  # the capture proxy as the sandbox reaches it, without /v1
    model: str
    context_window: int
    max_tokens: int


def cross_check(outcome: AgentOutcome, turns: list[Turn], budget_replies: int) -> tuple[str, str]:
    """Reconcile the agent's own trace with the capture: ("match" | "mismatch" | "none", detail)."""
    if outcome.model_calls == 0 and not outcome.completion_tokens and outcome.error_kind is None:
        return "none", "the agent left no trace of model calls"
    expected = outcome.model_calls - budget_replies
    if expected != len(turns):
        return "mismatch", (
            f"the agent reports {outcome.model_calls} model calls ({budget_replies} budget replies), "
            f"the capture holds {len(turns)} turns"
        )
    reported = outcome.completion_tokens[: len(turns)]
    for i, (n, turn) in enumerate(zip(reported, turns, strict=False)):
        if n != len(turn.completion_token_ids):
            return "mismatch", (
                f"call {i}: the agent reports {n} completion tokens, the capture holds {len(turn.completion_token_ids)}"
            )
    return "match", f"{len(turns)} calls, completion token counts agree"


class Harness(Protocol):
    name: ClassVar[str]
    version: ClassVar[str]

    def install_dir(self) -> Path: ...

    def ensure_installed(self, log=print) -> Path: ...

    def mounts(self) -> dict[str, str]: ...

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]: ...

    events_path: str
    log_path: str

    def command(self, cfg: AgentConfig) -> str: ...

    def parse_events(self, text: str) -> AgentOutcome: ...
