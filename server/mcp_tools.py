"""MCP tools (fastmcp, Streamable HTTP at /mcp). Thin: each tool calls the rollout service or the catalog.

Results at any size (issue 34): over MCP `tools/call`, `run_rollout` and `get_rollout` answer in the `summary` form
by default (`wire.ResultSummary`: what a caller decides on, counts, and resource links), bounded whatever the
rollout's length; the whole result is read with `resources/read` of `swe-gym://rollouts/{id}/result` and its pages
(`server.results.pages`), or over HTTP (`GET /rollouts/{id}/result`). A `compact` or `full` result asked for over MCP
that would not fit comes back as the summary with a note saying so, never as a failed call. OpenEnv's websocket and
JSON-RPC bridge call these tools in process with the `compact` default (`result_form_default`), unchanged.

Reading rollouts (listing, results, resources) needs what starting one needs (`security.read_refusal`), unless the
server opted into public reads (`SWE_GYM_PUBLIC_READS=1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from importlib.metadata import version
from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ResourceError, ToolError
from fastmcp.resources.base import ResourceContent, ResourceResult
from fastmcp.tools.base import ToolResult
from mcp.types import ResourceLink, TextContent
from pydantic import Field, TypeAdapter

from swe_gym_env.server.agents.registry import HARNESSES, harness_info
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.grading.variants import task_page as impossible_page
from swe_gym_env.server.results.pages import (
    PAGE_URI,
    RESULT_URI,
    SUMMARY_BYTES,
    page_uri,
    summarize,
)
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.sandbox.registry import BACKENDS
from swe_gym_env.server.security import (
    ACCESS_REFUSED,
    access_ok,
    lock_reason,
    log_refusal,
    presented_caller,
    presented_token,
    read_refusal,
    start_refusal,
)
from swe_gym_env.tasks.catalog import TaskNotFound, get_task, split_names, tasks_in
from swe_gym_env.trace.forms import expand
from swe_gym_env.wire import (
    Capabilities,
    ResultSummary,
    RolloutList,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    RolloutSummary,
    TaskPage,
    TaskView,
)

Form = Literal["summary", "compact", "full"]


def _variant(kwargs: dict) -> Literal["original", "impossible"]:
    """The variant a refused or invalid request asked for (echoed on its result)."""
    return "impossible" if kwargs.get("variant") == "impossible" else "original"


_DEFAULT_FORM: ContextVar[str] = ContextVar("swe_gym_result_form", default="summary")
LINK_PAGES = 64  # resource_link blocks for pages in a tool result (every page is in page_uris too)
ENVELOPE = 16 * 1024  # room for the JSON-RPC envelope, links and the like in a bounded tool result


@contextlib.contextmanager
def result_form_default(form: str) -> Iterator[None]:
    """The result form of tools called in this context when the caller names none (OpenEnv's paths: compact)."""
    token = _DEFAULT_FORM.set(form)
    try:
        yield
    finally:
        _DEFAULT_FORM.reset(token)


def _bounded() -> bool:
    """Whether this call's answer must stay within SUMMARY_BYTES: MCP tools/call (the summary default)."""
    return _DEFAULT_FORM.get() == "summary"


def _run_output_schema() -> dict:
    schema = TypeAdapter(ResultSummary | RolloutResult).json_schema(mode="serialization")
    return {"type": "object", **schema}


RESERVED_TOOL_NAMES = {"reset", "step", "state", "close"}  # OpenEnv's own verbs


def _request_params() -> list[inspect.Parameter]:
    """`run_rollout`'s arguments are RolloutRequest's fields, flat, with their types, defaults and docs."""
    params = []
    for name, f in RolloutRequest.model_fields.items():
        ann = Annotated[f.annotation, Field(description=f.description)] if f.description else f.annotation
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=ann))
    return params


def _links(summary: ResultSummary) -> list[ResourceLink]:
    if not summary.result_uri:
        return []
    name = summary.rollout_id
    links = [
        ResourceLink(
            type="resource_link",
            uri=summary.result_uri,
            name=f"rollout {name} result",
            description=f"the whole result: page 0 of {summary.pages} (its _meta names the rest and the sha256)",
            mime_type="application/json",
            size=summary.result_bytes,
        )
    ]
    for k, uri in enumerate(summary.page_uris[:LINK_PAGES]):
        links.append(
            ResourceLink(
                type="resource_link",
                uri=uri,
                name=f"rollout {name} result page {k}",
                mime_type="application/json",
            )
        )
    return links


def summary_tool_result(summary: ResultSummary) -> ToolResult:
    """The summary as a tool result: structured content, the same JSON as text (as MCP asks of tools with an output
    schema), and resource links to the whole result and its pages."""
    data = summary.model_dump_json()
    return ToolResult(
        content=[TextContent(type="text", text=data), *_links(summary)], structured_content=json.loads(data)
    )


def too_big(form: str, size: int) -> str:
    return (
        f"the {form} result is {size:,} bytes, more than a tool result carries here ({SUMMARY_BYTES:,} bytes: "
        "its JSON travels twice, and MCP clients limit a message's size, e.g. the Python SDK's 1 MiB SSE event); "
        "this is its summary: read the whole result from result_uri and page_uris (resources/read) or GET "
        "http_path"
    )


def asked_form(kwargs: dict) -> str:
    """The form a refused or invalid request asked for, where it names one (its answer is small: `answer` still
    bounds it), else this path's default."""
    form = kwargs.get("result_form")
    return form if form in ("summary", "compact", "full") else _DEFAULT_FORM.get()


def refused_read(surface: str) -> str | None:
    """Why the caller may not read rollouts (logged in one line), or None."""
    if (why := read_refusal(presented_token())) is not None:
        log_refusal(surface, why)
    return why


def refused_result(
    kwargs: dict, error: str, rollout_id: str = "", harness: str = "", sandbox: str = ""
) -> RolloutResult:
    return RolloutResult(
        rollout_id=rollout_id,
        ok=False,
        phase="validate",
        error=error,
        harness=harness,
        sandbox=sandbox,
        variant=_variant(kwargs),
    )


class Tools:
    """The MCP tools over one rollout service, one method each (`build_mcp` registers them)."""

    def __init__(self, service: RolloutService) -> None:
        self.service = service

    async def summary_of(self, result: RolloutResult, note: str | None = None) -> ResultSummary:
        rollout_id = result.rollout_id
        manifest = await asyncio.to_thread(self.service.manifest, rollout_id) if rollout_id else None
        return summarize(result, manifest, note)

    async def answer(self, result: RolloutResult, form: str) -> ToolResult:
        """A finished result in the form asked for (summary when a compact/full one would not fit over MCP)."""
        if form == "summary":
            return summary_tool_result(await self.summary_of(result))
        data = result.model_dump_json()
        if _bounded() and 2 * len(data) + ENVELOPE > SUMMARY_BYTES:
            size = len(data)
            del data
            return summary_tool_result(await self.summary_of(result, too_big(form, size)))
        return ToolResult(content=[TextContent(type="text", text=data)], structured_content=json.loads(data))

    async def run_rollout(self, ctx: Context, kwargs: dict) -> ToolResult:
        caller = presented_caller()  # before anything else: strangers learn nothing
        refusal = start_refusal(caller.token, headers=caller.headers, scheme=caller.scheme)
        if refusal is not None:
            log_refusal("run_rollout", refusal)
            return await self.answer(refused_result(kwargs, refusal), asked_form(kwargs))
        try:
            req = RolloutRequest.model_validate(kwargs)
        except ValueError as e:
            rollout_id, harness, sandbox = (
                str(kwargs.get("rollout_id") or ""),
                *(str(kwargs.get(k)) for k in ("harness", "sandbox")),
            )
            invalid = refused_result(kwargs, f"invalid arguments: {e}", rollout_id, harness, sandbox)
            return await self.answer(invalid, asked_form(kwargs))
        form = req.result_form or _DEFAULT_FORM.get()
        step = 0

        async def notify(message: str) -> None:
            nonlocal step
            step += 1
            await ctx.report_progress(step, None, message)

        return await self.answer(await self.service.run(req, notify), form)

    async def list_tasks(
        self,
        split: str = "bundled",
        offset: Annotated[int, Field(ge=0)] = 0,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
        variant: Literal["original", "impossible"] = "original",
    ) -> TaskPage:
        """List tasks of a split (problem statements and test names; never the gold or test patch).

        variant="impossible": the split's tasks with an impossible variant for run_rollout(variant="impossible"):
        each task's `impossible` says `kept: N gold-killed mutant test(s)`, or `not built yet: …` where its
        canaries are not built on this server yet (validate the split, or run one rollout: run_rollout builds them
        first, and ends ok=false naming why where the task has none). Tasks known to have none are left out.
        """
        if variant == "impossible":
            return await asyncio.to_thread(impossible_page, split, offset, limit)
        tasks = tasks_in(split)
        views = [t.view() for t in tasks[offset : offset + limit]]
        return TaskPage(split=split, total=len(tasks), offset=offset, tasks=views)

    async def get_task(
        self, split: str = "bundled", index: Annotated[int | None, Field(ge=0)] = None, instance_id: str | None = None
    ) -> TaskView:
        """One task by index or instance id (never its gold or test patch)."""
        return get_task(split, index, instance_id).view()

    async def get_rollout(
        self,
        rollout_id: str,
        result_form: Annotated[
            Form | None,
            Field(description="summary (default over MCP: bounded, with resource links), compact or full."),
        ] = None,
    ) -> RolloutStatus:
        """A rollout's state and live summary; once it is finished, its result: `result_summary` in the summary
        form (the default over MCP, with resource links to the whole result), `result` in the compact or full
        form (over MCP only when it fits; else the summary with a note)."""
        if (why := refused_read("get_rollout")) is not None:
            raise ToolError(why, log_level=logging.DEBUG)  # one line above, no traceback
        form = result_form or _DEFAULT_FORM.get()
        service = self.service
        if form == "summary" and (stored := await asyncio.to_thread(service.result_summary, rollout_id)) is not None:
            listed = RolloutSummary.model_validate(stored.model_dump(include=set(RolloutSummary.model_fields)))
            return RolloutStatus(rollout_id=rollout_id, state="finished", summary=listed, result_summary=stored)
        found = await asyncio.to_thread(service.get, rollout_id)
        if found is None:
            raise TaskNotFound(f"no rollout {rollout_id!r}")
        if found.result is None:
            return found
        return await self._finished(found, form)

    async def _finished(self, found: RolloutStatus, form: str) -> RolloutStatus:
        """A finished rollout's status with its result in ``form`` where it fits, else its summary with a note."""
        result = found.result
        assert result is not None
        note = None
        if form == "full" and any(t.prompt_token_ids is None for t in result.turns):
            result = expand(result)
        if form != "summary":
            size = len(result.model_dump_json()) if _bounded() else 0
            if 2 * size + ENVELOPE <= SUMMARY_BYTES:
                return found.model_copy(update={"result": result})
            note = too_big(form, size)
        del result
        summary = await self.summary_of(found.result, note)  # type: ignore[arg-type]
        return found.model_copy(update={"result": None, "result_summary": summary})

    async def list_rollouts(self, limit: Annotated[int, Field(ge=1, le=1000)] = 100) -> RolloutList:
        """Rollouts in flight on this server, then the most recent finished ones."""
        if (why := refused_read("list_rollouts")) is not None:
            raise ToolError(why, log_level=logging.DEBUG)
        return RolloutList(rollouts=self.service.list(limit))

    async def cancel_rollout(self, rollout_id: str) -> bool:
        """Cancel a running rollout; its result comes back with ok=false and stop_reason `cancelled`."""
        why = lock_reason() or (None if access_ok(presented_token()) else ACCESS_REFUSED)
        if why is not None:  # a locked server says so, as run_rollout does
            log_refusal("cancel_rollout", why)
            raise ToolError(why, log_level=logging.DEBUG)
        return self.service.cancel(rollout_id)

    async def capabilities(self) -> Capabilities:
        """What this server offers: harnesses, sandbox backends, engine names, task splits, limits, and the API
        dialects /capture speaks."""
        config = self.service.config
        return Capabilities(
            version=version("swe_gym_env"),
            harnesses=sorted(HARNESSES),
            sandboxes=sorted(BACKENDS),
            engines=sorted(config.engines),
            splits=split_names(),
            limits={**{f"concurrent_{k}": v for k, v in config.concurrency.items()}, "max_queue": config.max_queue},
            dialects=list(DIALECTS),
            harness_info=harness_info(),
        )

    async def read_page(self, rollout_id: str, page: int) -> ResourceResult:
        """One page of a finished rollout's stored result, with its _meta and the next page's URI."""
        if (why := refused_read("resources/read")) is not None:
            raise ResourceError(why, log_level=logging.DEBUG)  # one line above, not fastmcp's traceback
        service = self.service
        path = service.store.path_of(rollout_id) if service.store is not None else None
        if path is None:
            rec = service.record(rollout_id)
            if rec is not None and rec.result is None:
                raise ResourceError(f"rollout {rollout_id!r} is {rec.state}: its result is not there yet")
            raise ResourceError(f"no stored result for rollout {rollout_id!r}")
        try:
            text, m = await asyncio.to_thread(service.pages.read_page, path, rollout_id, page)
        except IndexError as e:
            raise ResourceError(f"rollout {rollout_id!r}: no {e}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ResourceError(f"rollout {rollout_id!r}: result unreadable: {type(e).__name__}: {e}") from None
        meta = m.meta(page)
        meta["next"] = page_uri(rollout_id, page + 1) if page + 1 < m.pages else None
        return ResourceResult(contents=[ResourceContent(text, mime_type="application/json", meta=meta)])


def _run_rollout_tool(tools: Tools):
    """`run_rollout` as fastmcp registers it: RolloutRequest's fields as its flat, typed, documented arguments."""

    async def run_rollout(ctx: Context, **kwargs) -> ToolResult:
        """Run one coding-agent rollout on a task and return its reward and token-level trace.

        Long-running: boots a sandbox, runs the agent with every model call captured, grades the diff in a fresh
        sandbox. Progress notifications report each phase and each captured model call. Never raises: failures
        come back with ok=false, the phase and the error. Pass `rollout_id` to make the call idempotent: calling
        again with the same id attaches to the running rollout or returns its result.

        Over MCP the answer is the result's summary (`result_form` summary, the default: ok, reward, grading,
        findings, counts) with resource links to the whole result: read `result_uri` (page 0, its _meta naming the
        pages and the sha256 of the whole) and each of `page_uris` with resources/read, or GET `http_path`.
        """
        return await tools.run_rollout(ctx, kwargs)

    sig = inspect.signature(run_rollout)
    run_rollout.__signature__ = sig.replace(parameters=[sig.parameters["ctx"], *_request_params()])
    run_rollout.__annotations__ = {
        "ctx": Context,
        "return": ToolResult,
        **{p.name: p.annotation for p in _request_params()},
    }
    return run_rollout


def _register_resources(mcp: FastMCP, tools: Tools) -> None:
    @mcp.resource(RESULT_URI, name="rollout_result", mime_type="application/json")
    async def rollout_result(rollout_id: str) -> ResourceResult:
        """A finished rollout's whole result (its stored JSON): page 0, its _meta naming every page (`page_uris`),
        the byte range, and the size and SHA-256 of the whole. The pages' texts joined are the result."""
        return await tools.read_page(rollout_id, 0)

    @mcp.resource(PAGE_URI, name="rollout_result_page", mime_type="application/json")
    async def rollout_result_page(rollout_id: str, page: str) -> ResourceResult:
        """One page of a finished rollout's stored JSON (at most 512 KiB as it travels), with the same _meta."""
        if not page.isdigit() or len(page) > 9:
            raise ResourceError(f"not a page number: {page[:20]!r}")
        return await tools.read_page(rollout_id, int(page))


def build_mcp(service: RolloutService) -> FastMCP:
    mcp = FastMCP("swe_gym_env")
    tools = Tools(service)
    for name in ("list_tasks", "get_task", "get_rollout", "list_rollouts", "cancel_rollout", "capabilities"):
        if name in RESERVED_TOOL_NAMES:
            raise ValueError(f"tool name {name!r} is reserved by OpenEnv")
        mcp.tool(getattr(tools, name), name=name)
    mcp.tool(_run_rollout_tool(tools), name="run_rollout", output_schema=_run_output_schema())
    _register_resources(mcp, tools)
    return mcp
