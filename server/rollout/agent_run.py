"""The agent phase: run the harness in the background and watch it, then hold its own record against the capture.

Watching: the first model call's time, steps from the agent's events file, an agent that keeps calling after its
budget ran out is stopped, and an engine that failed too many calls in a row stops the agent at once. Afterwards:
the cross-check (call by call; captured calls the agent never used are demoted), engine failures the agent did not
recover from, and whether the agent ever saw the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time

from swe_gym_env.server.agents.base import AgentConfig, AgentOutcome, Harness, reconcile
from swe_gym_env.server.capture import CaptureSession, request_text
from swe_gym_env.server.rollout.record import RolloutRecord, RunState
from swe_gym_env.server.rollout.workspace import read_text
from swe_gym_env.server.sandbox.base import ExecResult, Sandbox
from swe_gym_env.trace.forms import TurnsView
from swe_gym_env.wire import Finding, RolloutRequest

POLL_S = 0.1  # how often the agent phase looks at the session (the events file: every POLL_EVENTS_S)
POLL_EVENTS_S = 1.0
BUDGET_GRACE_S = 15.0  # an agent still calling this long after its budget ran out is stopped
# pty pairs the agent command of a harness that `needs_pty` is handed where the sandbox cannot make its own
# (`gives_ptys`: landlock): one terminal per conversation, another each time the agent resets it
PTYS = 4


async def _stop(run: asyncio.Task, why: str) -> tuple[ExecResult, bool]:
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    return ExecResult(137, "", why), True


def in_task_env(command: str, activation: str | None) -> str:
    """``command`` run inside the task's activated environment (its conda env or venv), so that the agent's own
    tool commands inherit it: the environment the tests run in. bash: activation scripts `source`."""
    return command if not activation else f"bash -c {shlex.quote(activation + chr(10) + command)}"


async def run_agent(
    rec: RolloutRecord,
    sbx: Sandbox,
    harness: Harness,
    cfg: AgentConfig,
    session: CaptureSession,
    timeout: float,
    timings: dict[str, float],
    activation: str | None = None,
) -> tuple[ExecResult, bool]:
    """Run the agent (inside the task's environment) and watch it. Returns (result, stopped by us)."""
    t0 = time.monotonic()
    command = in_task_env(harness.command(cfg), activation)
    ptys = PTYS if harness.needs_pty else 0
    run = asyncio.create_task(sbx.exec(command, timeout=timeout, relay=True, ptys=ptys))
    steps, next_read, budget_at = 0, t0 + POLL_EVENTS_S, None
    try:
        while not run.done():
            await asyncio.wait({run}, timeout=POLL_S)
            now = time.monotonic()
            if session.calls and "first_call" not in timings:
                timings["first_call"] = now - t0
            if now >= next_read and not run.done():
                next_read = now + POLL_EVENTS_S
                n = harness.parse_events(await read_text(sbx, harness.events_path)).model_calls
                if n > steps:
                    steps = n
                    rec.emit(f"agent: {n} step(s) in its own events")
            if run.done():
                break
            if session.stop_reason == "engine_failures":  # the engine is gone: stop now, not at the deadline
                rec.emit(f"agent: {session.consecutive_failures} model calls in a row failed; stopping it")
                return await _stop(run, "stopped after repeated engine failures")
            if session.stop_reason == "budget_exhausted":
                budget_at = budget_at or now
                if now - budget_at > BUDGET_GRACE_S:
                    rec.emit("agent: still running after its model-call budget ran out; stopping it")
                    return await _stop(run, "stopped after the model-call budget ran out")
        return run.result(), False
    finally:
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run


def answered(req: RolloutRequest, session: CaptureSession) -> int:
    """Model calls the engine answered (failed ones excluded; budget replies are not calls)."""
    if req.mode == "black_box":
        return max(0, session.calls - len({e.split(":", 1)[0] for e in session.errors}))
    return len(session.turns)


def cross_check(req: RolloutRequest, outcome: AgentOutcome, session: CaptureSession, state: RunState) -> None:
    """The agent's own events against the capture: a verdict in every result; captured calls the agent never used
    are demoted (the graph discards them), agent calls the capture lacks make the rollout unusable."""
    if req.mode == "black_box":  # nothing recorded: compare call counts only
        agent_calls = outcome.model_calls - session.budget_replies
        if outcome.model_calls == 0 and outcome.error_kind is None:
            state.cross_check = ("none", "the agent left no trace of model calls")
        elif agent_calls == answered(req, session):
            state.cross_check = ("match", f"{agent_calls} calls (black box: counts only)")
        else:
            state.cross_check = (
                "mismatch",
                f"the agent reports {outcome.model_calls} model calls ({session.budget_replies} budget "
                f"replies), the proxy answered {answered(req, session)}",
            )
        return
    r = reconcile(outcome, session.turns, session.budget_replies)
    state.cross_check = (r.verdict, r.detail)
    state.missing_steps = r.missing
    session.demoted.update(r.unused)  # discarded with what hangs below them when the session closes
    for turn in session.turns:
        if turn.index in r.unused:
            turn.discarded = True
    if r.verdict == "mismatch":
        state.agent_findings = [
            Finding(
                severity="fatal" if r.missing else "warning",
                code="cross_check_mismatch",
                message=f"{r.detail}; demoted turns the agent never used: {list(r.unused)}",
            )
        ]


def engine_failure(session: CaptureSession) -> str | None:
    """Why the rollout fails for its engine: too many failed calls in a row, or failed calls the agent did not
    recover from (none succeeded after them); `endpoint_unreachable` when the engine could not be reached at all.
    None when every failure was followed by a success."""
    if session.stop_reason != "engine_failures" and not session.consecutive_failures:
        return None
    last = session.failures[-1][1] if session.failures else "unknown error"
    if session.stop_reason == "engine_failures":
        what = f"{session.consecutive_failures} model calls in a row failed (the limit), so the rollout stopped"
    else:
        what = f"the agent did not recover from {session.consecutive_failures} failed model call(s) at the end"
    kind = "endpoint_unreachable" if last.startswith("engine unreachable") else "engine_failures"
    return f"{kind}: {what}; {session.failed} failed in all; last: {last}"


CONTEXT_LIMIT = re.compile(r"maximum context length is \d+ tokens")  # vLLM's refusal (and the built-in engine's)


def unrecovered_errors(session: CaptureSession, state: RunState) -> tuple[str, ...]:
    """The proxy's failed calls that make the run fail: all of them, except the engine's refusals for the context
    length that later calls recovered from (the agent compacted its context and went on: Pi and OpenCode do, at the
    engine's context limit). Those become one warning finding."""
    recovered = bool(session.turns) and not session.consecutive_failures
    refused = [e for e in session.errors if CONTEXT_LIMIT.search(e)] if recovered else []
    if refused:
        state.agent_findings.append(
            Finding(
                severity="warning",
                code="context_limit",
                message=f"the engine refused {len(refused)} call(s) for the context length and the agent went on "
                f"(it compacted): {refused[0][:300]}",
            )
        )
    return tuple(e for e in session.errors if e not in refused)


def saw_task(session: CaptureSession, problem: str) -> bool:
    """Whether some agent-role call's request carried the problem statement, whitespace aside (agents reflow it:
    Qwen Code's @-reference parser puts a space before an `@token` it cannot resolve)."""
    needle = "".join(problem.split())
    if not needle:
        return True
    view = TurnsView(session.turns)
    return any(needle in "".join(request_text(view.request(t.index)).split()) for t in view.turns if t.role == "agent")
