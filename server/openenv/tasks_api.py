"""OpenEnv's Task API: `GET /list_environments`, `GET /{env}/splits`, `POST /{env}/tasks|num_tasks|task|task_range`
(unknown env 404, bad index 400, unknown split 400; every method exists, so OpenEnv's 501 never occurs), backed by
the task catalog; task payloads are `TaskView`s, never patches."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from swe_gym_env.server.grading import variants
from swe_gym_env.server.openenv.models import ENV_NAME
from swe_gym_env.tasks.catalog import TaskNotFound, extra_sources, split_names, tasks_in
from swe_gym_env.wire import TaskView


class ListTasksRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    split: str = Field(description="Task split name")
    variant: Literal["original", "impossible"] = Field(
        default="original",
        description="impossible: only the tasks with an impossible variant (run_rollout variant='impossible'), each "
        "with its `impossible` status (`kept: …`, or `not built yet: …`: its canaries are built by validate or a "
        "first rollout); tasks known to have none are left out",
    )


class NumTasksRequest(ListTasksRequest):
    pass


class GetTaskRequest(ListTasksRequest):
    index: int = Field(description="Task index within the split")


class GetTaskRangeRequest(ListTasksRequest):
    start: int | None = Field(default=None, description="Inclusive start index")
    stop: int | None = Field(default=None, description="Exclusive stop index")


def _check_env(env_name: str) -> None:
    if env_name.lower() != ENV_NAME:
        raise HTTPException(status_code=404, detail=f"unknown environment {env_name!r}")


def _listed(split: str, variant: str) -> tuple:
    tasks = tasks_in(split)
    if variant != "impossible":
        return tasks
    return tuple(t.view().model_copy(update={"impossible": why}) for t, why in variants.listing(tasks))


async def _split_tasks(split: str, variant: str = "original") -> tuple:
    """The split's tasks (Task, or TaskView for the impossible variant's listing)."""
    try:
        return await asyncio.to_thread(_listed, split, variant)
    except TaskNotFound as e:
        raise HTTPException(status_code=400, detail=str(e)) from e


def _view(t) -> dict:
    return (t if isinstance(t, TaskView) else t.view()).model_dump(mode="json")


def _views(tasks) -> list[dict]:
    return [_view(t) for t in tasks]


def install_task_api(app: FastAPI) -> None:
    """Add the Task API routes to ``app``."""

    @app.get("/list_environments", tags=["Task API"])
    async def list_environments() -> list[str]:
        return [ENV_NAME]

    @app.get("/{env_name}/splits", tags=["Task API"])
    async def list_splits(env_name: str) -> list[dict[str, Any]]:
        _check_env(env_name)
        sources = extra_sources()
        out = []
        for name in split_names():
            kind = sources[name][1] if name in sources else name
            out.append({"name": name, "type": kind if kind in ("train", "validation", "test") else "validation"})
        return out

    @app.post("/{env_name}/tasks", tags=["Task API"])
    async def list_tasks(env_name: str, request: ListTasksRequest) -> dict[str, Any]:
        _check_env(env_name)
        return {"tasks": _views(await _split_tasks(request.split, request.variant)), "env_name": ENV_NAME}

    @app.post("/{env_name}/num_tasks", tags=["Task API"])
    async def num_tasks(env_name: str, request: NumTasksRequest) -> dict[str, Any]:
        _check_env(env_name)
        return {"num_tasks": len(await _split_tasks(request.split, request.variant))}

    @app.post("/{env_name}/task", tags=["Task API"])
    async def get_task(env_name: str, request: GetTaskRequest) -> dict[str, Any]:
        _check_env(env_name)
        tasks = await _split_tasks(request.split, request.variant)
        if not 0 <= request.index < len(tasks):
            raise HTTPException(status_code=400, detail="Invalid task index")
        return {"task": _view(tasks[request.index])}

    @app.post("/{env_name}/task_range", tags=["Task API"])
    async def get_task_range(env_name: str, request: GetTaskRangeRequest) -> dict[str, Any]:
        _check_env(env_name)
        tasks = await _split_tasks(request.split, request.variant)
        return {"tasks": _views(tasks[request.start : request.stop])}
