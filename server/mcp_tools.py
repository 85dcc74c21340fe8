"""MCP tools (fastmcp, Streamable HTTP at /mcp). Thin: each tool calls the rollout service."""

from __future__ import annotations

import inspect
from typing import Annotated

from fastmcp import Context, FastMCP
from pydantic import Field

from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.wire import RolloutRequest, RolloutResult


def _request_params() -> list[inspect.Parameter]:
    """`run_rollout`'s arguments are RolloutRequest's fields, flat, with their types, defaults and docs."""
    params = []
    for name, f in RolloutRequest.model_fields.items():
        ann = Annotated[f.annotation, Field(description=f.description)] if f.description else f.annotation
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=ann))
    return params


def build_mcp(service: RolloutService) -> FastMCP:
    mcp = FastMCP("swe_gym_env")

    async def run_rollout(ctx: Context, **kwargs) -> RolloutResult:
        """Run one coding-agent rollout on a task and return its reward and token-level trace.

        Long-running: boots a sandbox, runs the agent with every model call captured, grades the diff in a fresh
        sandbox. Never raises: failures come back with ok=false, the phase and the error.
        """
        try:
            req = RolloutRequest.model_validate(kwargs)
        except ValueError as e:
            return RolloutResult(
                rollout_id="",
                ok=False,
                error=f"invalid arguments: {e}",
                phase="validate",
                harness=str(kwargs.get("harness")),
                sandbox=str(kwargs.get("sandbox")),
            )
        step = 0

        async def notify(message: str) -> None:
            nonlocal step
            step += 1
            try:
                await ctx.report_progress(step, None, message)
            except Exception:  # a client that went away must not fail the rollout
                pass

        return await service.run(req, notify)

    sig = inspect.signature(run_rollout)
    run_rollout.__signature__ = sig.replace(parameters=[sig.parameters["ctx"], *_request_params()])
    run_rollout.__annotations__ = {
        "ctx": Context,
        "return": RolloutResult,
        **{p.name: p.annotation for p in _request_params()},
    }
    mcp.tool(run_rollout)
    return mcp
