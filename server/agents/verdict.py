"""Whether an agent run failed, and how: read from its own events and the proxy's view, never the exit code alone.

Pi exits 0 on a dead endpoint; OpenCode exits 1 after a minute of retries. Kinds:
`endpoint_unreachable` (the model could not be reached: by the agent, or by the proxy on its behalf),
`no_model_calls` (the agent ended without ever calling the model), `agent_crashed` (it died or its calls failed),
`timeout` (killed at its deadline). An agent stopped by the model-call budget has not failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from swe_gym_env.server.agents.base import AgentOutcome

UNREACHABLE_HINTS = ("unreachable", "timed out", "http 502", "http 503", "http 504", "connect")


@dataclass(frozen=True)
class RunFacts:
    """What the pipeline knows about one agent run, apart from the agent's own events."""

    exit_code: int
    timed_out: bool
    timeout_s: float
    calls: int  # model calls the proxy answered from the engine (budget replies excluded)
    proxy_errors: tuple[str, ...] = ()  # calls the proxy could not answer
    budget_exhausted: bool = False
    stopped_after_budget: bool = False  # we ended an agent that kept calling after its budget ran out
    stderr_tail: str = ""


def classify_failure(outcome: AgentOutcome, facts: RunFacts) -> tuple[str, str] | None:
    """(kind, message) for a failed run; None when the run is usable (it may still have been budget-stopped)."""
    if facts.timed_out and not facts.stopped_after_budget:
        return "timeout", f"the agent was still running at its {facts.timeout_s:.0f}s deadline"
    no_calls = facts.calls == 0
    if no_calls:
        unreachable = [e for e in facts.proxy_errors if any(h in e.lower() for h in UNREACHABLE_HINTS)]
        if unreachable:
            return "endpoint_unreachable", f"the proxy could not reach the engine: {unreachable[-1][:400]}"
        if outcome.error_kind == "endpoint_unreachable":
            return "endpoint_unreachable", f"the agent could not reach the model endpoint: {outcome.error}"
    elif facts.budget_exhausted:
        return None
    # the same order with calls or without: the proxy's failures, the agent's own error, its exit code
    if facts.proxy_errors:
        if no_calls:
            return "agent_crashed", f"every model call failed at the proxy: {facts.proxy_errors[-1][:400]}"
        return "agent_crashed", f"{len(facts.proxy_errors)} model call(s) failed at the proxy: {facts.proxy_errors[0]}"
    if outcome.error_kind:
        return outcome.error_kind, outcome.error or "the agent reported an error"
    if facts.exit_code != 0:
        if no_calls:
            return "agent_crashed", f"exit code {facts.exit_code} before any model call: {facts.stderr_tail[-400:]}"
        return "agent_crashed", f"exit code {facts.exit_code}: {facts.stderr_tail[-500:]}"
    return ("no_model_calls", "the agent ended without calling the model") if no_calls else None
