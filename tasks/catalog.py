"""Task catalog: the bundled demo tasks (loaders for SWE-Gym / SWE-bench rows come later)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from swe_gym_env.tasks.models import Task

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


class TaskNotFound(LookupError):
    pass


@lru_cache(maxsize=1)
def bundled_tasks() -> tuple[Task, ...]:
    tasks = []
    for n, line in enumerate((BUNDLED_DIR / "tasks.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("repo_source"):
            row["repo_source"] = str(BUNDLED_DIR / row["repo_source"])
        try:
            tasks.append(Task.model_validate(row))
        except ValueError as e:  # a bundled row must be valid: say which one is not
            raise ValueError(f"bundled tasks.jsonl line {n}: {e}") from e
    return tuple(tasks)


def splits() -> dict[str, tuple[Task, ...]]:
    return {"bundled": bundled_tasks()}


def get_task(split: str = "bundled", index: int | None = None, instance_id: str | None = None) -> Task:
    tasks = splits().get(split)
    if tasks is None:
        raise TaskNotFound(f"unknown split {split!r}; known: {sorted(splits())}")
    if instance_id is not None:
        for t in tasks:
            if t.instance_id == instance_id:
                return t
        raise TaskNotFound(f"no task {instance_id!r} in split {split!r}")
    i = index or 0
    if not 0 <= i < len(tasks):
        raise TaskNotFound(f"index {i} out of range for split {split!r} ({len(tasks)} tasks)")
    return tasks[i]


def find_by_problem_statement(text: str) -> Task | None:
    """The task whose problem statement appears in ``text`` (used by the built-in engine's oracle policy)."""
    for tasks in splits().values():
        for t in tasks:
            if t.problem_statement.strip() and t.problem_statement.strip() in text:
                return t
    return None
