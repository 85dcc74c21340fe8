"""MCP tools (fastmcp, Streamable HTTP at /mcp). Thin: each tool calls the rollout service or the catalog."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Annotated

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from pydantic import Field

from swe_gym_env.server.agents.registry import HARNESSES, harness_info
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.sandbox.registry import BACKENDS
from swe_gym_env.server.security import ACCESS_REFUSED, access_ok, presented_caller, presented_token, start_refusal
from swe_gym_env.tasks.catalog import TaskNotFound, get_task, split_names, task_page
from swe_gym_env.wire import (
    Capabilities,
    RolloutList,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    TaskPage,
    TaskView,
)

RESERVED_TOOL_NAMES = {"reset", "step", "state", "close"}  # OpenEnv's own verbs


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
        sandbox. Progress notifications report each phase and each captured model call. Never raises: failures
        come back with ok=false, the phase and the error. Pass `rollout_id` to make the call idempotent: calling
        again with the same id attaches to the running rollout or returns its result.
        """
        caller = presented_caller()  # before anything else: strangers learn nothing
        refusal = start_refusal(caller.token, headers=caller.headers, scheme=caller.scheme)
        if refusal is not None:
            return RolloutResult(rollout_id="", ok=False, phase="validate", error=refusal, harness="", sandbox="")
        try:
            req = RolloutRequest.model_validate(kwargs)
        except ValueError as e:
            return RolloutResult(
                rollout_id=str(kwargs.get("rollout_id") or ""),
                ok=False,
                phase="validate",
                error=f"invalid arguments: {e}",
                harness=str(kwargs.get("harness")),
                sandbox=str(kwargs.get("sandbox")),
            )
        step = 0

        async def notify(message: str) -> None:
            nonlocal step
            step += 1
            await ctx.report_progress(step, None, message)

        return await service.run(req, notify)

    sig = inspect.signature(run_rollout)
    run_rollout.__signature__ = sig.replace(parameters=[sig.parameters["ctx"], *_request_params()])
    run_rollout.__annotations__ = {
        "ctx": Context,
        "return": RolloutResult,
        **{p.name: p.annotation for p in _request_params()},
    }

    async def list_tasks(
        split: str = "bundled", offset: Annotated[int, Field(ge=0)] = 0, limit: Annotated[int, Field(ge=1, le=500)] = 50
    ) -> TaskPage:
        """List tasks of a split (problem statements and test names; never the gold or test patch)."""
        return task_page(split, offset, limit)

    async def get_task_tool(
        split: str = "bundled", index: Annotated[int | None, Field(ge=0)] = None, instance_id: str | None = None
    ) -> TaskView:
        """One task by index or instance id (never its gold or test patch)."""
        return get_task(split, index, instance_id).view()

    async def get_rollout(rollout_id: str) -> RolloutStatus:
        """A rollout's state and live summary; `result` holds the full result once it is finished."""
        found = service.get(rollout_id)
        if found is None:
            raise TaskNotFound(f"no rollout {rollout_id!r}")
        return found

    async def list_rollouts(limit: Annotated[int, Field(ge=1, le=1000)] = 100) -> RolloutList:
        """Rollouts in flight on this server, then the most recent finished ones."""
        return RolloutList(rollouts=service.list(limit))

    async def cancel_rollout(rollout_id: str) -> bool:
        """Cancel a running rollout; its result comes back with ok=false and stop_reason `cancelled`."""
        if not access_ok(presented_token()):
            raise ToolError(ACCESS_REFUSED)
        return service.cancel(rollout_id)

    async def capabilities() -> Capabilities:
        """What this server offers: harnesses, sandbox backends, engine names, task splits, limits, and the API
        dialects /capture speaks."""
        return Capabilities(
            version=version("swe_gym_env"),
            harnesses=sorted(HARNESSES),
            sandboxes=sorted(BACKENDS),
            engines=sorted(service.config.engines),
            splits=split_names(),
            limits={
                **{f"concurrent_{k}": v for k, v in service.config.concurrency.items()},
                "max_queue": service.config.max_queue,
            },
            dialects=list(DIALECTS),
            harness_info=harness_info(),
        )

    for fn, name in [
        (run_rollout, "run_rollout"),
        (list_tasks, "list_tasks"),
        (get_task_tool, "get_task"),
        (get_rollout, "get_rollout"),
        (list_rollouts, "list_rollouts"),
        (cancel_rollout, "cancel_rollout"),
        (capabilities, "capabilities"),
    ]:
        if name in RESERVED_TOOL_NAMES:
            raise ValueError(f"tool name {name!r} is reserved by OpenEnv")
        mcp.tool(fn, name=name)
    return mcp
