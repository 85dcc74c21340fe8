"""A rollout as the server tracks it (record), and the typed state a run builds up on its way."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from swe_gym_env.server.capture import CaptureSession
from swe_gym_env.server.engine.certify import Certificate
from swe_gym_env.trace.compact import count_roots
from swe_gym_env.trace.forms import expand_turns, summary_of
from swe_gym_env.wire import (
    Finding,
    Phase,
    RolloutRequest,
    RolloutResult,
    RolloutSummary,
    SequenceRef,
)


class RolloutFailure(Exception):
    """Ends a run as a failed result in ``phase`` (never raised into a caller)."""

    def __init__(self, phase: Phase, message: str, stop_reason: str | None = None) -> None:
        super().__init__(message)
        self.phase: Phase = phase
        self.message = message
        self.stop_reason = stop_reason


@dataclass
class RunState:
    """What a run has learned so far: a failure at any point still reports all of it."""

    instance_id: str | None = None
    cert: Certificate | None = None
    session: CaptureSession | None = None
    deadline: float = 0.0  # monotonic
    diff_base: str | None = None
    patch: str | None = None
    exit_code: int | None = None
    log_tail: str = ""
    cross_check: tuple[Literal["match", "mismatch", "none"] | None, str] = (None, "")
    missing_steps: int = 0  # agent steps the capture lacks (a mismatch that makes the rollout unusable)
    mode_findings: list[Finding] = field(default_factory=list)
    agent_findings: list[Finding] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    timeout: asyncio.Timeout | None = None  # the rollout's deadline, as the service enforces it
    # full: turns also carry their whole prompt and request; anything else (summary, None: the path's default) stores
    # the compact form
    result_form: Literal["summary", "compact", "full"] | None = "compact"

    @contextlib.contextmanager
    def deadline_paused(self) -> Iterator[None]:
        """The deadline stops while the block runs and moves later by the time it took (a first-use install is the
        server's setup, not the rollout's time: `deadline_s` is boot to grading)."""
        t = time.monotonic()
        when = self.timeout.when() if self.timeout is not None else None
        if self.timeout is not None and when is not None:
            self.timeout.reschedule(None)
        try:
            yield
        finally:
            spent = time.monotonic() - t
            self.deadline += spent
            if self.timeout is not None and when is not None:
                with contextlib.suppress(RuntimeError):  # already expired or left: nothing to move
                    self.timeout.reschedule(when + spent)

    def trace(self) -> dict:
        """The result fields every result carries, failed or not."""
        s = self.session
        turns = list(s.turns) if s else []
        by_index = {t.index: t for t in turns}
        sequences = [
            SequenceRef(
                turns=q.turns,
                role=q.role,
                discarded=q.discarded,
                length=by_index[q.turns[-1]].prompt_len + len(by_index[q.turns[-1]].completion_token_ids),
            )
            for q in (s.sequences if s else [])
        ]
        return {
            "turns": expand_turns(turns) if self.result_form == "full" else turns,
            "capture_session_id": s.id if s else None,
            "agent_log_tail": self.log_tail,
            "sequences": sequences,
            "cross_check": self.cross_check[0],
            "cross_check_detail": self.cross_check[1],
            "model_patch": self.patch,
            "agent_exit_code": self.exit_code,
        }

    def findings(self) -> list[Finding]:
        return [*self.mode_findings, *(self.session.findings if self.session else []), *self.agent_findings]


@dataclass
class RolloutRecord:
    """A rollout in flight or finished. Progress goes to subscribers (``RolloutService.subscribe``)."""

    rollout_id: str
    request: RolloutRequest
    phase: Phase = "validate"
    state: Literal["queued", "running", "finished"] = "queued"
    result: RolloutResult | None = None
    task: asyncio.Task | None = None
    session: CaptureSession | None = None
    instance_id: str | None = None
    listeners: list[asyncio.Queue[str]] = field(default_factory=list)
    phase_since: float = field(default_factory=time.time)
    on_phase: Callable[[Phase], None] | None = None  # e.g. the results store noting where the rollout is

    def emit(self, message: str) -> None:
        for q in self.listeners:
            q.put_nowait(message)

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.phase_since = time.time()
        if self.on_phase is not None:
            self.on_phase(phase)
        self.emit(f"phase: {phase}")

    def summary(self) -> RolloutSummary:
        if self.result is not None:
            return summary_of(self.result)
        last = self.session.last_call_at if self.session else None
        return RolloutSummary(
            rollout_id=self.rollout_id,
            instance_id=self.instance_id,
            harness=self.request.harness,
            sandbox=self.request.sandbox,
            phase=self.phase,
            state=self.state,
            turns=len(self.session.turns) if self.session else 0,
            roots=count_roots(self.session.turns) if self.session else 0,
            seconds_since_last_call=round(time.time() - last, 3) if last else None,
            seconds_in_phase=round(time.time() - self.phase_since, 3),
            capture_session_id=self.session.id if self.session else None,
            variant=self.request.variant,
        )
