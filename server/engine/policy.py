"""Policies of the built-in engine. None of them is a model: they produce scripted replies.

- `oracle`: finds the task whose problem statement is in the prompt and applies its gold patch through the
  agent's own tools (edit if it has one, else bash + git apply), then says it is done.
- `noop`: answers "done" at once.
- `script:FILE`: replays a JSON list of replies, one per model call (`{"content": ...}` or
  `{"tool_calls": [{"name": ..., "arguments": {...}}]}`), then answers "done".
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swe_gym_env.tasks.catalog import find_by_problem_statement
from swe_gym_env.tasks.models import Task

DONE = "I have made the change. Done."


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _step(messages: list[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def _tool_params(tools: list[dict] | None) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for t in tools or []:
        fn = t.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if fn.get("name"):
            out[fn["name"]] = set(props)
    return out


class Policy:
    name = "base"

    def reply(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        raise NotImplementedError


class NoopPolicy(Policy):
    name = "noop"

    def reply(self, messages, tools):
        return Reply(content="done")


class ScriptPolicy(Policy):
    def __init__(self, path: Path) -> None:
        self.name = f"script:{path}"
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ValueError(f"{path}: a script is a JSON list of replies")
        self.replies = [
            Reply(
                content=r.get("content"),
                tool_calls=[(c["name"], c.get("arguments", {})) for c in r.get("tool_calls", [])],
            )
            for r in data
        ]

    def reply(self, messages, tools):
        step = _step(messages)
        return self.replies[step] if step < len(self.replies) else Reply(content=DONE)


def _hunks(patch: str) -> list[tuple[str, str, str]]:
    """(path, old_text, new_text) per hunk of a unified diff."""
    out: list[tuple[str, str, str]] = []
    path = None
    old: list[str] | None = None
    new: list[str] = []

    def flush() -> None:
        if path and old is not None and (old or new):
            out.append((path, "\n".join(old), "\n".join(new)))

    for line in patch.splitlines():
        if line.startswith("+++ "):
            flush()
            old = None
            path = line[4:].removeprefix("b/")
        elif line.startswith("--- ") or line.startswith("diff --git") or line.startswith("index "):
            continue
        elif line.startswith("@@"):
            flush()
            old, new = [], []
        elif old is not None:
            if line.startswith(" "):
                old.append(line[1:])
                new.append(line[1:])
            elif line.startswith("-"):
                old.append(line[1:])
            elif line.startswith("+"):
                new.append(line[1:])
            elif line == "":
                old.append("")
                new.append("")
    flush()
    return out


class OraclePolicy(Policy):
    name = "oracle"

    def plan(self, task: Task, tools: list[dict] | None, workdir: str | None = None) -> list[Reply]:
        """The gold patch through the agent's own tools, in the work tree its prompt names (else the task's)."""
        workdir = workdir or task.workdir
        params = _tool_params(tools)
        edit = params.get("edit", set())
        hunks = _hunks(task.patch)
        actions: list[Reply] = []
        if "edits" in edit and "path" in edit:  # Pi: edit{path, edits:[{oldText,newText}]}
            by_file: dict[str, list[dict]] = {}
            for path, old, new in hunks:
                by_file.setdefault(path, []).append({"oldText": old, "newText": new})
            actions = [Reply(tool_calls=[("edit", {"path": p, "edits": e})]) for p, e in by_file.items()]
        elif {"filePath", "oldString", "newString"} <= edit:  # OpenCode
            actions = [
                Reply(tool_calls=[("edit", {"filePath": f"{workdir}/{p}", "oldString": o, "newString": n})])
                for p, o, n in hunks
            ]
        elif "bash" in params:
            delim = "SWE_GYM_PATCH_EOF"
            while delim in task.patch:
                delim += "_"
            cmd = f"cd {shlex.quote(workdir)} && git apply <<'{delim}'\n{task.patch.rstrip(chr(10))}\n{delim}"
            actions = [Reply(tool_calls=[("bash", {"command": cmd})])]
        return [*actions, Reply(content=DONE)]

    def reply(self, messages, tools):
        prompt_text = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
        task = find_by_problem_statement(prompt_text)
        if task is None:
            return Reply(content="oracle: no known task's problem statement is in this prompt; nothing to do.")
        where = WORKDIR_IN_PROMPT.search(prompt_text)  # as an agent would: the work tree its prompt names
        plan = self.plan(task, tools, where.group(1) if where else None)
        step = _step(messages)
        return plan[step] if step < len(plan) else Reply(content=DONE)


WORKDIR_IN_PROMPT = re.compile(r"working in a git repository at (/\S+?)\.\s")


def make_policy(spec: str) -> Policy:
    if spec == "oracle":
        return OraclePolicy()
    if spec == "noop":
        return NoopPolicy()
    if spec.startswith("script:"):
        return ScriptPolicy(Path(spec.removeprefix("script:")))
    raise ValueError(f"unknown policy {spec!r}: use oracle, noop or script:FILE")
