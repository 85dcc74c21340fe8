"""A capture session (one rollout's model calls) and the engine it forwards to."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from swe_gym_env.server.capture.compact import RequestDigests
from swe_gym_env.server.capture.graph import RolloutGraph, Segment
from swe_gym_env.wire import Finding, Turn


@dataclass(frozen=True)
class EngineTarget:
    base_url: str  # ends with /v1
    served_model: str
    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # extra headers, held server-side
    revision: str | None = None  # model revision, when the operator knows it
    chat_template_sha256: str | None = None

    def public(self) -> dict:
        return {
            "base_url": self.base_url,
            "served_model": self.served_model,
            "revision": self.revision,
            "chat_template_sha256": self.chat_template_sha256,
        }


@dataclass
class CaptureSession:
    id: str
    engine: EngineTarget
    max_calls: int
    max_tokens: int
    call_timeout_s: float
    sampling: dict[str, float | int] = field(default_factory=dict)  # forced on every upstream call
    stall_timeout_s: float = 60.0  # a stream that sends nothing for this long ends its call with an error
    max_consecutive_failures: int = 5  # failed calls in a row that stop the session (stop_reason engine_failures)
    passthrough: bool = False  # black-box: forward unchanged, capture nothing (eval only)
    stream_through: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rewrites: Counter = field(default_factory=Counter)
    calls: int = 0  # calls the agent made (budget replies excluded)
    failed: int = 0  # of which failed at the engine or the proxy (they do not count against the budget)
    consecutive_failures: int = 0  # failed calls since the last one that succeeded
    failures: list[tuple[int, str]] = field(default_factory=list)  # (call number, error), for the findings
    demoted: set[int] = field(default_factory=set)  # turns the agent's own record shows it never used
    sequences: list[Segment] = field(default_factory=list)  # set when the session closes
    stop_reason: str | None = None
    budget_replies: int = 0  # final "budget exhausted" replies: seen by the agent, not turns
    closed: bool = False
    created_at: float = field(default_factory=time.time)
    last_call_at: float | None = None
    on_turn: Callable[[Turn], None] | None = None
    graph: RolloutGraph = field(default_factory=RolloutGraph)
    requests: RequestDigests = field(default_factory=RequestDigests)  # per turn: digests its successors compare to
    subscribers: list[asyncio.Queue] = field(default_factory=list)
    pumps: set[asyncio.Task] = field(default_factory=set)  # upstream calls in flight: cancelled when it closes

    def publish(self, event: dict) -> None:
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(event)

    def summary(self) -> dict:
        return {
            "id": self.id,
            "state": "closed" if self.closed else "open",
            "mode": "passthrough" if self.passthrough else "capture",
            "engine": self.engine.public(),
            "labels": self.labels,
            "calls": self.calls,
            "failed_calls": self.failed,
            "turns": len(self.turns),
            "roots": len(self.graph.roots()),
            "budget_replies": self.budget_replies,
            "stop_reason": self.stop_reason,
            "created_at": self.created_at,
            "seconds_since_last_call": round(time.time() - self.last_call_at, 3) if self.last_call_at else None,
            "errors": self.errors[-5:],
        }

    def meta(self) -> dict:
        """What the store keeps about the session (no keys)."""
        return {
            "engine": self.engine.public(),
            "sampling": self.sampling,
            "max_calls": self.max_calls,
            "max_tokens": self.max_tokens,
            "call_timeout_s": self.call_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "max_consecutive_failures": self.max_consecutive_failures,
            "mode": "passthrough" if self.passthrough else "capture",
            "labels": self.labels,
        }

    def fail(self, message: str, code: str | None = None) -> None:
        """A call that failed at the engine or the proxy: it does not count against the budget; enough of them in a
        row stop the session; an engine that stops returning token ids makes the capture unusable."""
        self.errors.append(f"call {self.calls}: {message}")
        self.failed += 1
        self.consecutive_failures += 1
        self.failures.append((self.calls, message))
        if (
            code == "no_token_ids"
            and not self.passthrough
            and not any(f.code == "engine_stopped_ids" for f in self.findings)
        ):
            self.findings.append(
                Finding(
                    severity="fatal",
                    code="engine_stopped_ids",
                    message=f"the engine stopped returning token ids (call {self.calls}: {message})",
                )
            )
        if self.consecutive_failures >= self.max_consecutive_failures and self.stop_reason is None:
            self.stop_reason = "engine_failures"
        self.publish({"type": "error", "session": self.id, "call": self.calls, "message": message})
